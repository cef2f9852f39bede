"""Target-only decoding: one token per target forward, the whole batch in one `lax.while_loop`."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from specblock_jax.decoding.prefill import LoopOutput, prefill, step_keys
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


def ar_step(graphdef, max_new, params, last, cache, generated, out, done, stopped, budgets, sampling,
            stop_ids, key):
    """One step of `ar_loop` (also timed alone by the step profile): a one-token forward of `last`
    [B], commit it where still running, sample the next token with key [B], write it.
    Returns (next [B], cache, generated, out, done, stopped)."""
    b = last.shape[0]
    one = jnp.ones((b, 1, 1), bool)
    fwd = apply(graphdef, params, last[:, None], cache.lengths[:, None], one, cache)
    active = ~done
    cache = fwd.cache.advance(active.astype(jnp.int32))  # commit `last` where still running
    nxt = sample(key, fwd.logits[:, 0], sampling)
    write = active[:, None] & (jnp.arange(max_new)[None, :] == generated[:, None])
    generated = generated + active
    hit = active & jnp.isin(nxt, stop_ids)
    return (nxt, cache, generated, jnp.where(write, nxt[:, None], out), done | hit | (generated >= budgets),
            stopped | hit)


def ar_start(graphdef, cfg, cache_len, max_new, params, tokens, lengths, budgets, sampling, stop_ids,
             keys) -> ARState:
    """The prefill: an `ARState` for the rows of tokens [B, P] (see `ar_loop`)."""
    pre = prefill(graphdef, cfg, params, tokens, lengths, budgets, sampling, stop_ids, keys, cache_len, max_new)
    one = jnp.ones((tokens.shape[0],), jnp.int32)
    return ARState(one, pre.first, one, pre.out, pre.done, pre.stopped, pre.cache, budgets, sampling, keys)


def ar_run(graphdef, params, stop_ids, state: ARState, wake) -> ARState:
    """Decoding steps until every row is done, or, when wake ([] int32) > 0, until at least `wake`
    rows are."""
    max_new = state.out.shape[1]

    def cond(s: ARState):
        return ~jnp.all(s.done) & ~((wake > 0) & (jnp.sum(s.done) >= wake))

    def body(s: ARState) -> ARState:
        nxt, cache, generated, out, done, stopped = ar_step(
            graphdef, max_new, params, s.last, s.cache, s.generated, s.out, s.done, s.stopped, s.budgets,
            s.sampling, stop_ids, step_keys(s.keys, s.step))
        return s._replace(step=s.step + ~s.done, last=nxt, generated=generated, out=out, done=done,
                          stopped=stopped, cache=cache)

    return jax.lax.while_loop(cond, body, state)


def ar_output(state: ARState) -> LoopOutput:
    return LoopOutput(state.out, state.generated, state.stopped, state.generated - 1)


def ar_loop(graphdef, cfg, cache_len, max_new, params, tokens, lengths, budgets, sampling, stop_ids,
            keys) -> LoopOutput:
    """tokens [B, P] right-padded prompts with lengths [B]; budgets [B] new-token limits;
    stop_ids [S] (-1 = unused); keys [B] PRNG keys, one per sequence. Static: graphdef, cfg,
    cache_len (>= P + max_new), max_new. Returns a `LoopOutput` with tokens [B, max_new]."""
    state = ar_start(graphdef, cfg, cache_len, max_new, params, tokens, lengths, budgets, sampling, stop_ids,
                     keys)
    return ar_output(ar_run(graphdef, params, stop_ids, state, jnp.int32(0)))
