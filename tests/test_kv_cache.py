"""The cached forward: prefill + decode, tree masks, read-only tree forwards and appending their
K/V, combined masks."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specblock_jax as sbj
from specblock_jax.models import apply, cache_mask, causal_mask
from specblock_jax.models.kv_cache import take_path


def _target(kind="qwen3", **changes):
    return sbj.init_target(sbj.models.config.tiny(kind, **changes), seed=3)


@functools.partial(jax.jit, static_argnums=0, donate_argnames="cache")
def _step(graphdef, params, tokens, positions, mask, cache):
    out = apply(graphdef, params, tokens, positions, mask, cache)
    return out.logits, out.cache


def test_prefill_then_stepwise_decode_equals_full_forward():
    target = _target()
    rng = np.random.default_rng(0)
    lengths = np.array([5, 9])
    total = 16
    seqs = rng.integers(0, 128, (2, total))
    full = np.asarray(sbj.forward(target, seqs))
    # prefill a right-padded prompt batch, then feed one token per step per sequence
    cache = sbj.init_cache(target.config, 2, 32)
    compiled_before = _step._cache_size()  # other tests share _step (at other shapes)
    p = 12
    prompt = np.where(np.arange(p)[None] < lengths[:, None], seqs[:, :p], 0)
    pos = np.broadcast_to(np.arange(p), (2, p))
    logits, cache = _step(target.graphdef, target.params, jnp.asarray(prompt), jnp.asarray(pos),
                          causal_mask(2, p), cache)
    cache = cache._replace(lengths=jnp.asarray(lengths, jnp.int32))
    for b in range(2):
        np.testing.assert_allclose(np.asarray(logits)[b, :lengths[b]], full[b, :lengths[b]], atol=1e-5)
    steps = total - lengths.max()
    for s in range(steps):
        idx = lengths + s
        tok = seqs[np.arange(2), idx][:, None]
        logits, cache = _step(target.graphdef, target.params, jnp.asarray(tok), cache.lengths[:, None],
                              jnp.ones((2, 1, 1), bool), cache)
        cache = cache.advance(1)
        for b in range(2):
            np.testing.assert_allclose(np.asarray(logits)[b, 0], full[b, idx[b]], atol=1e-5)
    assert _step._cache_size() - compiled_before == 2  # one for prefill, one for the decode step: no recompiles


def _ancestors(parents):
    """Host-side reference: node i sees node j iff j is i or an ancestor of i (test only)."""
    n = len(parents)
    m = np.zeros((n, n), bool)
    for i in range(n):
        j = i
        while j >= 0:
            m[i, j] = True
            j = parents[j]
    return m


def test_tree_mask_forward_equals_each_root_to_node_path_run_causally():
    target = _target("llama")
    rng = np.random.default_rng(1)
    prefix = rng.integers(0, 128, (1, 7))
    # node 0 is the root (the last committed token); a tree of 8 nodes with several branches
    parents = np.array([-1, 0, 0, 1, 1, 2, 4, 4])
    depth = np.array([0, 1, 1, 2, 2, 2, 3, 3])
    nodes = rng.integers(0, 128, 8)
    cache = sbj.init_cache(target.config, 1, 32)
    _, cache = _step(target.graphdef, target.params, jnp.asarray(prefix), jnp.arange(7)[None],
                     causal_mask(1, 7), cache)
    cache = cache._replace(lengths=jnp.asarray([7], jnp.int32))
    tree_logits, _ = _step(target.graphdef, target.params, jnp.asarray(nodes[None]),
                           jnp.asarray(7 + depth[None]), jnp.asarray(_ancestors(parents)[None]), cache)
    for i in range(8):
        path = []
        j = i
        while j >= 0:
            path.append(nodes[j])
            j = parents[j]
        seq = np.concatenate([prefix[0], path[::-1]])[None]
        ref = np.asarray(sbj.forward(target, seq))[0, -1]
        np.testing.assert_allclose(np.asarray(tree_logits)[0, i], ref, atol=1e-5, err_msg=f"node {i}")


@pytest.mark.parametrize("attention", ["bucketed", "full", "cascade"])
def test_read_only_tree_forward_equals_the_writing_forward_and_returns_its_new_kv(attention):
    """apply(write_cache=False) (the tree verify's) leaves the cache as it was, gives the writing
    forward's logits, and its new_kv [L, B, T, K, D] is what the writing forward wrote."""
    target = _target(attention=attention)
    rng = np.random.default_rng(4)
    parents = np.array([-1, 0, 0, 1, 1, 2])
    anc = jnp.asarray(np.stack([_ancestors(parents)] * 2))
    depth = np.array([0, 1, 1, 2, 2, 2])
    lengths = jnp.asarray([7, 12], jnp.int32)
    shape = (target.config.num_layers, 2, target.config.num_kv_heads, 40, target.config.head_dim)
    cache = sbj.KVCache(jnp.asarray(rng.normal(size=shape), jnp.float32),
                        jnp.asarray(rng.normal(size=shape), jnp.float32), lengths)
    nodes = jnp.asarray(rng.integers(0, 128, (2, 6)))
    pos = lengths[:, None] + jnp.asarray(depth)[None]
    run = jax.jit(functools.partial(apply, target.graphdef), static_argnames="write_cache")
    wrote = run(target.params, nodes, pos, anc, cache)
    read = run(target.params, nodes, pos, anc, cache, write_cache=False)
    np.testing.assert_allclose(np.asarray(read.logits), np.asarray(wrote.logits), rtol=1e-5, atol=1e-5)
    for written, new in zip((wrote.cache.k, wrote.cache.v), read.new_kv):
        assert new.shape == (target.config.num_layers, 2, 6, target.config.num_kv_heads, target.config.head_dim)
        for b in range(2):
            got = np.swapaxes(np.asarray(written)[:, b, :, int(lengths[b]):int(lengths[b]) + 6], 1, 2)
            np.testing.assert_allclose(np.asarray(new)[:, b], got, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(read.cache.k), np.asarray(cache.k))  # only read


def test_append_commits_exactly_the_chosen_new_rows_and_advances():
    cfg = sbj.models.config.tiny()
    rng = np.random.default_rng(2)
    shape = (cfg.num_layers, 2, cfg.num_kv_heads, 16, cfg.head_dim)
    fill = lambda shp: jnp.asarray(rng.normal(size=shp), jnp.float32)  # noqa: E731
    cache = sbj.KVCache(fill(shape), fill(shape), jnp.asarray([3, 5], jnp.int32))
    before = jax.device_get(cache)
    new_shape = (cfg.num_layers, 2, 6, cfg.num_kv_heads, cfg.head_dim)  # [L, B, T, K, D]: T = 6 new tokens
    new_kv = (fill(new_shape), fill(new_shape))
    keep = jnp.asarray([[0, 2, 5], [1, 3, 0]], jnp.int32)
    count = jnp.asarray([3, 2], jnp.int32)
    after = jax.device_get(cache.append(*take_path(new_kv, keep), count))
    np.testing.assert_array_equal(after.lengths, [6, 7])
    for layer in range(cfg.num_layers):
        for i, (buf_before, buf_after) in enumerate(((before.k[layer], after.k[layer]),
                                                     (before.v[layer], after.v[layer]))):
            for b, length in enumerate([3, 5]):  # buffers [B, K, S, D]
                np.testing.assert_array_equal(buf_after[b, :, :length], buf_before[b, :, :length])  # prefix kept
                np.testing.assert_array_equal(buf_after[b, :, length + 3:], buf_before[b, :, length + 3:])
                for j in range(int(count[b])):
                    np.testing.assert_array_equal(buf_after[b, :, length + j],
                                                  np.asarray(new_kv[i])[layer, b, int(keep[b, j])])


def test_cache_mask_combines_committed_prefix_and_new_token_mask():
    new = jnp.asarray([[[1, 0], [1, 1]]], bool)
    got = np.asarray(cache_mask(new, jnp.asarray([2]), 5)).astype(int)
    np.testing.assert_array_equal(got[0], [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    tree = jnp.asarray([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], bool)  # root with two children
    got = np.asarray(cache_mask(tree, jnp.asarray([1]), 5)).astype(int)
    np.testing.assert_array_equal(got[0], [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 1, 0]])


def test_hidden_states_come_in_the_requested_order_with_repeats():
    target = _target()
    ids = np.arange(6)[None]
    _, all_hidden = sbj.forward(target, ids, hidden_ids=(0, 1, 2))
    _, picked = sbj.forward(target, ids, hidden_ids=(2, 0, 2))
    for k, i in enumerate((2, 0, 2)):
        np.testing.assert_array_equal(np.asarray(picked[:, :, k]), np.asarray(all_hidden[:, :, i]))
    import pytest

    with pytest.raises(ValueError, match=r"hidden_ids \[3\] outside \[0, 2\]"):
        sbj.forward(target, ids, hidden_ids=(1, 3))
