"""Static-shape draft trees.

A tree is padded arrays with a fixed node budget N per sequence. Node 0 is the root: the last
committed token, whose K/V the verification forward computes. Every other node's parent has a
smaller index (`parents[j] < j`), so a chain of B tokens is parents = [-1, 0, 1, ..., B - 1].
Dynamic trees change which nodes are `valid`, never the shapes. Masks, depths and child tables are
computed from `parents` with jnp inside jit.

Example (N = 5, root with children 1 and 2, node 3 under 1, node 4 invalid):
    parents = [-1, 0, 0, 1, 0]   valid = [1, 1, 1, 1, 0]
    ancestor_mask (row i sees column j):   1 0 0 0 0
                                           1 1 0 0 0
                                           1 0 1 0 0
                                           1 1 0 1 0
                                           1 0 0 0 1
    depth = [0, 1, 1, 2, 1]
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp


class DraftTree(NamedTuple):
    tokens: jax.Array  # [B, N] int32; tokens[:, 0] is the root (last committed token)
    parents: jax.Array  # [B, N] int32; parents[:, 0] = -1, parents[:, j] < j
    valid: jax.Array  # [B, N] bool; the root is always valid
    # [B, N, V] fp32: the distribution each node's token was *sampled* from (siblings sampled
    # i.i.d. share it), or None for deterministic drafts (top-k, argmax, lookup), treated as
    # one-hot on the node's token by the verifier.
    draft_probs: jax.Array | None = None
    # [B, N] fp32: the drafter's own estimate that each node is accepted (reached) given the root:
    # a path product of its draft probabilities (root 1, invalid 0), or None when it has none.
    # Step sizing (decoding/sizing.py) calibrates it online and prunes the tree by it; it never
    # affects which tokens verification accepts.
    scores: jax.Array | None = None


def check_tree(tree: DraftTree, batch: int, num_nodes: int, vocab_size: int, where: str) -> None:
    """ValueError naming `where` unless the tree's static shapes are tokens/parents/valid [B, N]
    (and draft_probs [B, N, V]): free at trace time, so a drafter's contract is checked in place."""
    want = {"tokens": (batch, num_nodes), "parents": (batch, num_nodes), "valid": (batch, num_nodes)}
    if tree.draft_probs is not None:
        want["draft_probs"] = (batch, num_nodes, vocab_size)
    if tree.scores is not None:
        want["scores"] = (batch, num_nodes)
    for name, shape in want.items():
        got = tuple(getattr(tree, name).shape)
        if got != shape:
            raise ValueError(f"{where}: DraftTree.{name} has shape {got}, expected {shape} "
                             f"(batch {batch}, num_nodes {num_nodes}, vocabulary {vocab_size})")


def chain_parents(batch: int, num_nodes: int) -> jax.Array:
    """[B, N] parents of a chain: [-1, 0, 1, ..., N - 2]."""
    return jnp.broadcast_to(jnp.arange(num_nodes, dtype=jnp.int32) - 1, (batch, num_nodes))


def ancestor_mask(parents: jax.Array) -> jax.Array:
    """[B, N] parents -> [B, N, N] bool, True where column j is row i or one of its ancestors.

    Pointer doubling: start from self | parent and square the relation ceil(log2 N) times.
    """
    n = parents.shape[-1]
    eye = jnp.eye(n, dtype=bool)
    step = eye | jax.nn.one_hot(parents, n, dtype=bool)  # one_hot(-1) is all False
    for _ in range(max(1, math.ceil(math.log2(n)))):
        step = step | (jnp.einsum("bij,bjk->bik", step.astype(jnp.int32), step.astype(jnp.int32)) > 0)
    return step


def depths(mask: jax.Array) -> jax.Array:
    """[B, N, N] ancestor mask -> [B, N] int32 depth (root 0)."""
    return mask.sum(-1).astype(jnp.int32) - 1


def child_table(parents: jax.Array, valid: jax.Array, max_children: int) -> jax.Array:
    """[B, N, C] int32: the valid children of each node in index order, padded with -1.

    Children past `max_children` are left out (never verified, so never accepted).
    """
    b, n = parents.shape
    same = (parents[:, :, None] == parents[:, None, :]) & valid[:, None, :]  # [B, j, i]
    earlier = jnp.arange(n)[None, :] < jnp.arange(n)[:, None]  # i < j
    rank = jnp.sum(same & earlier[None], axis=-1)  # [B, N] rank among siblings
    keep = valid & (parents >= 0) & (rank < max_children)
    rows = jnp.where(keep, parents, n)  # dropped -> an out-of-range row
    cols = jnp.where(keep, rank, 0)
    table = jnp.full((b, n + 1, max_children), -1, jnp.int32)
    bidx = jnp.broadcast_to(jnp.arange(b)[:, None], (b, n))
    table = table.at[bidx, rows, cols].set(jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n)))
    return table[:, :n]


def select_tree(root: jax.Array, tokens: jax.Array, parents: jax.Array, scores: jax.Array,
                num_nodes: int) -> DraftTree:
    """The best num_nodes - 1 of M candidates, as a DraftTree under `root`.

    tokens/parents/scores [B, M]: parents are candidate indices (-1 = the root) smaller than the
    child's; scores are cumulative log-probs (-inf = not a candidate), so a child never outscores its
    parent and, with ties going to the lower index, the selection contains every selected node's
    ancestors. Selected nodes keep creation order (parents before children); unfilled nodes are
    invalid.
    """
    b, m = tokens.shape
    keep = min(num_nodes - 1, m)
    order = jnp.argsort(-scores, axis=1, stable=True)[:, :keep]
    chosen = jnp.sort(order, axis=1)  # parents come before children
    to_node = jnp.full((b, m), -1, jnp.int32).at[jnp.arange(b)[:, None], chosen].set(
        jnp.arange(1, keep + 1, dtype=jnp.int32)[None])
    cpar = jnp.take_along_axis(parents, chosen, axis=1)
    node_par = jnp.where(cpar < 0, 0, jnp.take_along_axis(to_node, jnp.maximum(cpar, 0), axis=1))
    pad = num_nodes - 1 - keep
    tree_tokens = jnp.concatenate([root[:, None].astype(jnp.int32),
                                   jnp.take_along_axis(tokens, chosen, axis=1).astype(jnp.int32),
                                   jnp.zeros((b, pad), jnp.int32)], axis=1)
    tree_parents = jnp.concatenate([jnp.full((b, 1), -1, jnp.int32), node_par,
                                    jnp.zeros((b, pad), jnp.int32)], axis=1)
    valid = jnp.concatenate([jnp.ones((b, 1), bool),
                             jnp.isfinite(jnp.take_along_axis(scores, chosen, axis=1)),
                             jnp.zeros((b, pad), bool)], axis=1)
    node_scores = jnp.exp(jnp.take_along_axis(scores, chosen, axis=1)).astype(jnp.float32)
    tree_scores = jnp.concatenate([jnp.ones((b, 1), jnp.float32), node_scores,
                                   jnp.zeros((b, pad), jnp.float32)], axis=1)
    return DraftTree(tree_tokens, tree_parents, valid, scores=tree_scores)
