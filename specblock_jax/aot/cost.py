"""One ahead-of-time compile and its record: the TPU compiler's cost and memory analyses.

A record (a plain dict, JSON-ready) per phase:
    compiled         bool; error (str) when the compile failed
    optimal_seconds  the compiler's estimate of one call's run time (its roofline over FLOPs and
                     bytes on that chip), per device; None where the compiler gave none (libtpu
                     0.0.42 reports negative values, -1 s per part it cannot estimate, for many
                     programs: report.py then prices by the roofline of flops and bytes)
    flops, bytes_accessed   per device
    device_bytes     arguments + outputs + temporaries - aliased (donated) bytes, per device
    hbm_bytes        the chip's memory; fits = device_bytes <= hbm_bytes
    compile_s        wall seconds of lowering + compiling on this machine (all compiles of the phase)
    layer_loop       how the target's layer loop was counted (price.py): "multiplied" or "unrolled"
    memory           argument / output / temp / alias bytes per device
    kernels          the Pallas kernels in the program (models/kernel_cost.py): per kernel its
                     calls, per-call flops and bytes, and how its cost entered the figures:
                     "CostEstimate" (the kernel states one; the compiler's cost analysis counts
                     it) or "analytic" (the compiler sees no FLOPs inside it: calls x its
                     analytic cost are added to flops, bytes_accessed and optimal_seconds)
A compile the compiler refuses for lack of memory is a record with fits false, the error, and
`device_bytes` read from the compiler's message when it states them.
"""

from __future__ import annotations

import dataclasses
import re
import time
import traceback
from typing import Any, Callable, Sequence

import jax

from specblock_jax.aot.presets import for_layers
from specblock_jax.aot.topology import Chip
from specblock_jax.models import kernel_cost
from specblock_jax.models.config import ModelConfig

COST_KEYS = ("optimal_seconds", "flops", "bytes_accessed")
_XLA_KEYS = {"optimal_seconds": "optimal_seconds", "flops": "flops", "bytes_accessed": "bytes accessed"}


def lower_compile(fn: Callable, static: tuple, args: Sequence[Any], donate: Sequence[int] = ()):
    """jax.jit(fn) with the leading `static` arguments static, lowered on `args` (ShapeDtypeStructs
    with shardings) and compiled: (compiled, seconds, kernels) with kernels its `kernel_calls`."""
    t0 = time.perf_counter()
    n = len(static)
    jitted = jax.jit(fn, static_argnums=tuple(range(n)), donate_argnums=tuple(n + i for i in donate))
    # a topology's executables cannot be loaded back on this host: keep them out of the persistent
    # compilation cache (its reads would fail with a warning for each phase)
    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        with kernel_cost.collect() as log:
            compiled = jitted.lower(*static, *args).compile()
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
    return compiled, time.perf_counter() - t0, kernel_calls(compiled.as_text(), log)


def _instructions(hlo: str) -> list[str]:
    """An HLO module's text split into instructions (a custom call's config spans lines)."""
    out: list[str] = []
    for line in hlo.splitlines():
        if _INSTRUCTION.match(line) or not out:
            out.append(line)
        else:
            out[-1] += "\n" + line
    return out


_INSTRUCTION = re.compile(r"^\s*(ROOT )?%\S+ = ")


def kernel_calls(hlo: str, log: dict) -> list[dict]:
    """Each traced kernel of `log` ({scope tag: KernelCost}) with its number of custom calls in
    the compiled `hlo` (an unrolled layer loop repeats one traced call)."""
    calls = [i for i in _instructions(hlo) if "custom-call(" in i]
    out = []
    for tag, c in log.items():
        n = sum(f"/{tag}/" in i for i in calls)
        if n:
            out.append({"name": c.name, "calls": n, "flops": c.flops, "bytes_accessed": c.bytes_accessed,
                        "source": c.source})
    return out


def with_kernels(c: dict[str, float], kernels: list[dict], chip: Chip) -> dict[str, float]:
    """Costs `c` (`costs`) plus calls x the analytic cost of each kernel the compiler cannot see
    into, its time by the chip's roofline (max of FLOPs at peak and bytes at HBM bandwidth)."""
    out = dict(c)
    for k in kernels:
        if k["source"] != "analytic":
            continue
        out["flops"] += k["calls"] * k["flops"]
        out["bytes_accessed"] += k["calls"] * k["bytes_accessed"]
        seconds = max(k["flops"] / (chip.bf16_tflops * 1e12), k["bytes_accessed"] / (chip.hbm_gbps * 1e9))
        if out["optimal_seconds"] >= 0:
            out["optimal_seconds"] += k["calls"] * seconds
    return out


def kernel_label(kernels: list[dict]) -> str:
    """"-" or e.g. "splash_causal x36 analytic; cache_prefix x36 CostEstimate" (calls summed over
    the traces of one kernel, e.g. the branches of a switch)."""
    calls: dict[tuple[str, str], int] = {}
    for k in kernels:
        calls[(k["name"], k["source"])] = calls.get((k["name"], k["source"]), 0) + k["calls"]
    return "; ".join(f"{name} x{n} {source}" for (name, source), n in calls.items()) or "-"


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


CUTS = (2, 3)  # depths of the cuts "multiplied" extrapolates from (a 1-layer program fuses differently)


def multiplied(c_a: dict[str, float], c_b: dict[str, float], layers: int) -> dict[str, float | None]:
    """Costs of an L-layer program from those of its CUTS-deep cuts a < b = a + 1:
    c_a + (L - a) (c_b - c_a) (every cost that depends on the depth grows linearly with it).
    optimal_seconds is None when either cut has no estimate (a negative value)."""
    a = CUTS[0]
    out: dict[str, float | None] = {k: c_a[k] + (layers - a) * (c_b[k] - c_a[k]) for k in COST_KEYS}
    if min(c_a["optimal_seconds"], c_b["optimal_seconds"]) < 0:
        out["optimal_seconds"] = None
    return out


def checked(c: dict[str, float]) -> dict[str, float | None]:
    """Costs of one compile, optimal_seconds None when the compiler gave no estimate (< 0)."""
    return {**c, "optimal_seconds": c["optimal_seconds"] if c["optimal_seconds"] >= 0 else None}


# the TPU compiler's out-of-memory messages, e.g. "Used 20.50G of 15.75G hbm" or "the total memory
# required for HLO temporaries (32.09G) exceeds available HBM (15.75G)"
_OOM = (re.compile(r"Used ([0-9.]+)([KMGT]?) of [0-9.]+[KMGT]? hbm"),
        re.compile(r"required for [^(]*\(([0-9.]+)([KMGT]?)\) exceeds available HBM"))
_UNIT = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def oom_bytes(message: str) -> int | None:
    """The bytes per device an out-of-memory compile error states, or None."""
    for pattern in _OOM:
        m = pattern.search(message)
        if m:
            return int(float(m.group(1)) * _UNIT[m.group(2)])
    return None


def failed(error: BaseException, hbm_bytes: int, compile_s: float) -> dict:
    """The record of a phase whose compile raised (e.g. the compiler's out-of-memory)."""
    if isinstance(error, BaseException):
        msg = "".join(traceback.format_exception_only(type(error), error)).strip()
    else:
        msg = str(error)
    return {"compiled": False, "error": msg[:2000], **{k: None for k in COST_KEYS},
            "device_bytes": oom_bytes(msg), "hbm_bytes": hbm_bytes, "fits": False,
            "compile_s": round(compile_s, 2)}


def record(compiled, cost: dict[str, float | None] | None, hbm_bytes: int, compile_s: float,
           layer_loop: str, kernels: list[dict] = ()) -> dict:
    """A compiled phase's record (cost None: its cut compiles failed, costs unknown); kernels:
    the L-layer program's `kernel_calls`."""
    mem = memory(compiled)
    cost = cost or {k: None for k in COST_KEYS}
    return {"compiled": True, **cost, "device_bytes": mem["device_bytes"], "hbm_bytes": hbm_bytes,
            "fits": mem["device_bytes"] <= hbm_bytes, "compile_s": round(compile_s, 2),
            "layer_loop": layer_loop, "memory": mem, "kernels": list(kernels)}


@dataclasses.dataclass(frozen=True)
class Variant:
    """The target config (its num_layers and layer-scan unrolls) and drafter one chain is compiled for."""
    cfg: ModelConfig
    drafter: Any


def unrolled(cfg: ModelConfig, layers: int | None = None) -> ModelConfig:
    """`cfg` cut to `layers` (None: all) with its layer scan fully unrolled, in forwards with a KV
    cache (decoding) and without (training); only aot unrolls decoding's scan."""
    k = cfg.num_layers if layers is None else layers
    return cfg.replace(num_layers=k, scan_unroll=k, cache_scan_unroll=k)


def variants(cfg: ModelConfig, drafter: Any, accounting: str) -> tuple[Variant, list[Variant]]:
    """(the L-layer variant, the cut variants whose costs price it; [] = the L-layer one's own
    costs ("unrolled"), or none ("memory"))."""
    if accounting == "unrolled" or (accounting == "multiplied" and cfg.num_layers <= CUTS[-1]):
        return Variant(unrolled(cfg), drafter), []
    rolled = Variant(cfg.replace(scan_unroll=1, cache_scan_unroll=1), drafter)
    if accounting == "memory":
        return rolled, []
    return rolled, [Variant(unrolled(cfg, k), for_layers(drafter, k)) for k in CUTS]
