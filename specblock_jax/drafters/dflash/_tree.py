"""DFlash draft trees: many continuations from one block forward, verified as one static tree.

One DFlash forward gives a distribution q_d per block offset d = 1..D (D = block_size - 1), each
conditioned on the root alone (the other block inputs are mask tokens). The drafter's estimate of a
continuation x_1..x_d is therefore the product q_1(x_1) ... q_d(x_d), and every depth-(d - 1) node
has the same candidate children: the top-c tokens of q_d. A node is a prefix of per-offset
candidates, scored by that product; the tree is the best num_nodes - 1 prefixes (DDTree, arXiv
2604.12989), and `DraftTree.scores` holds the products (root 1).

Best-first with static shapes, exactly: a prefix never outscores its parent (each factor is <= 1),
so the best M = num_nodes - 1 prefixes are closed under ancestors, and their depth-d members are
the best depth-d prefixes, every one a child of a best depth-(d - 1) prefix. A beam that keeps the
best min(M, c^d) prefixes of each depth (the top of the previous beam's children) therefore holds
every node of the answer; `select_tree` takes the best M of the D beams (ties to the shallower
entry, so a parent always comes with its child).

Example: c = 2, num_nodes = 5, q_1 = {a: .6, b: .3}, q_2 = {c: .5, d: .4}. Prefixes by product:
a .6, b .3, ac .3, ad .24, bc .15, ...; the tree keeps a, b, ac, ad:
    tokens = [root, a, b, c, d]   parents = [-1, 0, 0, 1, 1]   scores = [1, .6, .3, .3, .24]
With c = 1 the lattice is one path: the tree is today's chain of argmax drafts.

Verification is trees/verify.py's, unchanged, and exact for these trees:
- greedy: the deepest path whose every token is the target's argmax after its parent, then the
  argmax after it: token-identical to target-only decoding for any tree.
- sampling: the tree's tokens are a deterministic function of the committed context (top-c, no
  random draw), so they are deterministic drafts (draft_probs None, q one-hot). At a node with
  target distribution p, its children x_1..x_k (distinct tokens: the top of one distribution) are
  tried in order; x_i is accepted with probability p_i(x_i), where p_i is p with x_1..x_{i-1}
  zeroed and renormalised; if all are rejected the bonus is drawn from p_{k+1}. Then
  P(commit x_i) = prod_{j<i} (1 - p_j(x_j)) * p_i(x_i) = p(x_i), and any other token y is committed
  with probability (1 - sum_i p(x_i)) * p(y) / (1 - sum_i p(x_i)) = p(y): the committed token
  follows p whatever the set of children, and by induction along the accepted path (each node's
  target distribution is computed on its own prefix by the tree forward) so does every token of
  the step. What would be biased is min(1, p(x) / q(x)) with the draft probabilities q of tokens
  *selected* by top-k: multi-draft rejection sampling with q is exact only for children drawn
  i.i.d. from q, which top-k children are not. Sampled drafts (`draft_mode` "sample", or "auto"
  once a sequence samples) therefore stay a chain drawn from q (`sampled_chain`), verified with q.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specblock_jax.trees.tree import DraftTree, chain_parents, select_tree


def lattice_size(candidates: int, depth: int, cap: int) -> int:
    """Non-root prefixes of up to `depth` offsets with `candidates` per offset, counted up to `cap`."""
    total, level = 0, 1
    for _ in range(depth):
        level *= candidates
        total += level
        if total >= cap:
            return cap
    return total


def best_prefixes(root: jax.Array, logp: jax.Array, ok: jax.Array, num_nodes: int, candidates: int) -> DraftTree:
    """The best num_nodes - 1 prefixes of per-offset top-`candidates` tokens, as a DraftTree.

    root [B] int32; logp [B, D, V] fp32 log q_d per block offset d = 1..D; ok [B, D] bool: offsets a
    sequence may draft (its own block size; prefixes through another offset are invalid). Returns
    tokens/parents/valid/scores [B, num_nodes] (draft_probs None: deterministic drafts).
    """
    b, depth, _ = logp.shape
    m = num_nodes - 1
    c = min(candidates, m, logp.shape[-1])
    # [B, D, c], best first; ties to the lower token id. The barrier keeps XLA:CPU from sorting the
    # vocabulary again for each offset the beam reads (7 sorts: 11 ms a chain at the embedded DFlash)
    top, tok = jax.lax.optimization_barrier(jax.lax.top_k(logp, c))
    top = jnp.where(ok[:, :, None], top, -jnp.inf)
    tokens, parents, scores = [], [], []
    beam = jnp.zeros((b, 1), logp.dtype)  # the root's log score
    beam_index = jnp.full((b, 1), -1, jnp.int32)  # each beam entry's candidate index (-1: the root)
    start = 0
    for d in range(min(depth, m)):
        child = (beam[:, :, None] + top[:, d, None, :]).reshape(b, -1)  # [B, w * c]
        width = min(m, child.shape[1])
        best, flat = jax.lax.top_k(child, width)
        tokens.append(jnp.take_along_axis(tok[:, d], flat % c, axis=1))
        parents.append(jnp.take_along_axis(beam_index, flat // c, axis=1))
        scores.append(best)
        beam = best
        beam_index = jnp.broadcast_to(start + jnp.arange(width, dtype=jnp.int32), (b, width))
        start += width
    cat = lambda xs: jnp.concatenate(xs, axis=1)  # noqa: E731
    return select_tree(root, cat(tokens), cat(parents), cat(scores), num_nodes)


def sampled_chain(root: jax.Array, drawn: jax.Array, q: jax.Array, ok: jax.Array, num_nodes: int) -> DraftTree:
    """The chain of sampled drafts in a tree of num_nodes nodes: root [B], drawn [B, D] tokens
    sampled from q [B, D, V], ok [B, D]. Nodes 1..L-1 (L = min(num_nodes, D + 1)) are offsets
    1..L-1, the rest invalid; draft_probs is q (root and padding rows 0), scores the cumulative
    product of q at the drawn tokens."""
    b, depth, v = q.shape
    n = num_nodes
    length = min(n, depth + 1) - 1
    pad = n - 1 - length
    tokens = jnp.concatenate([root[:, None], drawn[:, :length], jnp.zeros((b, pad), jnp.int32)], axis=1)
    valid = jnp.concatenate([jnp.ones((b, 1), bool), ok[:, :length], jnp.zeros((b, pad), bool)], axis=1)
    valid = jnp.cumprod(valid, axis=1).astype(bool)  # a node is reachable only through its parent
    probs = jnp.concatenate([jnp.zeros((b, 1, v), q.dtype), q[:, :length], jnp.zeros((b, pad, v), q.dtype)],
                            axis=1)
    p_tok = jnp.take_along_axis(probs, tokens[:, :, None], axis=2)[..., 0].at[:, 0].set(1.0)
    scores = jnp.where(valid, jnp.cumprod(p_tok, axis=1), 0.0).astype(jnp.float32)
    return DraftTree(tokens.astype(jnp.int32), chain_parents(b, n), valid, probs, scores)
