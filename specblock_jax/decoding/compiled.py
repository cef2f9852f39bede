"""Ahead-of-time compiled executables, cached by static settings and argument shapes.

Lets the decoders report compile time apart from run time and lets tests count compilations.

A new executable's first run is slower than its later ones (apparently XLA:CPU finishes preparing
each kernel the first time it runs: a toy loop warmed with one iteration lost the penalty, with
zero iterations it did not; measured +0.1 s for a target-only loop, +0.3-0.5 s for an EAGLE-3 loop at
batch 1-4 on target v2). Run times are what `auto` decides on and what benchmarks compare, so a
caller may pass `warm`: args -> arguments for one short run (e.g. budgets capped at two tokens, so
each kernel of a decode loop runs once), which `compiled` runs right after compiling, on CPU only,
and counts as compile time.

XLA:CPU maps each executable's code in many small memory sections, and Linux caps a process's maps
(vm.max_map_count, 65,530 by default): a bench of 8 methods once died with "LLVM compilation error:
Cannot allocate memory". So before compiling, `compiled` counts the process's maps and, past
`MAP_SHARE` of the limit, drops the oldest cached executables until under it (they compile again if
used again; compile time is reported apart from run time).
"""

from __future__ import annotations

import functools
import gc
import time
from pathlib import Path
from typing import Callable

import jax

_EXECUTABLES: dict = {}
_STATS = {"compilations": 0, "compile_s": 0.0, "evicted": 0}
MAP_SHARE = 0.6  # of vm.max_map_count that live executables may bring the process to


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
    _make_room()
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
