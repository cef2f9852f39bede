"""The parallel sampling verifier of deterministic drafts equals the sequential walk, uniform for
uniform, on random trees (sibling duplicates, tokens with p = 0, peaked and one-hot targets)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specblock_jax.trees import DraftTree, verify_sampling_with_uniforms
from specblock_jax.trees.verify import verify_sampling_sequential

N, V, B = 12, 6, 64  # small vocabulary: siblings often repeat a token, drafts are often accepted

_parallel = jax.jit(verify_sampling_with_uniforms, static_argnums=4)
_sequential = jax.jit(verify_sampling_sequential, static_argnums=4)


def _random_batch(rng):
    """B random trees padded to N nodes, target probabilities [B, N, V] and uniforms [2, B, N]."""
    tokens = rng.integers(0, V, (B, N))
    parents = np.zeros((B, N), int)
    valid = np.zeros((B, N), bool)
    p = rng.dirichlet(np.ones(V) * 0.5, size=(B, N))
    for b in range(B):
        n = rng.integers(1, N + 1)
        parents[b, 0], valid[b, 0] = -1, True
        for j in range(1, n):
            parents[b, j] = rng.integers(max(0, j - 3), j)  # fairly deep trees
            valid[b, j] = rng.random() < 0.9 and valid[b, parents[b, j]]
        for c in range(N):
            kids = np.flatnonzero((parents[b] == c) & valid[b])
            kind = rng.choice(4, p=[0.2, 0.5, 0.15, 0.15])
            if kind == 1 and len(kids):  # peaked on a child's token: acceptances at depth > 1
                p[b, c] = 0.9 * np.eye(V)[tokens[b, rng.choice(kids)]] + 0.1 * p[b, c]
            elif kind == 2:  # one-hot (a greedy-like row)
                p[b, c] = np.eye(V)[rng.integers(0, V)]
            elif kind == 3:  # top-k-like truncation: exact zeros, maybe on drafted tokens
                p[b, c, rng.permutation(V)[: rng.integers(1, V)]] = 0.0
                if p[b, c].sum() == 0:
                    p[b, c, rng.integers(0, V)] = 1.0
                p[b, c] /= p[b, c].sum()
    u = rng.random((2, B, N)).astype(np.float32)
    u[rng.random((2, B, N)) < 0.03] = 0.0  # jax.random.uniform's range is [0, 1)
    tree = DraftTree(jnp.asarray(tokens, jnp.int32), jnp.asarray(parents, jnp.int32), jnp.asarray(valid))
    logp = jnp.log(jnp.asarray(p, jnp.float32))
    return tree, logp, jnp.asarray(u[0]), jnp.asarray(u[1])


@pytest.mark.parametrize("max_children", [1, 2, 3, None])
def test_parallel_equals_sequential_on_random_trees(max_children):
    rng = np.random.default_rng(100 + (max_children or 0))
    depths, dup_siblings = [], 0
    for _ in range(12):  # 12 x 64 trees
        tree, logp, u_acc, u_bonus = _random_batch(rng)
        par = _parallel(tree, logp, u_acc, u_bonus, max_children)
        seq = _sequential(tree, logp, u_acc, u_bonus, max_children)
        for name in ("path", "num_accepted", "bonus", "new_tokens"):
            np.testing.assert_array_equal(np.asarray(getattr(par, name)), np.asarray(getattr(seq, name)),
                                          err_msg=name)
        depths += np.asarray(par.num_accepted).tolist()
        tok, par_, val = (np.asarray(x) for x in tree[:3])
        for b in range(B):  # sibling pairs (among the tried ones) that share a token
            for c in range(N):
                kids = tok[b, (par_[b] == c) & val[b] & (np.arange(N) > 0)][:max_children or N]
                dup_siblings += len(kids) - len(set(kids.tolist()))
    depths = np.asarray(depths)
    # the cases that matter are exercised: deep acceptances and repeated sibling tokens
    assert (depths >= 2).mean() > 0.1 and (depths >= 3).sum() > 20
    assert dup_siblings > (20 if max_children != 1 else -1)


def _one(tokens, parents, p, u_acc, u_bonus, max_children=None):
    tree = DraftTree(jnp.asarray([tokens], jnp.int32), jnp.asarray([parents], jnp.int32),
                     jnp.ones((1, len(tokens)), bool))
    args = (tree, jnp.log(jnp.asarray([p], jnp.float32)), jnp.asarray([u_acc], jnp.float32),
            jnp.asarray([u_bonus], jnp.float32), max_children)
    return [(np.asarray(r.path)[0].tolist(), int(r.num_accepted[0]), np.asarray(r.new_tokens)[0].tolist())
            for r in (_parallel(*args), _sequential(*args))]


def test_hand_made_tree_with_a_known_answer():
    # root's children: node 1 (token 0), node 2 (token 0 again), node 3 (token 1), node 4 (token 3,
    # p = 0); node 5 (token 2) under node 3
    tokens = [9 % V, 0, 0, 1, 3, 2]
    parents = [-1, 0, 0, 0, 0, 3]
    p = np.zeros((6, V))
    p[0, :4] = [0.5, 0.3, 0.2, 0.0]
    p[3, :4] = [0.1, 0.1, 0.1, 0.7]
    p[[1, 2, 4, 5], 0] = 1.0
    # node 1: 0.6 >= 0.5, rejected; node 2 repeats token 0 (residual 0): rejected even with u = 0;
    # node 3: residual p(1) = 0.3 / 0.5 = 0.6 > 0.55, accepted; node 5: 0.2 >= p(2) = 0.1, rejected;
    # bonus at node 3 from (0.1, 0.1, 0, 0.7) / 0.9 with u = 0.5: cdf 0.11, 0.22, 0.22, 1 -> token 3
    u_acc = [0.0, 0.6, 0.0, 0.55, 0.0, 0.2]
    u_bonus = [0.9, 0.9, 0.9, 0.5, 0.9, 0.9]
    for got in _one(tokens, parents, p, u_acc, u_bonus):
        assert got == ([0, 3, 0, 0, 0, 0], 1, [1, 3, -1, -1, -1, -1])
    # with max_children 2 only nodes 1 and 2 are tried: bonus from (0, 0.3, 0.2, 0) / 0.5, u = 0.9
    for got in _one(tokens, parents, p, u_acc, u_bonus, max_children=2):
        assert got == ([0, 0, 0, 0, 0, 0], 0, [2, -1, -1, -1, -1, -1])


def test_rejecting_the_whole_remaining_mass_falls_back_to_the_last_tried_token():
    """A row whose mass (0.75 here, 1 - 1e-7 under float32 rounding) sits on the drafted token and a
    uniform above it: the residual is empty, and the bonus is that token, not the last vocabulary
    entry an empty inverse CDF would give."""
    p = np.zeros((3, V))
    p[0, 2] = 0.75
    p[1:, 0] = 1.0
    for got in _one([0, 2, 4], [-1, 0, 0], p, [0.0, 0.8, 0.3], [0.5, 0.5, 0.5]):
        assert got == ([0, 0, 0], 0, [2, -1, -1])
