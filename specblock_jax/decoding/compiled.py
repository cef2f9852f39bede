"""Ahead-of-time compiled executables, cached by static settings and argument shapes.

Lets the decoders report compile time apart from run time and lets tests count compilations.

A new executable's first run is slower than its later ones (apparently XLA:CPU finishes preparing
each kernel the first time it runs: a toy loop warmed with one iteration lost the penalty, with
zero iterations it did not; measured +0.1 s for a target-only loop, +0.3-0.5 s for an EAGLE-3 loop at
batch 1-4 on target v2). Run times are what `auto` decides on and what benchmarks compare, so a
caller may pass `warm`: args -> arguments for one short run (e.g. budgets capped at two tokens, so
each kernel of a decode loop runs once), which `compiled` runs right after compiling, on CPU only,
and counts as compile time.

Compiles are paid once per machine: the first `compiled` call turns on JAX's persistent
compilation cache (`use_compile_cache`) in a user cache folder (`$SPECBLOCK_JAX_COMPILE_CACHE`, else
`$XDG_CACHE_HOME/specblock-jax/jax`, else `~/.cache/specblock-jax/jax`; the variable set to "off"
turns it off), unless the caller configured one already. A listener registered with `on_compile`
hears of each compile as it starts (the command-line tools show it on their progress bars).

XLA:CPU maps each executable's code in many small memory sections, and Linux caps a process's maps
(vm.max_map_count, 65,530 by default): a bench of 8 methods once died with "LLVM compilation error:
Cannot allocate memory". So before compiling, `compiled` counts the process's maps and, past
`MAP_SHARE` of the limit, drops the oldest cached executables until under it (they compile again if
used again; compile time is reported apart from run time).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import time
from pathlib import Path
from typing import Callable, Iterator

import jax

_EXECUTABLES: dict = {}
_STATS = {"compilations": 0, "compile_s": 0.0, "evicted": 0}
MAP_SHARE = 0.6  # of vm.max_map_count that live executables may bring the process to
CACHE_ENV = "SPECBLOCK_JAX_COMPILE_CACHE"
_CACHE = {"decided": False, "dir": None}
_LISTENERS: list[Callable[[str], None]] = []


def default_cache_dir() -> Path:
    """$SPECBLOCK_JAX_COMPILE_CACHE, else $XDG_CACHE_HOME/specblock-jax/jax, else ~/.cache/specblock-jax/jax."""
    if os.environ.get(CACHE_ENV, "off") != "off":
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specblock-jax" / "jax"


def use_compile_cache(path: str | os.PathLike | None = None, enabled: bool = True) -> Path | None:
    """Turns on JAX's persistent compilation cache at `path` (default `default_cache_dir()`), so a
    second process (a rerun, a resumed job) loads its executables instead of compiling them; with
    enabled=False, or $SPECBLOCK_JAX_COMPILE_CACHE=off, leaves it off. A folder already set in
    `jax.config` (e.g. by the caller or the tests) is kept. Returns the folder in use, or None."""
    _CACHE["decided"] = True
    current = jax.config.jax_compilation_cache_dir
    if current:
        _CACHE["dir"] = Path(current)
    elif enabled and os.environ.get(CACHE_ENV) != "off":
        folder = Path(path).expanduser() if path is not None else default_cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", str(folder))
        _CACHE["dir"] = folder
    return _CACHE["dir"]


@contextlib.contextmanager
def on_compile(listener: Callable[[str], None]) -> Iterator[None]:
    """Within the block, listener(what) is called as each new executable starts compiling
    (e.g. "eagle3 decode_loop, cache 256"), so a progress bar can say so."""
    _LISTENERS.append(listener)
    try:
        yield
    finally:
        _LISTENERS.remove(listener)


def _describe(fn: Callable, static: tuple) -> str:
    """What is being compiled, for a listener: the function and, for a decode loop, its drafter's kind."""
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", "function"))
    loop = next((s for s in static if hasattr(s, "cache_len") and hasattr(s, "max_new")), None)
    if loop is None:
        return name
    return f"{loop.label} {name}, cache {loop.cache_len}"


def _count_lines(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def maps_in_use() -> int | None:
    """The process's memory maps now (None where /proc is not there)."""
    return _count_lines("/proc/self/maps")


def map_limit() -> int | None:
    """The kernel's per-process cap on memory maps (None where /proc is not there)."""
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return None


def _make_room() -> None:
    """Drops the oldest cached executables while the process uses more than MAP_SHARE of its maps."""
    limit = map_limit()
    if limit is None:
        return
    while _EXECUTABLES and (maps_in_use() or 0) > MAP_SHARE * limit:
        for key in list(_EXECUTABLES)[:max(1, len(_EXECUTABLES) // 4)]:
            del _EXECUTABLES[key]
            _STATS["evicted"] += 1
        gc.collect()


def _signature(args) -> tuple:
    leaves, treedef = jax.tree.flatten(args)
    return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


def compiled(fn: Callable, static: tuple, *args, donate_argnums: tuple[int, ...] = (),
             warm: Callable[[tuple], tuple] | None = None):
    """Returns (executable for fn(*static, *args), seconds spent compiling it now, 0 if cached).
    warm: args -> arguments of one warm-up run of a new executable (fresh copies of donated ones),
    its time counted in the seconds returned (module docstring)."""
    key = (fn, static, _signature(args), donate_argnums)
    if key in _EXECUTABLES:
        return _EXECUTABLES[key], 0.0
    if not _CACHE["decided"]:
        use_compile_cache()
    _make_room()
    for listener in list(_LISTENERS):
        listener(_describe(fn, static))
    start = time.perf_counter()
    jitted = jax.jit(functools.partial(fn, *static), donate_argnums=donate_argnums)
    exe = jitted.lower(*args).compile()
    if warm is not None and jax.default_backend() == "cpu":  # an accelerator's memory holds no spare state copy
        jax.block_until_ready(exe(*warm(args)))
    seconds = time.perf_counter() - start
    _EXECUTABLES[key] = exe
    _STATS["compilations"] += 1
    _STATS["compile_s"] += seconds
    return exe, seconds


def compilation_count() -> int:
    """Executables compiled so far by `compiled` in this process."""
    return _STATS["compilations"]


def evicted_count() -> int:
    """Executables dropped so far to stay under the memory-map limit (module docstring)."""
    return _STATS["evicted"]


def cached_count() -> int:
    """Executables held in the cache now (a mark for `release`)."""
    return len(_EXECUTABLES)


def release(mark: int) -> None:
    """Drops the executables cached after `mark` (a `cached_count()`): one-off executables (the
    step profile's phases) must not pile up in a long process; XLA:CPU runs out of code memory
    after a few hundred live executables."""
    for key in list(_EXECUTABLES)[mark:]:
        del _EXECUTABLES[key]
