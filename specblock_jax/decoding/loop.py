"""`LoopSpec`: the static settings of one compiled decode loop, target-only or speculative, and the
loop's three stages.

    spec = LoopSpec(graphdef=target.graphdef, cfg=target.config, drafter=drafter, cache_len=128,
                    max_new=64, greedy=True)
    out = jax.jit(LoopSpec.decode, static_argnums=0)(spec, target.params, drafter_params, inputs)
    # the same in stages, as continuous batching runs them (decoding/refill.py):
    state = spec.start(target.params, drafter_params, inputs)   # prefill (+ the drafter's first state)
    state = spec.run(target.params, drafter_params, state, inputs.stop_ids, jnp.int32(0))
    out = spec.output(state)                                    # a LoopOutput

`inputs` is a `LoopInputs` (decoding/prefill.py). A LoopSpec is frozen and hashable: jit sees it
as a static `self`, and it is part of `compiled`'s cache key, so equal settings share one
executable. The stages take only parameters, the loop state and traced values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from specblock_jax.decoding import autoregressive, speculative
from specblock_jax.decoding.prefill import LoopInputs, LoopOutput
from specblock_jax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopSpec:
    """Static settings of one decode loop."""

    graphdef: Any
    """The target's nnx GraphDef."""
    cfg: ModelConfig
    """The target's config."""
    drafter: Any = None
    """A Drafter (drafters/base.py): speculative decoding; None: target-only decoding."""
    cache_len: int
    """KV cache slots per row: >= P + max_new (+ N = drafter.num_nodes)."""
    max_new: int
    """The largest new-token budget of any row (one compilation serves every smaller one)."""
    greedy: bool = False
    """Every row's temperature is 0: greedy verification (speculative only; target-only decoding
    samples each row at its own temperature, so one loop serves both and this stays False)."""
    collect: bool = False
    """Keep the target's hidden states at the drafter's layers for every committed position
    (serving-time adaptation's free labels; speculative only)."""
    hist_size: int = 0
    """S, the history's width (speculative only): 0 = P + max_new + N of the rows started; a
    continuous-batching stream sets its prompt bucket's, so rows from shorter buckets fit."""

    def __post_init__(self):
        if self.drafter is None:
            if self.collect:
                raise ValueError("LoopSpec: collect needs a drafter (target-only decoding has no features)")
            # settings the target-only loop does not read: equal loops get equal specs
            object.__setattr__(self, "greedy", False)
            object.__setattr__(self, "hist_size", 0)

    @property
    def num_nodes(self) -> int:
        """N, the nodes of every draft tree (0 target-only)."""
        return 0 if self.drafter is None else self.drafter.num_nodes

    def start(self, params, drafter_params, inputs: LoopInputs):
        """The prefill of `inputs`' rows (tokens [B, P]) and, speculative, the drafter's first
        state: the loop state (`ARState` or `SpecState`, every field per row)."""
        if self.drafter is None:
            return autoregressive.ar_start(self, params, inputs)
        return speculative.spec_start(self, params, drafter_params, inputs)

    def run(self, params, drafter_params, state, stop_ids: jax.Array, wake: jax.Array):
        """Decoding steps until every row is done or, when wake ([] int32) > 0, until at least
        `wake` rows are (continuous batching: requests wait for free rows)."""
        if self.drafter is None:
            return autoregressive.ar_run(self, params, state, stop_ids, wake)
        return speculative.spec_run(self, params, drafter_params, state, stop_ids, wake)

    def output(self, state) -> LoopOutput:
        """The loop's outputs: tokens [B, max_new (+ N)]; with `collect` also history [B, S],
        hist_len [B] and features [B, S, n, H]."""
        if self.drafter is None:
            return autoregressive.ar_output(state)
        return speculative.spec_output(state)

    def decode(self, params, drafter_params, inputs: LoopInputs) -> LoopOutput:
        """The whole loop: start, run until every row is done, output."""
        state = self.start(params, drafter_params, inputs)
        return self.output(self.run(params, drafter_params, state, inputs.stop_ids, jnp.int32(0)))
