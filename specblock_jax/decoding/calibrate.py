"""Pick a tree shape for this machine (EAGLE's `total_token=-1` idea, measured end to end).

How many tree nodes pay off depends on how verification cost grows with the node count on the
hardware at hand (flat on an accelerator up to dozens of tokens, steep on a small CPU). EAGLE
times the target at a few node counts; here the whole decoder is timed instead: target
verification at each node budget N, and then real speculative decoding on a few calibration
prompts at each (N, depth), keeping the setting with the highest tokens/s.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specblock_jax.decoding.generate import generate
from specblock_jax.models.kv_cache import init_cache
from specblock_jax.models.target import Target
from specblock_jax.models.transformer import apply


def verify_seconds(target: Target, num_nodes: int, context: int = 256, reps: int = 10) -> float:
    """Median time of one target forward over `num_nodes` tree tokens after `context` tokens."""
    cfg = target.config
    cache = init_cache(cfg, 1, context + num_nodes)._replace(lengths=jnp.asarray([context], jnp.int32))
    tokens = jnp.zeros((1, num_nodes), jnp.int32)
    positions = context + jnp.arange(num_nodes, dtype=jnp.int32)[None]
    mask = jnp.tril(jnp.ones((1, num_nodes, num_nodes), bool))
    fn = jax.jit(lambda p, c: apply(target.graphdef, p, tokens, positions, mask, c).logits)
    jax.block_until_ready(fn(target.params, cache))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(target.params, cache))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def calibrate(target: Target, bundle, prompts: Sequence, nodes: Sequence[int] = (8, 16, 32),
              depths: Sequence[int] = (3, 5, 7), max_new_tokens: int = 64) -> dict:
    """Decodes `prompts` greedily with every (num_nodes, depth) and returns
    {"best": {"num_nodes", "depth"}, "table": [{num_nodes, depth, tokens_per_s, tau}, ...],
     "verify_ms": {N: ms}}. `bundle` is a (Drafter, params) pair whose drafter has `num_nodes`
    and `depth` fields (EAGLE-3, SpecBlock)."""
    drafter, params = bundle
    table = []
    for n, d in itertools.product(nodes, depths):
        candidate = (dataclasses.replace(drafter, num_nodes=n, depth=d), params)
        res = generate(target, prompts, drafter=candidate, max_new_tokens=max_new_tokens, batch_size=1)
        wall = sum(r.stats.total_time_s for r in res)
        table.append({"num_nodes": n, "depth": d,
                      "tokens_per_s": sum(len(r.token_ids) for r in res) / wall,
                      "tau": float(np.mean([r.stats.tau for r in res if r.stats.tau]))})
    best = max(table, key=lambda r: r["tokens_per_s"])
    return {"best": {"num_nodes": best["num_nodes"], "depth": best["depth"]}, "table": table,
            "verify_ms": {n: 1000 * verify_seconds(target, n) for n in sorted({1, *nodes})}}
