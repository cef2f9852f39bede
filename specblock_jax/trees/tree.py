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
