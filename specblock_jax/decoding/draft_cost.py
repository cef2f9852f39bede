"""Drafting cost, measured apart from the fused decode loop.

The loop runs draft, verify and commit in one executable, so the drafter's share cannot be timed
inside it. Instead the drafter's `propose` is compiled alone for the loop's exact shapes and timed
(median of several calls); the drafting time of a sequence is then estimated as
(its drafter calls) x (the time of one batched call).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from specblock_jax.decoding.compiled import compiled
from specblock_jax.drafters.base import DraftContext, Prefill

_MEASURED: dict = {}


def _init(drafter, max_len, params, prefill):
    return drafter.init_state(params, prefill, max_len)


def _propose(drafter, params, state, ctx, key):
    return drafter.propose(params, state, ctx, key)


def propose_seconds(cfg, drafter, params, batch: int, prompt_len: int, hist_size: int,
                    cache_len: int, reps: int = 7) -> float:
    """Median wall time of one batched `drafter.propose` call at the decode loop's shapes."""
    key = (cfg, drafter, batch, prompt_len, hist_size, cache_len)
    if key in _MEASURED:
        return _MEASURED[key]
    n_hidden = len(drafter.hidden_ids)
    hidden = (jnp.zeros((batch, prompt_len, n_hidden, cfg.hidden_size), jnp.dtype(cfg.dtype))
              if n_hidden else None)
    lengths = jnp.full((batch,), prompt_len, jnp.int32)
    prefill = Prefill(jnp.zeros((batch, prompt_len), jnp.int32), lengths, hidden,
                      jnp.zeros((batch, cfg.vocab_size), jnp.float32), jnp.zeros((batch,), jnp.int32))
    init, _ = compiled(_init, (drafter, cache_len), params, prefill)
    state = init(params, prefill)
    ctx = DraftContext(jnp.zeros((batch, hist_size), jnp.int32), lengths + 1,
                       jnp.zeros((batch,), jnp.int32), lengths)
    keys = jax.random.split(jax.random.key(0), batch)
    exe, _ = compiled(_propose, (drafter,), params, state, ctx, keys)
    jax.block_until_ready(exe(params, state, ctx, keys))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(exe(params, state, ctx, keys))
        times.append(time.perf_counter() - t0)
    _MEASURED[key] = float(np.median(times))
    return _MEASURED[key]
