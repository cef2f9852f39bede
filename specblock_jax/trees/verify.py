"""Lossless tree verification.

Given a draft tree and the target's logits at every node (one forward under the tree mask), pick
the accepted root-to-node path and one bonus token:
- greedy (`verify_greedy`): the deepest path whose every token equals the target's argmax after
  its parent; the bonus is the argmax after the last accepted node. Output == greedy decoding.
- sampling (`verify_sampling`): multi-draft recursive rejection sampling. At the current node with
  target distribution p, try its children in index order: accept child x (drawn from q) with
  probability min(1, p(x) / q(x)); on rejection set p <- normalise(max(p - q, 0)) and try the next
  sibling; if all are rejected, the bonus is sampled from the residual p. Deterministic drafts use
  q = one-hot(x), i.e. accept with probability p(x), else zero x out. The committed tokens are then
  distributed exactly as the target's sampling distribution.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from specblock_jax.trees.tree import DraftTree, ancestor_mask, child_table, depths


class VerifyResult(NamedTuple):
    path: jax.Array  # [B, N] int32 node indices root-first (path[:, 0] = 0), padded with 0
    num_accepted: jax.Array  # [B] int32 accepted draft nodes (root excluded)
    bonus: jax.Array  # [B] int32 the target's token after the last accepted node
    new_tokens: jax.Array  # [B, N] int32 accepted draft tokens then the bonus, padded with -1


def _result(tree: DraftTree, path, count, bonus) -> VerifyResult:
    n = tree.tokens.shape[1]
    idx = jnp.arange(n)[None, :]
    drafted = jnp.take_along_axis(tree.tokens, jnp.roll(path, -1, axis=1), axis=1)
    new = jnp.where(idx < count[:, None], drafted, jnp.where(idx == count[:, None], bonus[:, None], -1))
    return VerifyResult(path, count, bonus, new.astype(jnp.int32))


def verify_greedy(tree: DraftTree, logits: jax.Array) -> VerifyResult:
    """tree with N nodes, logits [B, N, V] (the target's next-token logits at every node)."""
    b, n = tree.tokens.shape
    anc = ancestor_mask(tree.parents)
    dep = depths(anc)
    want = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # [B, N]
    parent_want = jnp.take_along_axis(want, jnp.maximum(tree.parents, 0), axis=1)
    correct = (tree.valid & (tree.tokens == parent_want)).at[:, 0].set(True)
    ok = ~jnp.any(anc & ~correct[:, None, :], axis=-1)  # node and all its ancestors correct
    best = jnp.argmax(jnp.where(ok, dep, -1), axis=1)  # deepest; ties -> smallest index
    count = jnp.take_along_axis(dep, best[:, None], axis=1)[:, 0]
    on_path = jnp.take_along_axis(anc, best[:, None, None], axis=1)[:, 0]  # [B, N]
    slot = jnp.where(on_path, dep, n)  # node k goes to path[depth[k]]
    path = jnp.zeros((b, n + 1), jnp.int32)
    path = path.at[jnp.arange(b)[:, None], slot].set(jnp.arange(n, dtype=jnp.int32)[None])[:, :n]
    bonus = jnp.take_along_axis(want, best[:, None], axis=1)[:, 0]
    return _result(tree, path, count, bonus)


def _sample_from(probs: jax.Array, u: jax.Array) -> jax.Array:
    """Inverse-CDF sample of an unnormalised distribution [V] with a uniform u in [0, 1)."""
    cdf = jnp.cumsum(probs)
    return jnp.minimum(jnp.searchsorted(cdf, u * cdf[-1], side="right"), probs.shape[0] - 1)


def _walk(p, q, tokens, table, u_accept, u_bonus):
    """One sequence: p [N, V] target probs per node; q [N, V] or None; table [N, C] children."""
    n, v = p.shape
    c = table.shape[1]

    def proposal(j):
        return jax.nn.one_hot(tokens[j], v, dtype=p.dtype) if q is None else q[j]

    def try_children(cur):
        def cond(s):
            r, _, found, _ = s
            return (r < c) & ~found & (table[cur, jnp.minimum(r, c - 1)] >= 0)

        def body(s):
            r, resid, _, _ = s
            j = table[cur, r]
            x = tokens[j]
            qj = proposal(j)
            accept = u_accept[j] * qj[x] < resid[x]
            left = jnp.maximum(resid - qj, 0.0)
            total = left.sum()
            resid = jnp.where(accept, resid, jnp.where(total > 0, left / jnp.maximum(total, 1e-30), resid))
            return r + 1, resid, accept, j

        _, resid, found, j = jax.lax.while_loop(cond, body, (0, p[cur], False, 0))
        return resid, found, j

    def cond(s):
        return ~s[1]

    def body(s):
        cur, _, path, count, _ = s
        resid, found, j = try_children(cur)
        path = jnp.where(found, path.at[count + 1].set(j), path)
        bonus = _sample_from(resid, u_bonus[cur]).astype(jnp.int32)
        return jnp.where(found, j, cur), ~found, path, count + found, bonus

    init = (jnp.int32(0), False, jnp.zeros((n,), jnp.int32), jnp.int32(0), jnp.int32(0))
    _, _, path, count, bonus = jax.lax.while_loop(cond, body, init)
    return path, count, bonus


def verify_sampling(
    tree: DraftTree,
    target_logprobs: jax.Array,
    key: jax.Array,
    max_children: int | None = None,
) -> VerifyResult:
    """tree with N nodes; target_logprobs [B, N, V] of the sampling distribution (after
    temperature / top-k / top-p); key: one PRNG key per sequence [B]. max_children (static)
    bounds the siblings tried per node (default N - 1)."""
    n = tree.tokens.shape[1]
    u = jax.vmap(lambda k: jax.random.uniform(k, (2, n)))(key)  # one draw per node and use
    return verify_sampling_with_uniforms(tree, target_logprobs, u[:, 0], u[:, 1], max_children)


def verify_sampling_with_uniforms(tree, target_logprobs, u_accept, u_bonus, max_children=None):
    """`verify_sampling` with explicit uniforms in [0, 1): u_accept [B, N] decides whether node j
    is accepted when tried; u_bonus [B, N] samples the bonus when the walk stops at node j."""
    n = tree.tokens.shape[1]
    table = child_table(tree.parents, tree.valid, max_children or max(n - 1, 1))
    p = jnp.exp(target_logprobs.astype(jnp.float32))
    if tree.draft_probs is None:
        path, count, bonus = jax.vmap(lambda *a: _walk(a[0], None, *a[1:]))(
            p, tree.tokens, table, u_accept, u_bonus)
    else:
        path, count, bonus = jax.vmap(_walk)(p, tree.draft_probs.astype(jnp.float32), tree.tokens,
                                             table, u_accept, u_bonus)
    return _result(tree, path, count, bonus)
