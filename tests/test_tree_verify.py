"""Draft-tree masks and the jitted verifiers against slow pure-Python references (hypothesis)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import spec_reference as ref
from specblock_jax.trees import (DraftTree, ancestor_mask, chain_parents, child_table, depths,
                                verify_greedy, verify_sampling_with_uniforms)


N = 12  # every tree is padded to this static budget with invalid nodes, as drafters do


@st.composite
def trees(draw, vocab=6):
    n = draw(st.integers(1, N))
    parents = [-1] + [draw(st.integers(0, j - 1)) for j in range(1, n)] + [0] * (N - n)
    valid = [True] + [draw(st.booleans()) for _ in range(1, n)] + [False] * (N - n)
    for j in range(1, N):  # a node under an invalid parent is invalid too
        valid[j] = valid[j] and valid[parents[j]]
    tokens = [draw(st.integers(0, vocab - 1)) for _ in range(N)]
    return np.array(tokens), np.array(parents), np.array(valid)


_greedy = jax.jit(verify_greedy)
_sampling = jax.jit(verify_sampling_with_uniforms, static_argnums=4)


def _batch(*arrays):
    return [jnp.asarray(a)[None] for a in arrays]


@settings(max_examples=60, deadline=None)
@given(trees())
def test_ancestor_mask_depth_and_children_match_reference(tree):
    tokens, parents, valid = tree
    mask = np.asarray(ancestor_mask(jnp.asarray(parents)[None]))[0]
    np.testing.assert_array_equal(mask, ref.ancestor_mask(parents))
    np.testing.assert_array_equal(np.asarray(depths(jnp.asarray(mask)[None]))[0],
                                  [len(ref.ancestors(parents, i)) - 1 for i in range(len(parents))])
    table = np.asarray(child_table(jnp.asarray(parents)[None], jnp.asarray(valid)[None], 3))[0]
    for u in range(len(parents)):
        kids = ref.children(parents, valid, u)[:3]
        assert table[u].tolist() == kids + [-1] * (3 - len(kids))


def test_small_documented_example():
    parents = jnp.asarray([[-1, 0, 0, 1, 0]])
    expect = [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 0, 0, 1]]
    np.testing.assert_array_equal(np.asarray(ancestor_mask(parents))[0].astype(int), expect)
    np.testing.assert_array_equal(np.asarray(chain_parents(1, 4))[0], [-1, 0, 1, 2])


@settings(max_examples=80, deadline=None)
@given(trees(), st.integers(0, 2**31 - 1))
def test_greedy_verifier_matches_reference(tree, seed):
    tokens, parents, valid = tree
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(len(tokens), 6)).astype(np.float32)
    res = _greedy(DraftTree(*_batch(tokens, parents, valid)), jnp.asarray(logits)[None])
    path, new = ref.verify_greedy(tokens, parents, valid, logits)
    count = int(res.num_accepted[0])
    assert count == len(path) - 1
    assert np.asarray(res.path)[0, :count + 1].tolist() == path
    assert np.asarray(res.new_tokens)[0, :count + 1].tolist() == new
    assert (np.asarray(res.new_tokens)[0, count + 1:] == -1).all()


@settings(max_examples=80, deadline=None)
@given(trees(), st.integers(0, 2**31 - 1), st.booleans(), st.integers(1, 4))
def test_sampling_verifier_matches_reference(tree, seed, stochastic, max_children):
    tokens, parents, valid = tree
    n, v = len(tokens), 6
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(v) * 0.5, size=n).astype(np.float32)
    p[rng.random(n) < 0.2] = np.eye(v, dtype=np.float32)[rng.integers(0, v)]  # some one-hot rows
    q = None
    if stochastic:  # siblings share their parent's q; each token has q > 0 under it
        q_par = rng.dirichlet(np.ones(v), size=n).astype(np.float32)
        q = q_par[np.maximum(parents, 0)]
        q[np.arange(n), tokens] += 0.05
        q /= q.sum(-1, keepdims=True)
    u_acc, u_bonus = rng.random((2, n)).astype(np.float32)
    tree_j = DraftTree(*_batch(tokens, parents, valid), None if q is None else jnp.asarray(q)[None])
    logp = jnp.log(jnp.asarray(p))[None]
    res = _sampling(tree_j, logp, jnp.asarray(u_acc)[None], jnp.asarray(u_bonus)[None], max_children)
    path, new = ref.verify_sampling(tokens, parents, valid, p, q, u_acc, u_bonus, max_children)
    count = int(res.num_accepted[0])
    assert np.asarray(res.path)[0, :count + 1].tolist() == path
    assert np.asarray(res.new_tokens)[0, :count + 1].tolist() == new


def test_greedy_target_makes_sampling_verifier_greedy():
    """With a one-hot target, rejection sampling accepts exactly the argmax children."""
    tokens = np.array([0, 2, 3, 1, 2])
    parents = np.array([-1, 0, 0, 2, 3])
    valid = np.ones(5, bool)
    p = np.eye(4, dtype=np.float32)[[3, 0, 1, 2, 0]]  # argmax after each node
    tree = DraftTree(*_batch(tokens, parents, valid))
    verify = jax.jit(verify_sampling_with_uniforms)  # one compile, not op-by-op dispatch per seed
    for seed in range(5):
        u = jax.random.uniform(jax.random.key(seed), (2, 1, 5))
        res = verify(tree, jnp.log(jnp.asarray(p))[None], u[0], u[1])
        assert np.asarray(res.new_tokens)[0, :4].tolist() == [3, 1, 2, 0]
