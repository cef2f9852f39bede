"""Ahead-of-time compiled executables, cached by static settings and argument shapes.

Lets the decoders report compile time apart from run time and lets tests count compilations.
"""

from __future__ import annotations

import functools
import time
from typing import Callable

import jax

_EXECUTABLES: dict = {}
_STATS = {"compilations": 0, "compile_s": 0.0}


def _signature(args) -> tuple:
    leaves, treedef = jax.tree.flatten(args)
    return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


def compiled(fn: Callable, static: tuple, *args, donate_argnums: tuple[int, ...] = ()):
    """Returns (executable for fn(*static, *args), seconds spent compiling it now, 0 if cached)."""
    key = (fn, static, _signature(args), donate_argnums)
    if key in _EXECUTABLES:
        return _EXECUTABLES[key], 0.0
    start = time.perf_counter()
    jitted = jax.jit(functools.partial(fn, *static), donate_argnums=donate_argnums)
    exe = jitted.lower(*args).compile()
    seconds = time.perf_counter() - start
    _EXECUTABLES[key] = exe
    _STATS["compilations"] += 1
    _STATS["compile_s"] += seconds
    return exe, seconds


def compilation_count() -> int:
    """Executables compiled so far by `compiled` in this process."""
    return _STATS["compilations"]


def cached_count() -> int:
    """Executables held in the cache now (a mark for `release`)."""
    return len(_EXECUTABLES)


def release(mark: int) -> None:
    """Drops the executables cached after `mark` (a `cached_count()`): one-off executables (the
    step profile's phases) must not pile up in a long process; XLA:CPU runs out of code memory
    after a few hundred live executables."""
    for key in list(_EXECUTABLES)[mark:]:
        del _EXECUTABLES[key]
