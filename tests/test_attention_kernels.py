"""Every cache-attention path against the dense reference (`attend` under `cache_mask`) to 1e-5 in
fp32: the blockwise online softmax (CPU / GPU), the TPU kernels in Pallas interpret mode (the
committed-prefix kernel and splash attention's causal prefill), the cascade merge, with GQA, tree
masks, ragged lengths (0 included: a prompt) and rows that see no key; which path the backend
takes; and the model's forward and decoded tokens under cascade attention."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specblock_jax as sbj
from specblock_jax.models import attention, online_softmax, tpu_attention
from specblock_jax.models.attention import attend, attend_cache, cache_path
from specblock_jax.models.kv_cache import cache_mask
from specblock_jax.models.transformer import apply, causal_mask
from helpers import peaked_tiny_target

ATOL = 1e-5


def _case(seed, b=3, t=5, kv=2, g=2, s=320, d=16, layers=2, lengths=(0, 100, 315)):
    """A stacked cache [L, B, K, S, D] holding the new K/V at lengths[b]..; a random tree mask
    [B, T, T] with row 0 of sequence 0 seeing nothing (its cache is empty)."""
    rng = np.random.default_rng(seed)
    f32 = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
    kc, vc, q = f32(layers, b, kv, s, d), f32(layers, b, kv, s, d), f32(b, t, kv * g, d)
    lengths = jnp.asarray(lengths, jnp.int32)
    new = lambda c: jnp.stack([jnp.swapaxes(c[1, i], 0, 1)[lengths[i]:lengths[i] + t] for i in range(b)])  # noqa: E731
    mask = jnp.asarray(rng.random((b, t, t)) < 0.5) | jnp.eye(t, dtype=bool)
    mask = mask.at[0, 0].set(False)
    return q, new(kc), new(vc), mask, kc, vc, lengths


def _reference(q, kc, vc, mask, lengths):
    """Dense attention over layer 1 under the [B, T, S] mask, and which rows see a key."""
    full = cache_mask(mask, lengths, kc.shape[3])
    heads = lambda c: jnp.swapaxes(c[1], 1, 2)  # noqa: E731
    return np.asarray(attend(q, heads(kc), heads(vc), full)), np.asarray(full.any(-1))


def _close_where_seen(got, want, seen):
    got = np.asarray(got)
    np.testing.assert_allclose(got[seen], want[seen], atol=ATOL)
    assert np.all(got[~seen] == 0)  # a row that sees nothing is 0, never NaN


def test_cascade_equals_dense_with_gqa_tree_masks_and_ragged_lengths():
    q, kn, vn, mask, kc, vc, lengths = _case(0)
    want, seen = _reference(q, kc, vc, mask, lengths)
    assert not seen.all()  # the case has a row without keys
    got = jax.jit(attend_cache, static_argnums=8)(q, kn, vn, mask, kc, vc, jnp.int32(1), lengths, "cascade")
    _close_where_seen(got, want, seen)
    dense = attend_cache(q, kn, vn, mask, kc, vc, jnp.int32(1), lengths, "full")
    np.testing.assert_allclose(np.asarray(dense), want, atol=ATOL)


def test_blockwise_parts_read_only_live_blocks_and_merge_exactly():
    """The committed part reads blocks below max(lengths) only (NaN planted past them never
    arrives); key blocks of the new part (several blocks) and query chunks change nothing."""
    q, kn, vn, mask, kc, vc, lengths = _case(1, t=8, lengths=(0, 40, 60))
    want, seen = _reference(q, kc, vc, mask, lengths)
    poisoned = kc.at[:, :, :, 64:].set(jnp.nan)  # S = 320: blocks of 64, max length 60
    committed = online_softmax.attend_prefix_blocks(q, poisoned, vc, lengths, jnp.int32(1))
    new = online_softmax.attend_masked_blocks(q, kn, vn, mask)
    _close_where_seen(online_softmax.merge(committed, new), want, seen)
    for chunk in (2, 4):
        fn = lambda qc, mc: online_softmax.merge(  # noqa: E731
            online_softmax.attend_prefix_blocks(qc, kc, vc, lengths, jnp.int32(1)),
            online_softmax.attend_masked_blocks(qc, kn, vn, mc))
        _close_where_seen(online_softmax.by_query_chunks(fn, q, mask, chunk), want, seen)
    k2, v2 = jnp.concatenate([kn] * 130, 1), jnp.concatenate([vn] * 130, 1)  # 1040 keys: 65 blocks of 16
    m2 = jnp.concatenate([mask, jnp.zeros(mask.shape[:2] + (1032,), bool)], 2)
    np.testing.assert_allclose(np.asarray(online_softmax.attend_masked_blocks(q, k2, v2, m2)[0]),
                               np.asarray(new[0]), atol=ATOL)


def test_tpu_prefix_kernel_in_interpret_mode_equals_dense():
    """Ragged lengths 0 / 100 / 315 over 320 slots in blocks of 128 (the last one partial)."""
    q, kn, vn, mask, kc, vc, lengths = _case(2, d=128)
    heads = lambda c: jnp.swapaxes(c[1], 1, 2)  # noqa: E731
    slots = jnp.arange(kc.shape[3])
    only_cache = jnp.broadcast_to((slots[None, :] < lengths[:, None])[:, None], mask.shape[:2] + slots.shape)
    want = np.asarray(attend(q, heads(kc), heads(vc), only_cache))
    seen = np.asarray(only_cache.any(-1))
    old = tpu_attention.PREFIX_BLOCK
    tpu_attention.PREFIX_BLOCK = 128
    try:
        out, lse = tpu_attention.prefix_attention(q, kc, vc, jnp.int32(1), lengths, interpret=True)
    finally:
        tpu_attention.PREFIX_BLOCK = old
    _close_where_seen(out, want, seen)
    _, ref_lse = online_softmax.attend_prefix_blocks(q, kc, vc, lengths, jnp.int32(1))
    np.testing.assert_allclose(np.asarray(lse), np.asarray(ref_lse), atol=ATOL)  # -inf where unseen


def test_splash_causal_prefill_in_interpret_mode_equals_dense():
    rng = np.random.default_rng(3)
    b, t, kv, g, d = 2, 256, 2, 2, 128
    q = jnp.asarray(rng.normal(size=(b, t, kv * g, d)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(b, t, kv, d)), jnp.float32) for _ in range(2))
    got = tpu_attention.causal_prefill(q, k, v, interpret=True)
    np.testing.assert_allclose(np.asarray(got), np.asarray(attend(q, k, v, causal_mask(b, t))), atol=ATOL)


def test_cpu_keeps_the_dense_path_for_small_shapes_only():
    assert jax.default_backend() == "cpu"
    assert cache_path("bucketed", 16, 1024) == "dense" and cache_path("bucketed", 512, 2048) == "dense"
    assert cache_path("bucketed", 1024, 2048) == "dense" and cache_path("bucketed", 2048, 2048) == "cascade"
    assert cache_path("cascade", 1, 64) == "cascade"
    assert cache_path("full", 4096, 8192) == "dense"
    assert not attention.prompt_kernel("bucketed", 4096, 128, 8192, jnp.bfloat16)  # none on CPU
    assert attention.is_prompt(causal_mask(2, 4), jnp.zeros(2, jnp.int32))
    assert not attention.is_prompt(causal_mask(2, 4), jnp.asarray([0, 1]))
    assert not attention.is_prompt(jnp.ones((2, 4, 4), bool), jnp.zeros(2, jnp.int32))


def test_model_forward_under_cascade_equals_full():
    """A prompt forward, then a tree verify on the filled cache: logits within 1e-5."""
    target = sbj.init_target(sbj.models.config.tiny("qwen3"), seed=3)
    cascade = target.with_attention("cascade")
    rng = np.random.default_rng(4)
    tokens = jnp.asarray(rng.integers(0, 128, (2, 12)))
    pos = jnp.broadcast_to(jnp.arange(12), (2, 12))
    tree = jnp.asarray([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], bool)[None].repeat(2, 0)
    nodes = jnp.asarray(rng.integers(0, 128, (2, 4)))
    outs = []
    for t in (target, cascade):
        cache = sbj.init_cache(t.config, 2, 64)
        first = apply(t.graphdef, t.params, tokens, pos, causal_mask(2, 12), cache)
        cache = first.cache._replace(lengths=jnp.asarray([7, 12], jnp.int32))
        second = apply(t.graphdef, t.params, nodes, cache.lengths[:, None] + jnp.asarray([0, 1, 1, 2]), tree, cache)
        outs.append((first.logits, second.logits))
    for got, want in zip(outs[1], outs[0]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=ATOL)


@pytest.mark.slow
def test_every_method_decodes_the_target_only_tokens_under_cascade_attention():
    """Greedy tokens of prompt lookup and an EAGLE-3 tree equal target-only's, all three under
    cascade attention, and equal the dense path's."""
    from specblock_jax.drafters.eagle3._train import Eagle3Task
    target = peaked_tiny_target(64)
    cascade = target.with_attention("cascade")
    eagle = Eagle3Task({"num_nodes": 8, "top_k": 2, "depth": 3}, cascade)
    bundle = eagle.decoding_drafter(eagle.init_params(jax.random.key(3)))
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 64, rng.integers(20, 61)).tolist() for _ in range(2)]
    kw = dict(max_new_tokens=60, options=sbj.DecodeOptions(batch_size=2))
    want = [r.token_ids for r in sbj.generate(target.with_attention("full"), prompts, **kw)]
    for drafter in (None, sbj.load_drafter("prompt_lookup", cascade), bundle):
        got = sbj.generate(cascade, prompts, drafter=drafter, **kw)
        assert [r.token_ids for r in got] == want
