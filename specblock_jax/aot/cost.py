"""One ahead-of-time compile and its record: the TPU compiler's cost and memory analyses.

A record (a plain dict, JSON-ready) per phase:
    compiled         bool; error (str) when the compile failed
    optimal_seconds  the compiler's estimate of one call's run time (its roofline over FLOPs and
                     bytes on that chip), per device
    flops, bytes_accessed   per device
    device_bytes     arguments + outputs + temporaries - aliased (donated) bytes, per device
    hbm_bytes        the chip's memory; fits = device_bytes <= hbm_bytes
    compile_s        wall seconds of lowering + compiling on this machine (all compiles of the phase)
    layer_loop       how the target's layer loop was counted: "multiplied" (cost at scan unroll 1
                     plus L - 1 times the difference between unroll 2 and unroll 1: XLA's cost
                     analysis counts a loop body once), "unrolled" (one compile with all L layers
                     unrolled) or "none" (the phase runs no target layers)
Memory comes from the unroll-1 executable: the one the library runs.
"""

from __future__ import annotations

import time
import traceback
from typing import Any, Callable, Sequence

import jax

COST_KEYS = ("optimal_seconds", "flops", "bytes_accessed")
_XLA_KEYS = {"optimal_seconds": "optimal_seconds", "flops": "flops", "bytes_accessed": "bytes accessed"}


def lower_compile(fn: Callable, static: tuple, args: Sequence[Any], donate: Sequence[int] = ()):
    """jax.jit(fn) with the leading `static` arguments static, lowered on `args` (ShapeDtypeStructs
    with shardings) and compiled: (compiled, seconds)."""
    t0 = time.perf_counter()
    n = len(static)
    jitted = jax.jit(fn, static_argnums=tuple(range(n)), donate_argnums=tuple(n + i for i in donate))
    compiled = jitted.lower(*static, *args).compile()
    return compiled, time.perf_counter() - t0


def costs(compiled) -> dict[str, float]:
    """{optimal_seconds, flops, bytes_accessed} of a compiled executable (per device)."""
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):  # older jax: one dict per computation
        ca = ca[0]
    return {k: float(ca.get(x, 0.0)) for k, x in _XLA_KEYS.items()}


def memory(compiled) -> dict[str, int]:
    """Per-device argument / output / temporary / alias bytes and their live total."""
    m = compiled.memory_analysis()
    out = {k: int(getattr(m, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp", "alias")}
    out["device_bytes"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out


def multiplied(c1: dict[str, float], c2: dict[str, float], trips: int) -> dict[str, float]:
    """Costs with a loop body counted `trips` times, from c1 (body counted once) and c2 (the body
    unrolled twice, so counted twice): c1 + (trips - 1) * (c2 - c1)."""
    return {k: c1[k] + (trips - 1) * (c2[k] - c1[k]) for k in COST_KEYS}


def failed(error: BaseException, hbm_bytes: int, compile_s: float) -> dict:
    """The record of a phase whose compile raised (e.g. the compiler's out-of-memory)."""
    msg = "".join(traceback.format_exception_only(type(error), error)).strip()
    return {"compiled": False, "error": msg[:2000], **{k: None for k in COST_KEYS},
            "device_bytes": None, "hbm_bytes": hbm_bytes, "fits": False, "compile_s": round(compile_s, 2)}


def record(compiled, cost: dict[str, float], hbm_bytes: int, compile_s: float, layer_loop: str) -> dict:
    mem = memory(compiled)
    return {"compiled": True, **cost, "device_bytes": mem["device_bytes"], "hbm_bytes": hbm_bytes,
            "fits": mem["device_bytes"] <= hbm_bytes, "compile_s": round(compile_s, 2),
            "layer_loop": layer_loop, "memory": mem}
