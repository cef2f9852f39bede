"""The core both decode loops (`TargetLoop`, `SpeculativeLoop`) share: the named inputs they take
(`LoopInputs`) and the output they return (`LoopOutput`), the prompt forward with the first new
token (`prefill`), the per-step PRNG keys and the while loop itself (`until_done`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from specblock_jax.decoding.sampling import SamplingParams, sample
from specblock_jax.models.kv_cache import KVCache, init_cache
from specblock_jax.models.transformer import apply, causal_mask
from specblock_jax.parallel.activation import constrain_cache


class Prefilled(NamedTuple):
    cache: KVCache  # the prompt's K/V, lengths = prompt lengths (the first token is not cached)
    logits: jax.Array  # [B, V] the target's next-token logits after the prompt
    hidden: jax.Array | None  # [B, P, n, H] hidden states at `hidden_ids` for every prompt position
    first: jax.Array  # [B] int32 the first new token, drawn with each row's key folded with step 0
    out: jax.Array  # [B, width] int32 new tokens so far: `first`, then -1
    stopped: jax.Array  # [B] bool: the first token is a stop token
    done: jax.Array  # [B] bool: stopped, or a budget of one token


class LoopInputs(NamedTuple):
    """The rows a decode loop starts from (one compiled loop serves any values of these)."""
    tokens: jax.Array  # [B, P] int32 right-padded prompts
    lengths: jax.Array  # [B] int32 prompt lengths
    budgets: jax.Array  # [B] int32 new-token limits
    sampling: SamplingParams  # [B] per-row temperature, top-k, top-p
    stop_ids: jax.Array  # [S] int32 stop tokens (-1 = unused)
    keys: jax.Array  # [B] PRNG keys, one per request


class LoopOutput(NamedTuple):
    tokens: jax.Array  # [B, W] int32 new tokens, -1 after each row's `generated`
    generated: jax.Array  # [B] int32 new tokens per row (a stop token included)
    stopped: jax.Array  # [B] bool: the row ended on a stop token
    forwards: jax.Array  # [B] int32 decoding forwards of the target per row (the prefill excluded)
    commits: jax.Array | None = None  # [B, N + 1] the speculative loop's steps by the batch's most committed
    sizing: Any = None  # with step sizing: a SizingTally of [B, ...] counts (decoding/sizing.py)
    # with the speculative loop's `collect`: the adapter's free labels (see adaptation/buffer.py)
    history: jax.Array | None = None  # [B, S] prompt + committed tokens
    hist_len: jax.Array | None = None  # [B] valid history entries
    features: jax.Array | None = None  # [B, S, n, H] hidden states at the drafter's layers

    def without_labels(self) -> "LoopOutput":
        """The outputs every caller reads (tokens, generated, stopped, forwards), without the
        adapter's labels (history, features), which stay on the device."""
        return self._replace(history=None, hist_len=None, features=None)


def step_keys(keys: jax.Array, step) -> jax.Array:
    """[B] per-row PRNG keys folded with the decoding step: one step for all rows ([] int, 0 = the
    prefill's token) or each row's own ([B], as continuous batching keeps them)."""
    step = jnp.asarray(step, jnp.int32)
    return jax.vmap(jax.random.fold_in, in_axes=(0, None if step.ndim == 0 else 0))(keys, step)


def prefill(graphdef, cfg, params, inputs: LoopInputs, cache_len: int, width: int,
            hidden_ids: tuple[int, ...] = ()) -> Prefilled:
    """The prompt forward over `inputs`' rows (tokens [B, P]). The cache has `cache_len` slots and
    `out` `width` columns. Logits are computed at the last prompt token only."""
    tokens, lengths = inputs.tokens, inputs.lengths
    b, p = tokens.shape
    cache = constrain_cache(init_cache(cfg, b, cache_len))  # laid out by the mesh, if sharded
    pos = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    fwd = apply(graphdef, params, tokens, pos, causal_mask(b, p), cache, hidden_ids=hidden_ids,
                logit_indices=(lengths - 1)[:, None])
    logits = fwd.logits[:, 0]
    first = sample(step_keys(inputs.keys, 0), logits, inputs.sampling)
    stopped = jnp.isin(first, inputs.stop_ids)
    out = jnp.full((b, width), -1, jnp.int32).at[:, 0].set(first)
    return Prefilled(fwd.cache._replace(lengths=lengths), logits, fwd.hidden, first, out, stopped,
                     stopped | (inputs.budgets <= 1))


def until_done(step, state, wake):
    """`step` applied until every row is done or, when wake ([] int32) > 0, until at least `wake`
    rows are (continuous batching: requests wait for free rows)."""
    def cond(s):
        return ~jnp.all(s.done) & ~((wake > 0) & (jnp.sum(s.done) >= wake))

    return jax.lax.while_loop(cond, step, state)
