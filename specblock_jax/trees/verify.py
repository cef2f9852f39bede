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

Deterministic drafts are verified in parallel over all nodes (`_parallel_sampling`): with q one-hot
the residual after rejecting siblings x_1..x_{i-1} of parent c is p_c with those tokens zeroed,
renormalised, so sibling i is accepted iff it repeats no earlier sibling's token, no earlier sibling
was accepted, and u_i * (1 - sum of p_c over the earlier distinct sibling tokens) < p_c(x_i); the
bonus is drawn once, at the last accepted node. Trees with a draft distribution q keep the
sequential walk (`verify_sampling_sequential`). For the same uniforms both give the same result,
except where float32 rounding decides (a uniform within rounding error of its threshold).
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


def _deepest_path(parents: jax.Array, passed: jax.Array, anc: jax.Array | None = None):
    """parents [B, N]; passed [B, N] bool: node j's own test passed (given its parent was reached);
    anc [B, N, N] the tree's `ancestor_mask` if the caller has it. Returns path [B, N] (root-first, 0-padded), count [B] (its accepted nodes) and end [B]: the
    deepest node whose whole root path passed (ties -> smallest index)."""
    b, n = parents.shape
    anc = ancestor_mask(parents) if anc is None else anc
    dep = depths(anc)
    ok = ~jnp.any(anc & ~passed.at[:, 0].set(True)[:, None, :], axis=-1)
    end = jnp.argmax(jnp.where(ok, dep, -1), axis=1)
    count = jnp.take_along_axis(dep, end[:, None], axis=1)[:, 0]
    on_path = jnp.take_along_axis(anc, end[:, None, None], axis=1)[:, 0]  # [B, N]
    slot = jnp.where(on_path, dep, n)  # node k goes to path[depth[k]]
    path = jnp.zeros((b, n + 1), jnp.int32)
    path = path.at[jnp.arange(b)[:, None], slot].set(jnp.arange(n, dtype=jnp.int32)[None])[:, :n]
    return path, count, end


def verify_greedy(tree: DraftTree, logits: jax.Array, anc: jax.Array | None = None) -> VerifyResult:
    """tree with N nodes, logits [B, N, V] (the target's next-token logits at every node); anc
    [B, N, N] its ancestor mask when the caller already built it (the tree forward needs it)."""
    return accept_greedy(tree, jnp.argmax(logits, axis=-1).astype(jnp.int32), anc)


def accept_greedy(tree: DraftTree, want: jax.Array, anc: jax.Array | None = None) -> VerifyResult:
    """Greedy acceptance given want [B, N]: the target's next token after every node (-1: none
    known; no child of that node is accepted). `verify_greedy` with the logits' argmax;
    adaptation/replay.py with the committed continuation."""
    parent_want = jnp.take_along_axis(want, jnp.maximum(tree.parents, 0), axis=1)
    path, count, end = _deepest_path(tree.parents, tree.valid & (tree.tokens == parent_want), anc)
    bonus = jnp.take_along_axis(want, end[:, None], axis=1)[:, 0]
    return _result(tree, path, count, bonus)


def _sample_from(probs: jax.Array, u: jax.Array) -> jax.Array:
    """Inverse-CDF sample of an unnormalised distribution [V] with a uniform u in [0, 1)."""
    cdf = jnp.cumsum(probs)
    return jnp.minimum(jnp.searchsorted(cdf, u * cdf[-1], side="right"), probs.shape[0] - 1)


def _gather_rows(x: jax.Array, table: jax.Array) -> jax.Array:
    """x [B, N], table [B, N, C] node indices (-1 = none, read as node 0) -> x at them [B, N, C]."""
    b, n, c = table.shape
    return jnp.take_along_axis(x, jnp.maximum(table, 0).reshape(b, n * c), axis=1).reshape(b, n, c)


def _parallel_sampling(tree: DraftTree, logp: jax.Array, u_accept, u_bonus, table, anc=None):
    """Deterministic drafts (q one-hot), every node at once. logp [B, N, V] fp32; table [B, N, C];
    anc [B, N, N] or None. Returns path [B, N], count [B], bonus [B]."""
    b, n, c = table.shape
    tried = table >= 0  # [B, N, C]: the siblings under each node, in the order they are tried
    tok = _gather_rows(tree.tokens, table)
    p_tok = jnp.exp(jnp.take_along_axis(logp, tok, axis=2))  # p_parent(sibling's token) [B, N, C]
    earlier = jnp.tril(jnp.ones((c, c), bool), -1)  # [k, k']: k' < k
    dup = jnp.any((tok[..., :, None] == tok[..., None, :]) & tried[..., None, :] & earlier, axis=-1)
    fresh = tried & ~dup  # a repeated token was zeroed out by its first rejection: never accepted
    mass = jnp.where(fresh, p_tok, 0.0)
    before = jnp.cumsum(mass, axis=-1)[..., :-1]  # p of the earlier distinct sibling tokens
    before = jnp.concatenate([jnp.zeros_like(mass[..., :1]), before], axis=-1)
    left = jnp.maximum(1.0 - before, 0.0)  # the residual's mass; rounding can take 1 - sum below 0
    passes = fresh & (_gather_rows(u_accept, table) * left < p_tok)  # p_tok = 0 never passes
    first = passes & (jnp.cumsum(passes, axis=-1) == 1)
    chosen = jnp.max(jnp.where(first, table, -1), axis=-1)  # [B, N] accepted child or -1
    passed = jnp.take_along_axis(chosen, jnp.maximum(tree.parents, 0), axis=1) == jnp.arange(n)
    path, count, end = _deepest_path(tree.parents, passed, anc)
    # bonus: p at the end node with the tokens of all its (rejected) children zeroed
    rows = jnp.arange(b)
    end_tok, end_tried = tok[rows, end], tried[rows, end]  # [B, C]
    resid = jnp.exp(logp[rows, end]).at[rows[:, None], jnp.where(end_tried, end_tok, logp.shape[-1])].set(
        0.0, mode="drop")
    bonus = jax.vmap(_sample_from)(resid, u_bonus[rows, end])
    # rounding can reject the child holding all of p's remaining mass; the sequential walk then keeps
    # the residual before that rejection, whose only token is the last tried one with p > 0
    last = jnp.argmax(jnp.where(end_tried & (p_tok[rows, end] > 0), jnp.arange(c), -1), axis=1)
    bonus = jnp.where(resid.sum(-1) > 0, bonus, end_tok[rows, last])
    return path, count, bonus.astype(jnp.int32)


def _residual(resid: jax.Array, q: jax.Array) -> jax.Array:
    """After a draft from q [V] is rejected under resid [V]: normalise(max(resid - q, 0)), what the
    next sibling is tried against and the bonus is sampled from (resid itself if rounding left no
    mass). The sampling tests' wrong verifiers replace this step."""
    left = jnp.maximum(resid - q, 0.0)
    total = left.sum()
    return jnp.where(total > 0, left / jnp.maximum(total, 1e-30), resid)


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
            resid = jnp.where(accept, resid, _residual(resid, qj))
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


def _table(tree: DraftTree, max_children: int | None) -> jax.Array:
    n = tree.tokens.shape[1]
    return child_table(tree.parents, tree.valid, max_children or max(n - 1, 1))


def verify_sampling(
    tree: DraftTree,
    target_logprobs: jax.Array,
    key: jax.Array,
    max_children: int | None = None,
    anc: jax.Array | None = None,
) -> VerifyResult:
    """tree with N nodes; target_logprobs [B, N, V] of the sampling distribution (after
    temperature / top-k / top-p); key: one PRNG key per sequence [B]. max_children (static)
    bounds the siblings tried per node (default N - 1); anc [B, N, N] the tree's ancestor mask
    when the caller has it."""
    n = tree.tokens.shape[1]
    # one draw per node and use, node-major: node j's uniforms do not depend on N, so a chain
    # verifies alike in a loop of any static size (BlockPilot's per-batch block size)
    u = jax.vmap(lambda k: jax.random.uniform(k, (n, 2)))(key)
    return verify_sampling_with_uniforms(tree, target_logprobs, u[..., 0], u[..., 1], max_children, anc)


def verify_sampling_with_uniforms(tree, target_logprobs, u_accept, u_bonus, max_children=None, anc=None):
    """`verify_sampling` with explicit uniforms in [0, 1): u_accept [B, N] decides whether node j
    is accepted when tried; u_bonus [B, N] samples the bonus when the walk stops at node j.
    Deterministic drafts (draft_probs None) are verified in parallel, others by the sequential walk."""
    if tree.draft_probs is not None:
        return verify_sampling_sequential(tree, target_logprobs, u_accept, u_bonus, max_children)
    logp = target_logprobs.astype(jnp.float32)
    return _result(tree, *_parallel_sampling(tree, logp, u_accept, u_bonus, _table(tree, max_children), anc))


def verify_sampling_sequential(tree, target_logprobs, u_accept, u_bonus, max_children=None):
    """`verify_sampling_with_uniforms` by the sequential walk (nested `lax.while_loop`s over depth and
    siblings, vocabulary-wide residual updates): the verifier of trees with draft_probs, and the
    reference the parallel verifier of deterministic drafts is tested against."""
    p = jnp.exp(target_logprobs.astype(jnp.float32))
    q = None if tree.draft_probs is None else tree.draft_probs.astype(jnp.float32)
    path, count, bonus = jax.vmap(_walk)(p, q, tree.tokens, _table(tree, max_children), u_accept, u_bonus)
    return _result(tree, path, count, bonus)
