"""Target-only decoding: one token per target forward, the whole batch in one `lax.while_loop`.
Its stages are `LoopSpec.start`, `run` and `output` (decoding/loop.py) with no drafter; `spec`
below is that LoopSpec (it imports this module, so this one takes it untyped)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from specblock_jax.decoding.prefill import LoopInputs, LoopOutput, prefill, step_keys
from specblock_jax.decoding.sampling import SamplingParams, sample
from specblock_jax.models.kv_cache import KVCache
from specblock_jax.models.transformer import apply


class ARState(NamedTuple):
    """The loop's carry, every field per row (the cache [L, B, ...]): see `SpecState`."""
    step: jax.Array  # [B] int32 the row's decoding step (the prefill's token was step 0)
    last: jax.Array  # [B] int32 the newest token (its K/V is not cached yet)
    generated: jax.Array  # [B] int32 new tokens so far
    out: jax.Array  # [B, max_new] int32 new tokens, -1 padded
    done: jax.Array  # [B] bool: stopped or out of budget
    stopped: jax.Array  # [B] bool: ended on a stop token
    cache: KVCache
    budgets: jax.Array  # [B] int32 new-token limits
    sampling: SamplingParams  # [B] per-row settings
    keys: jax.Array  # [B] PRNG keys, one per request


def ar_step(spec, params, s: ARState, stop_ids) -> ARState:
    """One decoding step (also timed alone by the step profile): a one-token forward of `s.last`,
    committed where the row still runs, the next token sampled with the row's step key and
    written; rows that hit a stop token or their budget are done."""
    b, width = s.out.shape
    one = jnp.ones((b, 1, 1), bool)
    fwd = apply(spec.graphdef, params, s.last[:, None], s.cache.lengths[:, None], one, s.cache)
    active = ~s.done
    cache = fwd.cache.advance(active.astype(jnp.int32))  # commit `last` where still running
    nxt = sample(step_keys(s.keys, s.step), fwd.logits[:, 0], s.sampling)
    write = active[:, None] & (jnp.arange(width)[None, :] == s.generated[:, None])
    generated = s.generated + active
    hit = active & jnp.isin(nxt, stop_ids)
    return s._replace(step=s.step + active, last=nxt, generated=generated,
                      out=jnp.where(write, nxt[:, None], s.out), done=s.done | hit | (generated >= s.budgets),
                      stopped=s.stopped | hit, cache=cache)


def ar_start(spec, params, inputs: LoopInputs) -> ARState:
    """The prefill: an `ARState` for the rows of inputs.tokens [B, P] (cache_len >= P + max_new)."""
    pre = prefill(spec.graphdef, spec.cfg, params, inputs, spec.cache_len, spec.max_new)
    one = jnp.ones((inputs.tokens.shape[0],), jnp.int32)
    return ARState(one, pre.first, one, pre.out, pre.done, pre.stopped, pre.cache, inputs.budgets, inputs.sampling,
                   inputs.keys)


def ar_run(spec, params, state: ARState, stop_ids, wake) -> ARState:
    """Decoding steps until every row is done, or, when wake ([] int32) > 0, until at least `wake`
    rows are."""
    def cond(s: ARState):
        return ~jnp.all(s.done) & ~((wake > 0) & (jnp.sum(s.done) >= wake))

    return jax.lax.while_loop(cond, lambda s: ar_step(spec, params, s, stop_ids), state)


def ar_output(state: ARState) -> LoopOutput:
    """tokens [B, max_new]; forwards = decoding forwards (the prefill's token excluded)."""
    return LoopOutput(state.out, state.generated, state.stopped, state.generated - 1)
