"""The cost of custom (Pallas) kernels, which XLA's cost analysis cannot see inside.

A compiled program's `cost_analysis()` counts a Pallas call as its operands' bytes and no FLOPs
(splash attention over 8 heads x 32k x 128: 16.8 MB, 0 FLOP, 7 us, for ~2.2 TFLOP of work). Each
kernel wrapper therefore names its call with a scope tag (`kernel_scope`) and states its own cost
per call, per device: analytic FLOPs and HBM bytes, or the kernel's `pl.CostEstimate`. While
`collect()` is active (aot pricing), the tags and costs are kept; `specblock_jax.aot.cost`
counts each tag's calls in the compiled HLO (an unrolled layer loop repeats them) and adds
calls x cost to the compiler's figures.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
from typing import Iterator

import jax


@dataclasses.dataclass(frozen=True)
class KernelCost:
    """One traced kernel call's cost per device; source: "analytic" or "CostEstimate"."""
    name: str
    flops: float
    bytes_accessed: float
    transcendentals: float
    source: str


_LOG: contextvars.ContextVar[dict | None] = contextvars.ContextVar("sbj_kernel_costs", default=None)
_IDS = itertools.count()


@contextlib.contextmanager
def collect() -> Iterator[dict]:
    """Keeps {tag: KernelCost} of every kernel traced inside the block."""
    log: dict[str, KernelCost] = {}
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)


def kernel_scope(cost: KernelCost) -> contextlib.AbstractContextManager:
    """A named scope tagging the kernel call traced inside it (recorded while `collect` is on)."""
    tag = f"sbj_kernel_{cost.name}_{next(_IDS)}"
    log = _LOG.get()
    if log is not None:
        log[tag] = cost
    return jax.named_scope(tag)


def estimate(cost: KernelCost):
    """The same cost as a Pallas `CostEstimate` (what the compiler may use for scheduling)."""
    from jax.experimental import pallas as pl
    return pl.CostEstimate(flops=int(cost.flops), transcendentals=int(cost.transcendentals),
                           bytes_accessed=int(cost.bytes_accessed))
