"""EAGLE-2 dynamic draft trees: top-k expansion by cumulative log-probability, then rerank.

1. The root's top-k tokens are the first frontier (depth 1), scored by their log-prob.
2. For each further depth, the drafter is run once on the k frontier nodes; each proposes its own
   top-k children, scored parent score + child log-prob; the global top-k of those k*k become the
   next frontier. Every frontier node is a candidate: M = k * depth candidates in all.
3. All candidates are reranked by score and the best N - 1 become the tree (node 0 is the root).
   A child never outscores its parent (log-probs <= 0; ties go to the lower index, i.e. the parent),
   so the selection always contains every selected node's ancestors.
Candidate m is expanded at depth(m) and may keep drafter state in slot m (see `Expander`).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from specblock_jax.trees.tree import DraftTree, select_tree

# expander(carry, tokens [B, k], parent_index [B, k] (candidate index, -1 = root),
#          node_index [B, k] (candidate index of each frontier node), ancestors [B, k, M] bool
#          (candidates that are the node or its ancestors), depth: int)
#   -> (carry, logprobs [B, k, V]) : the drafter's next-token log-probs after each frontier node.
Expander = Callable[[Any, jax.Array, jax.Array, jax.Array, jax.Array, int], tuple[Any, jax.Array]]


def build_topk_tree(root: jax.Array, root_logprobs: jax.Array, expander: Expander, carry: Any,
                    top_k: int, depth: int, num_nodes: int, token_map: jax.Array | None = None,
                    floor: jax.Array | None = None) -> tuple[DraftTree, Any]:
    """root [B] token, root_logprobs [B, V'] -> (DraftTree with num_nodes nodes, final carry).
    token_map [V'] (a reduced draft vocabulary's d2t) maps the drafter's ids to target ids; the
    tree and the expander see target ids only. floor [] (step sizing's, `DraftContext.floor`):
    a level is expanded only while some frontier node of the batch has a path probability above
    it (`lax.cond`: a level not expanded costs no drafter forward; its candidates stay invalid)."""
    b = root.shape[0]
    m = top_k * depth
    ids = (lambda x: x) if token_map is None else (lambda x: jnp.take(token_map, x))  # noqa: E731
    score, tok = jax.lax.top_k(root_logprobs, top_k)  # [B, k]
    tok = ids(tok)
    tokens = jnp.zeros((b, m), jnp.int32).at[:, :top_k].set(tok.astype(jnp.int32))
    scores = jnp.full((b, m), -jnp.inf).at[:, :top_k].set(score)
    parents = jnp.full((b, m), -1, jnp.int32)
    eye = jnp.eye(m, dtype=bool)
    anc = jnp.zeros((b, m, m), bool).at[:, :top_k].set(eye[:top_k])
    frontier = jnp.broadcast_to(jnp.arange(top_k, dtype=jnp.int32), (b, top_k))
    for d in range(1, depth):
        f_tok = jnp.take_along_axis(tokens, frontier, axis=1)
        f_par = jnp.take_along_axis(parents, frontier, axis=1)
        f_anc = jnp.take_along_axis(anc, frontier[:, :, None], axis=1)  # [B, k, M]
        if floor is None:
            carry, logp = expander(carry, f_tok, f_par, frontier, f_anc, d)
        else:
            def expand(carry=carry, f_tok=f_tok, f_par=f_par, frontier=frontier, f_anc=f_anc, d=d):
                return expander(carry, f_tok, f_par, frontier, f_anc, d)
            out = jax.eval_shape(expand)[1]
            go = jnp.max(jnp.take_along_axis(scores, frontier, axis=1)) > jnp.log(floor)
            carry, logp = jax.lax.cond(go, expand, lambda carry=carry: (carry, jnp.full(out.shape, -jnp.inf, out.dtype)))
        child_score, child_tok = jax.lax.top_k(logp, top_k)  # [B, k, k]
        child_tok = ids(child_tok)
        total = jnp.take_along_axis(scores, frontier, axis=1)[:, :, None] + child_score
        best, flat = jax.lax.top_k(total.reshape(b, -1), top_k)  # global top-k of k*k
        new = d * top_k + jnp.arange(top_k, dtype=jnp.int32)  # candidate slots of depth d + 1
        par = jnp.take_along_axis(frontier, flat // top_k, axis=1)
        tokens = tokens.at[:, new].set(jnp.take_along_axis(child_tok.reshape(b, -1), flat, axis=1))
        scores = scores.at[:, new].set(best)
        parents = parents.at[:, new].set(par)
        anc = anc.at[:, new].set(jnp.take_along_axis(anc, par[:, :, None], axis=1) | eye[new][None])
        frontier = jnp.broadcast_to(new, (b, top_k))
    return select_tree(root, tokens, parents, scores, num_nodes), carry
