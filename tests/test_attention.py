"""Attention whose cost follows the sequence: the length buckets, the switch that reads only a
bucket of the cache (slots past it are never touched), and decoding that is unchanged by it and
compiles once across buckets."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specblock_jax as sbj
from specblock_jax.decoding import compilation_count
from specblock_jax.drafters.eagle3._train import Eagle3Task
from specblock_jax.models.attention import attend, attend_prefix, length_buckets
from helpers import peaked_tiny_target


def test_length_buckets_grow_by_at_most_one_and_a_half_up_to_half_the_cache():
    assert length_buckets(448) == (64, 96, 128, 192, 448)
    assert length_buckets(64) == (64,) and length_buckets(100) == (100,)
    assert length_buckets(256) == (64, 96, 128, 256)
    sizes = length_buckets(4096)
    assert sizes[-2] == 2048 and all(b / a <= 1.5 for a, b in zip(sizes[:-1], sizes[1:-1]))


@pytest.mark.parametrize("live", [1, 64, 65, 96, 97, 200, 256])
def test_attend_prefix_reads_only_the_bucket_it_needs(live):
    """Equal to dense attention over the live slots; NaN planted past the chosen bucket never
    reaches the output (the dense path over the whole cache is poisoned by it)."""
    rng = np.random.default_rng(live)
    b, t, n, kv, d, s = 2, 3, 4, 2, 8, 256
    q = jnp.asarray(rng.normal(size=(b, t, n, d)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, s, kv, d)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, s, kv, d)), jnp.float32)
    mask = jnp.asarray(rng.random((b, t, s)) < 0.7) & (jnp.arange(s) < live)
    mask = mask.at[:, :, 0].set(True)
    heads = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  the cache layout [B, K, S, D]
    got = jax.jit(attend_prefix)(q, heads(k), heads(v), mask, jnp.int32(live))
    want = attend(q, k[:, :live], v[:, :live], mask[..., :live])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    bucket = min(x for x in length_buckets(s) if x >= live)
    if bucket < s:
        k_bad, v_bad = k.at[:, bucket:].set(jnp.nan), v.at[:, bucket:].set(jnp.nan)
        poisoned = jax.jit(attend_prefix)(q, heads(k_bad), heads(v_bad), mask, jnp.int32(live))
        np.testing.assert_allclose(np.asarray(poisoned), np.asarray(got), atol=0)
        assert np.isnan(np.asarray(attend(q, k_bad, v_bad, mask))).any()


@pytest.mark.slow
def test_bucketed_decoding_equals_full_attention_and_compiles_once_across_buckets():
    """Prompts of 20-60 tokens and 150 new tokens in a 256-slot cache: every step's attention
    switches buckets (64 .. 256) inside one executable; target-only, prompt lookup and EAGLE-3
    give the tokens of the full-cache path, and new prompts compile nothing new."""
    target = peaked_tiny_target(64)
    full = target.with_attention("full")
    eagle = Eagle3Task({"num_nodes": 8, "top_k": 2, "depth": 3}, target)
    bundle = eagle.decoding_drafter(eagle.init_params(jax.random.key(3)))
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 64, rng.integers(20, 61)).tolist() for _ in range(2)]
    kw = dict(max_new_tokens=150, options=sbj.DecodeOptions(batch_size=2))
    want = [r.token_ids for r in sbj.generate(full, prompts, **kw)]
    assert all(len(w) == 150 for w in want)
    for drafter in (None, sbj.load_drafter("prompt_lookup", target), bundle):
        got = sbj.generate(target, prompts, drafter=drafter, **kw)
        assert [r.token_ids for r in got] == want
    warm = compilation_count()
    others = [rng.integers(0, 64, rng.integers(33, 64)).tolist() for _ in range(2)]
    for drafter in (None, sbj.load_drafter("prompt_lookup", target), bundle):
        sbj.generate(target, others, drafter=drafter, **kw)
    assert compilation_count() == warm
