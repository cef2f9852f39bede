"""SpecBlock draft trees: blocks of K chained greedy tokens, branched where the rank head doubts.

A block is one drafter forward from a leaf X: K slots whose greedy tokens form a chain under X
(slot k sits at depth depth(X) + 1 + k); the whole chain is a candidate. The rank head predicts,
per slot, the class of the target token's rank in that slot's draft distribution: 0 = rank 1,
1 = ranks 2-4, 2 = ranks 5-10, 3 = beyond (give up). From those classes (when `rank_tree`), as the
public SpecBlock code builds its trees (`RANK_SLOT_TOPK`, benchmarks_hf/algorithms/_specblock_base.py):
  - slot k drafts its `slot_topk[class]` best tokens, the chain token included (so a confident
    slot keeps one alternative: (2, 4, 10, 0)); slot 0 of the first block drafts `root_topk`;
  - a give-up class whose top-k is 0 stops the alternatives from that slot on (in the first block
    from slot 1 on: slot 0 always drafts root_topk); the chain itself stays a candidate;
  - the next block continues from the deepest confident slot: M = the first slot whose class is
    not 0, plus one unless that class is give-up (M = K when every slot is confident); the
    `beam` best of the chain node at slot M - 1 and its alternatives become the next level's
    leaves (none when M = 0), drafted together in one batched forward. (The public code drafts
    a next block from every slot that branches and every alternative, all at once, then prunes
    the tree; with a static beam of a few leaves its choice by score would always restart from
    slot 0 and repeat the chain, so the rank walk's M picks the leaves here.)
Without the rank head (`rank_tree=False`) every slot gets `fixed_branch` alternatives, nothing
gives up and the next block continues from the last slot.

All candidates are scored by cumulative draft log-prob; a later block's token that repeats a
sibling from an earlier block (same parent, same token) is merged into it (its children move to the
twin, which keeps the better score); the best N - 1 form the tree (`select_tree`). Shapes are
static: per level `beam` blocks (one at level 1) of K * (1 + W) candidates, W = the widest branch.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from specblock_jax.trees.tree import DraftTree, select_tree

GIVE_UP = 3
RANK_EDGES = (1, 4, 10)  # rank < 1 -> class 0, < 4 -> 1, < 10 -> 2, else 3 (0-based ranks)


class TopTokens(NamedTuple):
    """A slot's best draft tokens, best first: logp [..., R] log-probs, ids [..., R] draft ids."""
    logp: jax.Array
    ids: jax.Array


def top_tokens(logp: jax.Array, r: int) -> TopTokens:
    """[..., V] log-probs -> the top min(r, V) (one `top_k` pass; ties -> the lower id)."""
    return TopTokens(*jax.lax.top_k(logp, min(r, logp.shape[-1])))


def rank_class(rank: jax.Array) -> jax.Array:
    """0-based rank of the target token in the draft distribution -> class 0..3."""
    return sum((rank >= e).astype(jnp.int32) for e in RANK_EDGES)


@dataclasses.dataclass(frozen=True)
class RankTreeSettings:
    num_nodes: int = 16
    max_blocks: int = 2  # blocks along a path (levels); level 1 comes with the verifier update
    beam: int = 1  # leaves drafted from at each later level
    slot_topk: tuple[int, ...] = (2, 4, 10, 0)  # tokens drafted per predicted class, chain token included
    root_topk: int = 4  # tokens drafted at slot 0 of the first block
    rank_tree: bool = True
    fixed_branch: int = 2  # alternatives per slot without the rank head

    def __post_init__(self):
        if len(self.slot_topk) != GIVE_UP + 1 or min(self.slot_topk[:GIVE_UP]) < 1 or self.slot_topk[GIVE_UP] < 0:
            raise ValueError(f"slot_topk must be {GIVE_UP + 1} counts (>= 1, the give-up class's >= 0), "
                             f"got {self.slot_topk}")
        if self.root_topk < 1:
            raise ValueError(f"root_topk must be >= 1, got {self.root_topk}")

    @property
    def width(self) -> int:
        """The most alternatives a slot can get."""
        return max(max(self.slot_topk), self.root_topk) - 1 if self.rank_tree else self.fixed_branch

    @property
    def candidates(self) -> int:
        """Tokens per slot a level reads (the chain token and the widest branch)."""
        return 1 + self.width

    @property
    def max_children(self) -> int:
        # a node's children: the next slot of its own block (+ alternatives) and the first slot
        # of a block drafted from it (+ alternatives)
        return min(self.num_nodes - 1, 2 * (1 + self.width))


class Level:
    """Candidates of one level: arrays [B, P, K, 1 + W] flattened to [B, P*K*(1+W)] on demand."""

    def __init__(self, tokens, scores, valid, parents, cont_slot):
        self.tokens, self.scores, self.valid, self.parents = tokens, scores, valid, parents
        self.cont_slot = cont_slot  # [B, P] slot the next block continues from (-1 = none)


def _level(s: RankTreeSettings, top: TopTokens, cls, parent, parent_score, alive, offset: int, first: bool,
           token_map=None):
    """top: [B, P, K, R] best tokens per slot (R >= 1 + width, or the whole draft vocabulary),
    cls [B, P, K]; parent [B, P] candidate index (-1 = root), parent_score [B, P], alive [B, P]
    bool; offset: index of this level's first candidate; token_map [V'] maps draft ids to target ids
    (a reduced draft vocabulary's d2t)."""
    b, p, k, r_all = top.logp.shape
    w = min(s.width, r_all - 1)
    lp, tok = top.logp[..., :1 + w].astype(jnp.float32), top.ids[..., :1 + w]  # [B, P, K, 1 + W]
    if token_map is not None:
        tok = jnp.take(token_map, tok)
    slot = jnp.arange(k)
    if s.rank_tree:
        width = jnp.maximum(jnp.asarray(s.slot_topk, jnp.int32)[cls] - 1, 0)  # alternatives per slot
        giveup = (cls == GIVE_UP) & (s.slot_topk[GIVE_UP] == 0)
        if first:  # slot 0 of the first block always drafts root_topk
            giveup = giveup.at[:, :, 0].set(False)
            width = width.at[:, :, 0].set(s.root_topk - 1)
        no_alt = jnp.cumsum(giveup, axis=-1) > 0  # at or after a give-up: no alternatives
        width = jnp.where(no_alt, 0, width)
        doubt = cls != 0
        j = jnp.argmax(doubt, axis=-1)  # first doubtful slot
        cls_j = jnp.take_along_axis(cls, j[..., None], axis=-1)[..., 0]
        m = jnp.where(jnp.any(doubt, axis=-1), j + (cls_j != GIVE_UP), k)
    else:
        width = jnp.full((b, p, k), s.fixed_branch, jnp.int32)
        m = jnp.full((b, p), k, jnp.int32)
    chain = parent_score[..., None] + jnp.cumsum(lp[..., 0], axis=-1)  # [B, P, K]
    before = jnp.concatenate([parent_score[..., None], chain[..., :-1]], axis=-1)
    r = jnp.arange(1 + w)
    valid = alive[:, :, None, None] & (r <= width[..., None])  # the chain (r = 0) always
    scores = jnp.where(valid, before[..., None] + lp, -jnp.inf)
    scores = scores.at[..., 0].set(jnp.where(valid[..., 0], chain, -jnp.inf))
    chain_idx = offset + ((jnp.arange(p)[:, None] * k + slot[None, :]) * (1 + w))  # [P, K]
    prev = jnp.concatenate([jnp.broadcast_to(parent[:, :, None], (b, p, 1)),
                            jnp.broadcast_to(chain_idx[None, :, :-1], (b, p, k - 1))], axis=-1)
    parents = jnp.broadcast_to(prev[..., None], (b, p, k, 1 + w))
    cont = jnp.where(alive & (m > 0), m - 1, -1)
    return Level(tok.astype(jnp.int32), scores, valid, parents.astype(jnp.int32), cont)


def _flat(x):
    return x.reshape(x.shape[0], -1)


def _leaves(s: RankTreeSettings, lv: Level, offset: int):
    """The `beam` best candidates among each block's continuation slot: (index [B, beam] absolute,
    block [B, beam], slot [B, beam], token, score, alive)."""
    b, p, k, r = lv.tokens.shape
    slot = jnp.maximum(lv.cont_slot, 0)  # [B, P]
    pick = lambda x: jnp.take_along_axis(x, slot[:, :, None, None], axis=2)[:, :, 0]  # noqa: E731
    sc = jnp.where(lv.cont_slot[..., None] >= 0, pick(lv.scores), -jnp.inf)  # [B, P, R]
    beam = min(s.beam, p * r)
    best, flat = jax.lax.top_k(sc.reshape(b, -1), beam)
    blk, alt = flat // r, flat % r
    slot_of = jnp.take_along_axis(slot, blk, axis=1)
    index = offset + (blk * k + slot_of) * r + alt
    token = jnp.take_along_axis(pick(lv.tokens).reshape(b, -1), flat, axis=1)
    return index, blk, slot_of, token, best, jnp.isfinite(best)


# expand(carry, leaf_block [B, P], leaf_slot [B, P], leaf_token [B, P], level: int)
#   -> (carry, TopTokens [B, P, K, R], cls [B, P, K]): one drafter forward of a block from each leaf.
Expand = Callable[[Any, jax.Array, jax.Array, jax.Array, int], tuple[Any, TopTokens, jax.Array]]


def _merge_twins(tokens, parents, scores, passes: int):
    """Merges a candidate into an earlier sibling with the same token (children re-parented,
    the twin keeps the better score, the duplicate is dropped)."""
    b, m = tokens.shape
    idx = jnp.arange(m)
    for _ in range(passes):
        live = jnp.isfinite(scores)
        same = ((parents[:, :, None] == parents[:, None, :]) & (tokens[:, :, None] == tokens[:, None, :])
                & live[:, :, None] & live[:, None, :] & (idx[None, :] < idx[:, None])[None])
        dup = jnp.any(same, axis=-1)  # [B, M]
        twin = jnp.argmax(same, axis=-1)  # the first earlier twin
        best = jnp.where(dup, jnp.maximum(scores, jnp.take_along_axis(scores, twin, axis=1)), -jnp.inf)
        gain = jnp.full((b, m), -jnp.inf).at[jnp.arange(b)[:, None], jnp.where(dup, twin, m)].max(
            best, mode="drop")
        scores = jnp.where(dup, -jnp.inf, jnp.maximum(scores, gain))
        moved = jnp.take_along_axis(dup, jnp.maximum(parents, 0), axis=1) & (parents >= 0)
        parents = jnp.where(moved, jnp.take_along_axis(twin, jnp.maximum(parents, 0), axis=1), parents)
    return parents, scores


def build_rank_tree(s: RankTreeSettings, root: jax.Array, top: TopTokens, cls: jax.Array,
                    expand: Expand, carry: Any, token_map: jax.Array | None = None,
                    floor: jax.Array | None = None) -> tuple[DraftTree, Any]:
    """root [B]; top [B, K, R] (`top_tokens`, R >= s.candidates) and cls [B, K] of the first
    block (drafted from the root);
    token_map [V'] (a reduced draft vocabulary's d2t) maps draft ids to target ids: the tree and
    `expand` see target ids only. floor [] (step sizing's, `DraftContext.floor`): a later block
    is drafted only while some leaf of the batch has a path probability above it (`lax.cond`:
    a block not drafted costs no drafter forward; its candidates stay invalid)."""
    b = root.shape[0]
    zero = jnp.zeros((b, 1))
    block1 = TopTokens(top.logp[:, None], top.ids[:, None])
    levels = [_level(s, block1, cls[:, None], jnp.full((b, 1), -1, jnp.int32), zero,
                     jnp.ones((b, 1), bool), 0, True, token_map)]
    offset = _flat(levels[0].tokens).shape[1]
    start = 0
    for d in range(2, s.max_blocks + 1):
        index, blk, slot, token, score, alive = _leaves(s, levels[-1], start)
        if floor is None:
            carry, top_d, c = expand(carry, blk, slot, token, d)
        else:
            def block(carry=carry, blk=blk, slot=slot, token=token, d=d):
                return expand(carry, blk, slot, token, d)
            shape = jax.eval_shape(block)

            def skip(carry=carry, shape=shape):
                top_s, c_s = shape[1], shape[2]
                # the carry keeps what it had; parts a block would have grown (a later level's leaf
                # data, read only by later blocks, which a skipped level skips too) become zeros
                kept = jax.tree.map(lambda x, t: x if x.shape == t.shape and x.dtype == t.dtype
                                    else jnp.zeros(t.shape, t.dtype), carry, shape[0])
                return (kept, TopTokens(jnp.full(top_s.logp.shape, -jnp.inf, top_s.logp.dtype),
                                         jnp.zeros(top_s.ids.shape, top_s.ids.dtype)),
                        jnp.zeros(c_s.shape, c_s.dtype))
            go = jnp.max(jnp.where(alive, score, -jnp.inf)) > jnp.log(floor)
            carry, top_d, c = jax.lax.cond(go, block, skip)
            alive = alive & go
        levels.append(_level(s, top_d, c, index, score, alive, offset, False, token_map))
        start = offset
        offset += _flat(levels[-1].tokens).shape[1]
    tokens = jnp.concatenate([_flat(lv.tokens) for lv in levels], axis=1)
    parents = jnp.concatenate([_flat(lv.parents) for lv in levels], axis=1)
    scores = jnp.concatenate([_flat(lv.scores) for lv in levels], axis=1)
    parents, scores = _merge_twins(tokens, parents, scores, s.max_blocks - 1)
    return select_tree(root, tokens, parents, scores, s.num_nodes), carry
