"""Step sizing: each speculative step verifies as much of its drafted tree as it is worth.

The drafter proposes its full tree of N nodes, with `DraftTree.scores`: its own estimate that each
node is accepted (a path product of draft probabilities; a drafter without scores counts every
valid node 1). Per row, the estimate is calibrated online by depth against verified outcomes
(`Calibration`): node at depth d gets p = min(1, score x (1 + realised_d) / (1 + predicted_d)),
made monotone along paths (a node never above its parent). For each size k of the loop's static
menu (1 = a one-token target step, then e.g. 2, 4, 8, ..., N nodes) the expected committed tokens
of a row are the sum of p over its best k nodes (the root counts 1: the bonus token), and the
step runs the size that maximises the batch's expected tokens per second under the step-cost
model (ms per step at each size; decoding/step_costs.py):

    k* = argmax_k  sum_rows E[tokens | k] / cost(k)

The tree is pruned to its best k* nodes (`prune`: closed under ancestors, creation order kept),
verified, and the outcome is written back in the full tree's node indices, so the drafter's
`update` sees what it would see had the whole tree been verified and the same path accepted.
Every size is one branch of a `lax.switch` in the one compiled step. Verification is exact for
any tree chosen before the target's logits of the step are seen, so the choice never changes
what is committed at T = 0 nor its distribution at T > 0.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specblock_jax.trees.tree import DraftTree, chain_parents

PRIOR = 1.0  # pseudo-count of the per-depth calibration (1 predicted, 1 realised: factor 1)
DECAY = 0.95  # per verified step: the calibration follows a request's drift


def size_menu(num_nodes: int) -> tuple[int, ...]:
    """The static sizes a step may run: 0 (no draft: a one-token target step, the drafter's
    update alone), the powers of two from 2 below num_nodes, and num_nodes (tree nodes, the root
    included). size_menu(16) = (0, 2, 4, 8, 16)."""
    sizes, k = [0], 2
    while k < num_nodes:
        sizes.append(k)
        k *= 2
    if num_nodes > 1:
        sizes.append(num_nodes)
    return tuple(sizes)


class Calibration(NamedTuple):
    """Per row, decayed sums over verified non-root nodes, by depth 1..D (index d - 1), and over
    the steps that drafted (what the draft gate reads, `skip_draft`)."""
    predicted: jax.Array  # [B, D] fp32 the raw scores of verified nodes at depth d
    realised: jax.Array  # [B, D] fp32 how many of them were accepted
    tokens: jax.Array  # [B] fp32 tokens committed by drafted steps
    cost: jax.Array  # [B] fp32 their step costs (ms)
    steps: jax.Array  # [B] fp32 how many they were

    @classmethod
    def zeros(cls, batch: int, depth: int) -> "Calibration":
        z = jnp.zeros((batch, max(depth, 1)), jnp.float32)
        r = jnp.zeros((batch,), jnp.float32)
        return cls(z, z, r, r, r)


class SizingTally(NamedTuple):
    """Per-row counts for the stats: what was chosen and what it gave."""
    chosen: jax.Array  # [B, M] int32 steps the row ran at each menu size
    accepted: jax.Array  # [B, N + 1] int32 steps at a size > 0, by the row's own accepted draft tokens
    predicted: jax.Array  # [B] fp32 the expected committed tokens of the chosen sizes, summed

    @classmethod
    def zeros(cls, batch: int, menu: int, num_nodes: int) -> "SizingTally":
        return cls(jnp.zeros((batch, menu), jnp.int32), jnp.zeros((batch, num_nodes + 1), jnp.int32),
                   jnp.zeros((batch,), jnp.float32))


def sizing_rows(loop, tally: SizingTally | None, rows) -> list[dict | None]:
    """Each of `rows`' tally as a JSON-ready dict (GenerationStats.sizing), read to the host once;
    [None] * len(rows) without step sizing."""
    if tally is None or not getattr(loop, "sizes", ()):
        return [None] * len(rows)
    chosen, accepted, predicted = (np.asarray(x)[list(rows)] for x in tally)
    return [{"sizes": list(loop.sizes), "step_ms": list(loop.step_ms), "chosen": chosen[j].tolist(),
             "accepted": accepted[j].tolist(), "predicted": round(float(predicted[j]), 4)} for j in range(len(rows))]


def summed_sizing(tallies: list[dict | None], batch_size: int) -> dict | None:
    """The rows' `GenerationStats.sizing` summed, with what the bench reports (None where a row has
    none or the rows' menus differ): "steps_share" (of row-steps at each size), "accepted_share"
    (of row-steps at a size > 0 by accepted drafts), "acceptance" (per draft position d = 1..N - 1:
    of those row-steps that accepted d - 1 drafts, the share that accepted d: the accepted
    histogram's conditional rates, a lower bound where a chosen size ends at depth d - 1),
    "predicted_tokens" / "committed_tokens" and their "calibration_error" (predicted / committed
    - 1), and "predicted_tokens_per_s": the expected tokens over the cost model's time of the chosen
    steps (row-steps / batch_size x ms at each size)."""
    if not tallies or any(t is None for t in tallies) or len({tuple(t["sizes"]) for t in tallies}) != 1:
        return None
    chosen = np.sum([t["chosen"] for t in tallies], axis=0)
    accepted = np.sum([t["accepted"] for t in tallies], axis=0)
    predicted = float(sum(t["predicted"] for t in tallies))
    committed = float(np.sum((np.arange(len(accepted)) + 1) * accepted) + chosen[0])  # + steps without a draft
    at_least = np.cumsum(accepted[::-1])[::-1]  # row-steps that accepted >= d drafts
    acceptance = [float(at_least[d] / at_least[d - 1]) if at_least[d - 1] else None for d in range(1, len(accepted))]
    step_ms = tallies[0]["step_ms"]
    cost_s = float(np.dot(chosen, step_ms)) / 1000 / batch_size if step_ms else None
    total = max(int(chosen.sum()), 1)
    return {"sizes": tallies[0]["sizes"], "step_ms": step_ms, "chosen": chosen.tolist(), "accepted": accepted.tolist(),
            "steps_share": (chosen / total).tolist(), "accepted_share": (accepted / max(int(accepted.sum()), 1)).tolist(),
            "acceptance": acceptance, "predicted_tokens": predicted, "committed_tokens": committed,
            "calibration_error": predicted / committed - 1 if committed else None,
            "predicted_tokens_per_s": predicted / cost_s if cost_s else None}


def raw_scores(tree: DraftTree) -> jax.Array:
    """[B, N] the drafter's scores (1 for every valid node when it gives none), 0 where invalid,
    the root 1."""
    s = tree.valid.astype(jnp.float32) if tree.scores is None else tree.scores.astype(jnp.float32)
    s = jnp.where(tree.valid, jnp.clip(s, 0.0, 1.0), 0.0)
    return s.at[:, 0].set(1.0)


def calibrated(raw: jax.Array, depth: jax.Array, anc: jax.Array, cal: Calibration) -> jax.Array:
    """raw [B, N] scores, depth [B, N] (root 0), anc [B, N, N] the ancestor mask -> [B, N] p: the
    acceptance estimate, scaled per depth by the row's calibration, capped at 1 and never above
    any ancestor's."""
    factor = (PRIOR + cal.realised) / (PRIOR + cal.predicted)  # [B, D]
    d = jnp.clip(depth - 1, 0, factor.shape[1] - 1)
    p = jnp.where(depth > 0, jnp.minimum(raw * jnp.take_along_axis(factor, d, axis=1), 1.0), 1.0)
    return jnp.min(jnp.where(anc, p[:, None, :], 1.0), axis=-1)


def expected_tokens(p: jax.Array, sizes: tuple[int, ...]) -> jax.Array:
    """p [B, N] acceptance estimates (root 1) -> [B, M] expected committed tokens at each size:
    the sum of the k largest (the best k-node subtree: p never exceeds an ancestor's; size 0
    commits the root's bonus alone: 1)."""
    best = jnp.cumsum(-jnp.sort(-p, axis=1), axis=1)  # [B, N]
    return best[:, jnp.maximum(jnp.asarray(sizes), 1) - 1]


def skip_draft(cal: Calibration, active: jax.Array, step_ms: jax.Array, prior_tokens: float) -> jax.Array:
    """[] bool: whether the batch skips drafting this step (size 0): when the drafted steps of its
    active rows gave fewer committed tokens per ms than a step without a draft costs, pooled over
    the rows (tokens / cost of each row's recent drafted steps, with one optimistic prior step of
    `prior_tokens` (the loop gives N: every node accepted) at the largest size's cost). Skipped
    steps decay the evidence towards that prior, so a row drafts again after a while (its
    exploration)."""
    tokens = (prior_tokens + cal.tokens) / (1.0 + cal.steps)
    cost = (step_ms[-1] + cal.cost) / (1.0 + cal.steps)
    drafted = jnp.sum(jnp.where(active, tokens, 0.0)) / jnp.maximum(jnp.sum(jnp.where(active, cost, 0.0)), 1e-9)
    return drafted * step_ms[0] < 1.0


def draft_floor(step_ms: jax.Array, levels: int) -> jax.Array:
    """[] the path probability below which drafting one level deeper does not pay: a level's
    drafter forward (the propose part of the smallest drafted step over the plain step, shared by
    `levels` levels) over the ms a plain step takes per committed token (`DraftContext.floor`)."""
    if step_ms.shape[0] < 2:
        return jnp.float32(0.0)
    per_level = jnp.maximum(step_ms[1] - step_ms[0], 0.0) / max(levels, 1)
    return jnp.clip(per_level / step_ms[0], 0.0, 1.0)


def choose(expected: jax.Array, active: jax.Array, step_ms: jax.Array) -> jax.Array:
    """expected [B, M], active [B], step_ms [M] -> [] int32 the menu index with the most expected
    tokens per ms over the active rows (ties: the smaller size)."""
    total = jnp.sum(jnp.where(active[:, None], expected, 0.0), axis=0)
    return jnp.argmax(total / step_ms).astype(jnp.int32)


def prune(tree: DraftTree, p: jax.Array, k: int) -> tuple[DraftTree, jax.Array]:
    """The best k nodes of each row's tree by p (ties: the lower index, so with p never above an
    ancestor's, every kept node's ancestors are kept), in creation order, as a k-node tree, and
    sel [B, k] int32: each kept node's index in `tree`. A kept node whose parent was not kept
    (only possible among p = 0 ties) is marked invalid under the root."""
    b, n = tree.tokens.shape
    k = max(k, 1)  # size 0 verifies the root alone
    if k >= n:
        return tree, jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
    sel = jnp.sort(jnp.argsort(-p, axis=1, stable=True)[:, :k], axis=1).astype(jnp.int32)  # root first
    to_node = jnp.full((b, n), -1, jnp.int32).at[jnp.arange(b)[:, None], sel].set(jnp.arange(k, dtype=jnp.int32))
    par = jnp.take_along_axis(tree.parents, sel, axis=1)
    new_par = jnp.take_along_axis(to_node, jnp.maximum(par, 0), axis=1)
    orphan = (par >= 0) & (new_par < 0)
    parents = jnp.where(par < 0, -1, jnp.where(orphan, 0, new_par)).at[:, 0].set(-1)
    take = lambda x: None if x is None else jnp.take_along_axis(  # noqa: E731
        x, sel.reshape(sel.shape + (1,) * (x.ndim - 2)), axis=1)
    valid = take(tree.valid) & ~orphan
    return DraftTree(take(tree.tokens), parents, valid, take(tree.draft_probs), take(tree.scores)), sel


def root_only(shape: DraftTree, root: jax.Array) -> DraftTree:
    """A tree of `shape`'s shapes (a jax.eval_shape of the drafter's proposal) with the root alone
    valid: what a step that skips drafting verifies."""
    b, n = shape.tokens.shape
    zeros = lambda x: None if x is None else jnp.zeros(x.shape, x.dtype)  # noqa: E731
    parents = chain_parents(b, n)
    valid = jnp.zeros((b, n), bool).at[:, 0].set(True)
    scores = None if shape.scores is None else jnp.zeros(shape.scores.shape, shape.scores.dtype).at[:, 0].set(1)
    tokens = jnp.zeros((b, n), shape.tokens.dtype).at[:, 0].set(root.astype(shape.tokens.dtype))
    return DraftTree(tokens, parents.astype(shape.parents.dtype), valid, zeros(shape.draft_probs), scores)


def to_full(x: jax.Array, sel: jax.Array, n: int, fill) -> jax.Array:
    """x [B, k, ...] of a pruned tree's nodes -> [B, n, ...] at their full-tree indices sel [B, k],
    `fill` elsewhere."""
    b, k = sel.shape
    if k == n:
        return x
    out = jnp.full((b, n) + x.shape[2:], fill, x.dtype)
    return out.at[jnp.arange(b)[:, None], sel].set(x)


def recalibrate(cal: Calibration, raw: jax.Array, depth: jax.Array, verified: jax.Array, accepted: jax.Array,
                active: jax.Array, drafted: jax.Array, committed: jax.Array, cost: jax.Array) -> Calibration:
    """The calibration after a step: raw, depth [B, N] of the full tree; verified [B, N] the valid
    non-root nodes the step verified; accepted [B, N] those on the accepted path; drafted []
    whether the step drafted, committed [B] its tokens per row, cost [] its ms. Rows not active
    keep theirs; a step without a draft only decays the drafted steps' sums."""
    d = cal.predicted.shape[1]
    onehot = jax.nn.one_hot(jnp.clip(depth - 1, 0, d - 1), d, dtype=jnp.float32)  # [B, N, D]
    seen = verified & (depth > 0)
    pred = jnp.einsum("bn,bnd->bd", jnp.where(seen, raw, 0.0), onehot)
    real = jnp.einsum("bn,bnd->bd", (seen & accepted).astype(jnp.float32), onehot)
    keep = ~active[:, None]
    on = drafted.astype(jnp.float32)

    def mix(old, new):
        return jnp.where(active, DECAY * old + on * new, old)
    return Calibration(jnp.where(keep, cal.predicted, DECAY * cal.predicted + pred),
                       jnp.where(keep, cal.realised, DECAY * cal.realised + real),
                       mix(cal.tokens, committed.astype(jnp.float32)), mix(cal.cost, cost), mix(cal.steps, 1.0))
