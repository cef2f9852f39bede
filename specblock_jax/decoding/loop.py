"""The decode loop, chosen once: `TargetLoop` (no drafter, decoding/autoregressive.py) or
`SpeculativeLoop` (decoding/speculative.py). Both have the same stages:

    loop = make_loop(graphdef=target.graphdef, cfg=target.config, drafter=drafter, cache_len=128,
                     max_new=64, greedy=True)
    out = jax.jit(decode_loop, static_argnums=0)(loop, target.params, drafter_params, inputs)
    # the same in stages, as continuous batching runs them (decoding/refill.py):
    state = loop.start(target.params, drafter_params, inputs)   # prefill (+ the drafter's first state)
    state = loop.run(target.params, drafter_params, state, inputs.stop_ids, jnp.int32(0))
    out = loop.output(state)                                    # a LoopOutput

`inputs` is a `LoopInputs` (decoding/loop_core.py). A loop is frozen and hashable: jit sees it as a
static argument, and it is part of `compiled`'s cache key, so equal settings share one executable.
The stages take only parameters, the loop state and traced values.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from specblock_jax.decoding.autoregressive import TargetLoop
from specblock_jax.decoding.loop_core import LoopInputs, LoopOutput
from specblock_jax.decoding.sized import is_sized
from specblock_jax.decoding.sizing import size_menu
from specblock_jax.decoding.speculative import SpeculativeLoop
from specblock_jax.models.config import ModelConfig
from specblock_jax.models.kv_cache import cache_length

DecodeLoop = TargetLoop | SpeculativeLoop
SIZINGS = ("auto", "fixed")


def make_loop(*, graphdef: Any, cfg: ModelConfig, drafter: Any = None, max_new: int, cache_len: int | None = None,
              prompt_len: int | None = None, greedy: bool = False, collect: bool = False,
              hist_size: int = 0, stream: bool = False, sizing: str | None = None) -> DecodeLoop:
    """A `SpeculativeLoop` with a drafter, else a `TargetLoop` (which reads neither greedy nor
    hist_size: its rows sample at their own temperatures, so equal loops stay equal). The cache
    holds `cache_len` slots, or, given the prompt bucket `prompt_len` instead, room for it, max_new
    and a tree (models/kv_cache.py `cache_length`). A continuous-batching `stream`'s history is as
    wide as its prompt bucket's (prompt_len + max_new + N), so rows from shorter buckets fit.
    `sizing` ("auto" or "fixed"; None: the drafter's own `sizing` setting, else "fixed"): whether
    each step chooses how much of the tree to verify (decoding/sizing.py; the loop's step costs
    are attached apart, decoding/step_costs.py) or always verifies N nodes.
    This is the one place that tells target-only
    decoding from speculation: past it, callers use the loop's own methods."""
    if (cache_len is None) == (prompt_len is None):
        raise ValueError("make_loop: give cache_len or prompt_len, not both")
    nodes = 0 if drafter is None else drafter.num_nodes
    if cache_len is None:
        cache_len = cache_length(prompt_len, max_new, nodes)
    if stream:
        if prompt_len is None:
            raise ValueError("make_loop: a stream's loop needs its prompt bucket, prompt_len")
        hist_size = prompt_len + max_new + nodes
    if drafter is None:
        if collect:
            raise ValueError("collect needs a drafter (target-only decoding has no features)")
        return TargetLoop(graphdef=graphdef, cfg=cfg, cache_len=cache_len, max_new=max_new)
    sizing = sizing or getattr(drafter, "sizing", "fixed")
    if sizing not in SIZINGS:
        raise ValueError(f"sizing must be one of {SIZINGS}, got {sizing!r}")
    # a drafter whose rows choose their size at the prefill (BlockPilot) keeps its own sizes
    sizes = size_menu(nodes) if sizing == "auto" and nodes > 1 and not is_sized(drafter) else ()
    return SpeculativeLoop(graphdef=graphdef, cfg=cfg, drafter=drafter, cache_len=cache_len, max_new=max_new,
                           greedy=greedy, collect=collect, hist_size=hist_size, sizes=sizes)


def decode_loop(loop: DecodeLoop, params, drafter_params, inputs: LoopInputs) -> LoopOutput:
    """The whole loop (start, run until every row is done, output) as one function of the loop:
    what `compiled` jits with the loop static."""
    return loop.decode(params, drafter_params, inputs)


def finish_loop(loop: DecodeLoop, params, drafter_params, state, stop_ids) -> LoopOutput:
    """The loop from a started state (run until every row is done, output): the decoding steps
    of a batch whose prefill ran apart (decoding/sized.py)."""
    return loop.output(loop.run(params, drafter_params, state, stop_ids, jnp.int32(0)))
