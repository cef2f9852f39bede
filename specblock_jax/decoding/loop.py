"""The decode loop, chosen once: `TargetLoop` (no drafter, decoding/autoregressive.py) or
`SpeculativeLoop` (decoding/speculative.py). Both have the same stages:

    loop = make_loop(graphdef=target.graphdef, cfg=target.config, drafter=drafter, cache_len=128,
                     max_new=64, greedy=True)
    out = jax.jit(decode_loop, static_argnums=0)(loop, target.params, drafter_params, inputs)
    # the same in stages, as continuous batching runs them (decoding/refill.py):
    state = loop.start(target.params, drafter_params, inputs)   # prefill (+ the drafter's first state)
    state = loop.run(target.params, drafter_params, state, inputs.stop_ids, jnp.int32(0))
    out = loop.output(state)                                    # a LoopOutput

`inputs` is a `LoopInputs` (decoding/prefill.py). A loop is frozen and hashable: jit sees it as a
static argument, and it is part of `compiled`'s cache key, so equal settings share one executable.
The stages take only parameters, the loop state and traced values.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from specblock_jax.decoding.autoregressive import TargetLoop
from specblock_jax.decoding.prefill import LoopInputs, LoopOutput
from specblock_jax.decoding.speculative import SpeculativeLoop
from specblock_jax.models.config import ModelConfig

DecodeLoop = TargetLoop | SpeculativeLoop


def make_loop(*, graphdef: Any, cfg: ModelConfig, drafter: Any = None, cache_len: int, max_new: int,
              greedy: bool = False, collect: bool = False, hist_size: int = 0) -> DecodeLoop:
    """A `SpeculativeLoop` with a drafter, else a `TargetLoop` (which reads neither greedy nor
    hist_size: its rows sample at their own temperatures, so equal loops stay equal)."""
    if drafter is None:
        if collect:
            raise ValueError("collect needs a drafter (target-only decoding has no features)")
        return TargetLoop(graphdef=graphdef, cfg=cfg, cache_len=cache_len, max_new=max_new)
    return SpeculativeLoop(graphdef=graphdef, cfg=cfg, drafter=drafter, cache_len=cache_len, max_new=max_new,
                           greedy=greedy, collect=collect, hist_size=hist_size)


def decode_loop(loop: DecodeLoop, params, drafter_params, inputs: LoopInputs) -> LoopOutput:
    """The whole loop (start, run until every row is done, output) as one function of the loop:
    what `compiled` jits with the loop static."""
    return loop.decode(params, drafter_params, inputs)


def finish_loop(loop: DecodeLoop, params, drafter_params, state, stop_ids) -> LoopOutput:
    """The loop from a started state (run until every row is done, output): the decoding steps
    of a batch whose prefill ran apart (decoding/sized.py)."""
    return loop.output(loop.run(params, drafter_params, state, stop_ids, jnp.int32(0)))
