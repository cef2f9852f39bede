"""SpecBlock drafter: block-iterative drafting with a layer-wise shift and a rank head.

Alignment (as EAGLE-3's): drafter position i reads the pair (condition c_i, token x_{i+1}); its K
slots predict x_{i+2}, ..., x_{i+1+K} in one forward. Slot k of position i has RoPE position
i + 1 + k and input
    fuse([norm(c_i); norm(embed(x_{i+1})); norm(query_k)])          (Linear 3H -> H)
where c_i = fc(target features at `feature_layers`) for committed tokens, or the drafter's own
hidden of the slot that predicted x_{i+1} for a later block. Entries are laid out flat,
e = i * K + k, and the query of entry e sees every entry e' <= e: all slots of earlier positions and
slots <= k of its own. Example, two positions, K = 2 (rows: queries, columns: keys):
    1 0 0 0
    1 1 0 0
    1 1 1 0
    1 1 1 1
Layer-wise shift: before every layer l >= 1, h_k <- W_l [h_k; h_{k-1}] (slot 0: W_l [h_0; h_0]),
W_l initialised to [I; 0]. Logits = lm_head(norm(h)). The rank head reads [stop_gradient(norm(h));
15 features of the top-20 logits] and predicts the class of the target token's rank (see
trees/rank_tree.py).

Decoding: the drafter's KV cache holds K entries per committed pair (e = i * K + k) plus scratch
for the later blocks of the tree. `update` runs the first block of the next tree for free: the
forward over the newly committed pairs also gives the K slots after the last one. Only those K
slots' hidden is used (by `update` and by `init_state`'s prompt pass), so the last layer writes
every entry's K/V but runs attention and its MLP for those slots only (`SpecBlockModel.block`'s
`group`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from specblock_jax.drafters.base import DraftContext, Prefill
from specblock_jax.drafters.common import TargetWidths, load_model, switch_on_rows
from specblock_jax.models.config import ModelConfig
from specblock_jax.models.layers import DecoderLayer, RMSNorm, normal_param, rope_cos_sin
from specblock_jax.drafters.specblock._rank_tree import RankTreeSettings, TopTokens, build_rank_tree

RANK_CLASSES = 4
RANK_FEATURES = 15
RANK_TOP = 20  # the rank head's features read the top 20 logits


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpecBlockConfig(TargetWidths):
    """The target's widths (`SpecBlockConfig.for_target(cfg, num_layers=...)`) and the drafter's own
    shape."""

    num_layers: int = 2
    block_size: int = 4  # K slots per block
    layer_shift: bool = True
    rank_hidden: int = 256
    rank_top1: str = "vocab"  # the rank feature "top-1 probability" over the "vocab" or the "top20"
    #                           logits (the public code's, drafters/specblock/_released.py)

    def __post_init__(self):
        if self.rank_top1 not in ("vocab", "top20"):
            raise ValueError(f"rank_top1 must be 'vocab' or 'top20', got {self.rank_top1!r}")

    def layer_config(self) -> ModelConfig:
        return ModelConfig("llama", self.vocab_size, self.hidden_size, self.intermediate_size,
                           self.num_layers, self.num_heads, self.num_kv_heads, self.head_dim,
                           self.rms_norm_eps, self.rope, dtype=self.dtype)


def layer_shift(h: jax.Array, w: jax.Array) -> jax.Array:
    """h [..., K, H], w [2H, H] -> W [h_k; h_{k-1}] per slot, slot 0 paired with itself."""
    prev = jnp.concatenate([h[..., :1, :], h[..., :-1, :]], axis=-2)
    return jnp.concatenate([h, prev], axis=-1) @ w


def block_mask(num_positions: int, k: int) -> jax.Array:
    """[T*K, T*K] bool: entry e = i*K + k sees e' <= e (earlier positions, own slots <= k)."""
    e = jnp.arange(num_positions * k)
    return e[None, :] <= e[:, None]


def top_logits(logits: jax.Array, r: int = RANK_TOP) -> tuple[jax.Array, jax.Array, jax.Array]:
    """[..., V] logits -> (the top min(r, V) fp32 logits and their ids, best first; logsumexp
    [..., 1]): the one vocabulary-wide pass both the rank head and the tree read."""
    logits = logits.astype(jnp.float32)
    # the barrier stops XLA:CPU from rewriting top_k + slices into a 60x slower computation
    top, ids = jax.lax.optimization_barrier(jax.lax.top_k(logits, min(r, logits.shape[-1])))
    return top, ids, jax.nn.logsumexp(logits, axis=-1, keepdims=True)


def rank_features(top: jax.Array, lse: jax.Array) -> jax.Array:
    """top [..., R] logits, best first (R >= 20, or the whole vocabulary), lse [..., 1] their
    logsumexp over the vocabulary (or over the top 20: `SpecBlockConfig.rank_top1`) -> [..., 15]:
    top-10 log-probs normalised over the top 20, the gaps logit1-logit2, logit1-logit3,
    logit1-logit5, the top-1 probability (over what `lse` sums), the top-20 entropy."""
    top = top[..., :RANK_TOP]
    if top.shape[-1] < RANK_TOP:  # tiny vocabularies: pad with far less likely tokens
        pad = top.shape[:-1] + (RANK_TOP - top.shape[-1],)
        top = jnp.concatenate([top, jnp.broadcast_to(top[..., -1:] - 30.0, pad)], -1)
    lp = jax.nn.log_softmax(top, axis=-1)
    gaps = top[..., :1] - jnp.concatenate([top[..., 1:3], top[..., 4:5]], axis=-1)
    p1 = jnp.exp(top[..., :1] - lse)
    entropy = -jnp.sum(jnp.exp(lp) * lp, axis=-1, keepdims=True)
    return jnp.concatenate([lp[..., :10], gaps, p1, entropy], axis=-1)


class SpecBlockModel(nnx.Module):
    def __init__(self, c: SpecBlockConfig, rngs: nnx.Rngs):
        self.c = c
        dt, h, k = jnp.dtype(c.dtype), c.hidden_size, c.block_size
        self.fc = normal_param(rngs, (len(c.feature_layers) * h, h), dt)
        self.cond_norm = RMSNorm(h, c.rms_norm_eps, dt)
        self.token_norm = RMSNorm(h, c.rms_norm_eps, dt)
        self.query_norm = RMSNorm(h, c.rms_norm_eps, dt)
        self.slot_queries = nnx.Param(jax.random.normal(rngs.params(), (k, h), jnp.float32).astype(dt))
        self.fuse = normal_param(rngs, (3 * h, h), dt)
        lc = c.layer_config()
        self.layers = nnx.List([DecoderLayer(lc, dt, rngs) for _ in range(c.num_layers)])
        if c.layer_shift and c.num_layers > 1:
            eye = jnp.concatenate([jnp.eye(h), jnp.zeros((h, h))], axis=0)
            self.shift = nnx.Param(jnp.broadcast_to(eye, (c.num_layers - 1, 2 * h, h)).astype(dt))
        self.norm = RMSNorm(h, c.rms_norm_eps, dt)
        self.lm_head = normal_param(rngs, (h, c.head_size), dt)
        self.rank_in = normal_param(rngs, (h + RANK_FEATURES, c.rank_hidden), dt)
        self.rank_in_bias = nnx.Param(jnp.zeros((c.rank_hidden,), dt))
        self.rank_out = normal_param(rngs, (c.rank_hidden, RANK_CLASSES), dt)
        self.rank_out_bias = nnx.Param(jnp.zeros((RANK_CLASSES,), dt))

    def features(self, target_hidden: jax.Array) -> jax.Array:
        """[B, T, n, H] target hidden states -> [B, T, H] conditions."""
        b, t = target_hidden.shape[:2]
        return target_hidden.reshape(b, t, -1) @ self.fc[...]

    def block(self, cond, emb, positions, mask, caches, starts, kv_len=None, group=None):
        """One block per group g: cond/emb [B, G, H], positions [B, G] (slot k at positions + 1 + k),
        mask [B, G*K, S] over the caches ((k, v) per layer, each [B, kv, S, D]) into which the
        G*K new entries are written at starts [B]; the mask hides every entry >= kv_len [] int32
        (None: attention spans all S). Returns (hidden [B, G, K, H], caches).

        group [B] int32 or None: only group group[b]'s hidden is wanted; hidden is then [B, K, H]
        (the full pass's hidden[b, group[b]]). Every layer still writes all G*K entries' K/V
        (later queries read them) and every layer but the last runs all of them (its output is
        the last layer's input); the last layer's attention and MLP run the K wanted slots only."""
        c = self.c
        b, g, h = cond.shape
        k = c.block_size
        x = self.block_input(cond, emb)
        cos, sin = self.slot_rope(positions, x.dtype)
        out = []
        for layer_index, layer in enumerate(self.layers):
            x = self.shift_slots(x, layer_index)
            rows = None
            if group is not None and layer_index == len(self.layers) - 1:
                rows = group[:, None] * k + jnp.arange(k)  # [B, K] the wanted slots' entries
            y, cache = layer(x.reshape(b, g * k, h), cos, sin, mask, caches[layer_index], starts, kv_len,
                             query_rows=rows)
            x = y if rows is not None else y.reshape(b, g, k, h)
            out.append(cache)
        return x, tuple(out)

    def block_input(self, cond, emb):
        """cond/emb [B, G, H] -> the K slots' inputs [B, G, K, H]: fuse [norm(c); norm(e); norm(q_k)]
        (Linear 3H -> H), computed as its three H-row blocks: the pair's part once per position,
        the slot query's once per slot, broadcast-added (the same sum, in another order)."""
        h = cond.shape[-1]
        fuse = self.fuse[...]
        pair = self.cond_norm(cond) @ fuse[:h] + self.token_norm(emb) @ fuse[h:2 * h]  # [B, G, H]
        slot = self.query_norm(self.slot_queries[...]) @ fuse[2 * h:]  # [K, H]
        return pair[:, :, None, :] + slot

    def slot_rope(self, positions, dtype):
        """positions [B, G] -> RoPE (cos, sin) of the G*K slots (slot k at position + 1 + k)."""
        b, g = positions.shape
        pos = (positions[:, :, None] + 1 + jnp.arange(self.c.block_size)).reshape(b, g * self.c.block_size)
        return rope_cos_sin(pos, self.c.rope, self.c.head_dim, dtype)

    def shift_slots(self, x, layer_index: int):
        """x [B, G, K, H] before layer `layer_index`: the layer-wise shift (layers >= 1), or x."""
        if layer_index and self.c.layer_shift:
            return layer_shift(x, self.shift[layer_index - 1])
        return x

    def logits(self, hidden):
        return jnp.einsum("...h,hv->...v", self.norm(hidden), self.lm_head[...],
                          preferred_element_type=jnp.float32)

    def rank_logits(self, hidden, logits=None, top=None):
        """hidden [..., H] and logits [..., V] (or their `top_logits` (top, ids, lse)) -> [..., 4];
        no gradient reaches the drafter."""
        top, _, lse = top_logits(logits) if top is None else top
        if self.c.rank_top1 == "top20":
            lse = jax.nn.logsumexp(top[..., :RANK_TOP], axis=-1, keepdims=True)
        x = jnp.concatenate([jax.lax.stop_gradient(self.norm(hidden)).astype(jnp.float32),
                             jax.lax.stop_gradient(rank_features(top, lse))], axis=-1)
        x = jax.nn.silu(x.astype(self.rank_in.dtype) @ self.rank_in[...] + self.rank_in_bias[...])
        return (x @ self.rank_out[...] + self.rank_out_bias[...]).astype(jnp.float32)


class SpecBlockState(NamedTuple):
    cache: tuple  # per layer (k, v) [B, K, S, D]: K entries per committed pair, then tree scratch
    length: jax.Array  # [B] int32 committed pairs (= the target's cache length)
    hidden: jax.Array  # [B, K, H] the first block of the next tree (the last pair's slots)
    top: TopTokens  # [B, K, R] its best draft tokens and their log-probs (R = max(20, 1 + width))
    cls: jax.Array  # [B, K] its rank-head classes


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpecBlockDecoding:
    """SpecBlock's tree settings (see trees/rank_tree.py): node budget incl. the root, blocks per
    path, leaves drafted from per later level, tokens drafted per rank class (1, 2-4, 5-10, give
    up; the chain token included, as the public code's RANK_SLOT_TOPK), tokens at the first
    block's slot 0, rank-head branching (false = fixed_branch alternatives at every slot)."""

    num_nodes: int = 16
    max_blocks: int = 2
    beam: int = 1
    slot_topk: tuple[int, ...] = (2, 4, 10, 0)
    root_topk: int = 4
    rank_tree: bool = True
    fixed_branch: int = 2
    sizing: str = "auto"  # step sizing (decoding/sizing.py; measured faster alone); "fixed": always num_nodes


@dataclasses.dataclass(frozen=True)
class SpecBlockDrafter(SpecBlockDecoding):
    """Decoding-side SpecBlock. params = {"draft": trainable params, "embed": [V, H]}, plus
    {"d2t": [K], "t2d": [V]} with a reduced draft vocabulary (drafters/draft_vocab.py)."""

    kind: ClassVar[str] = "specblock"
    config: SpecBlockConfig
    graphdef: nnx.GraphDef = dataclasses.field(repr=False)  # the model's structure: not printed

    @property
    def tree(self) -> RankTreeSettings:
        return RankTreeSettings(self.num_nodes, self.max_blocks, self.beam, tuple(self.slot_topk),
                                self.root_topk, self.rank_tree, self.fixed_branch)

    @property
    def max_children(self) -> int:
        return self.tree.max_children

    @property
    def hidden_ids(self) -> tuple[int, ...]:
        return self.config.feature_layers

    @property
    def forwards_per_step(self) -> int:
        return self.max_blocks  # the update (which drafts block 1) + one forward per later level

    @property
    def update_rows(self) -> int:
        """Path rows a step can commit (max_blocks * K drafts + the bonus): the update switches on
        the rows a step committed over `row_buckets(update_rows)` (priced per bucket by the bench)."""
        return self.max_blocks * self.config.block_size + 1

    def _model(self, params) -> SpecBlockModel:
        return nnx.merge(self.graphdef, params["draft"])

    def _heads(self, model, hidden):
        """hidden [..., K, H] -> (TopTokens [..., K, R], rank classes [..., K]): one top-k pass."""
        top = top_logits(model.logits(hidden), max(RANK_TOP, self.tree.candidates))
        cls = jnp.argmax(model.rank_logits(hidden, top=top), axis=-1)
        return TopTokens(top[0] - top[2], top[1]), cls

    def _committed(self, model, params, caches, cond, tokens, length, size, last):
        """Appends pairs (cond [B, T, H], tokens [B, T]) at pair index length [B]; returns the
        slots' hidden [B, K, H] of pair last [B] (0 <= last < T) of each row (None: of every pair,
        [B, T, K, H]: the plain block, which the tests compare with), and the caches."""
        b, t = tokens.shape
        k = self.config.block_size
        emb = jnp.take(params["embed"], tokens, axis=0)
        pos = length[:, None] + jnp.arange(t)[None]
        query = (pos[:, :, None] * k + jnp.arange(k)).reshape(b, t * k)
        mask = jnp.arange(size)[None, None, :] <= query[:, :, None]
        return model.block(cond.astype(emb.dtype), emb, pos, mask, caches, length * k,
                           (jnp.max(length) + t) * k, last)

    def init_state(self, params, prefill: Prefill, max_len: int):
        model = self._model(params)
        c, k = self.config, self.config.block_size
        b, p = prefill.tokens.shape
        size = max_len * k + (self.max_blocks - 1) * self.beam * k
        shape = (b, c.num_kv_heads, size, c.head_dim)  # heads first, as attention reads it
        caches = tuple((jnp.zeros(shape, jnp.dtype(c.dtype)), jnp.zeros(shape, jnp.dtype(c.dtype)))
                       for _ in range(c.num_layers))
        t = jnp.arange(p)[None, :]
        nxt = jnp.concatenate([prefill.tokens[:, 1:], prefill.tokens[:, -1:]], axis=1)
        nxt = jnp.where(t == prefill.lengths[:, None] - 1, prefill.root[:, None], nxt)
        zero = jnp.zeros((b,), jnp.int32)
        last, caches = self._committed(model, params, caches, model.features(prefill.hidden), nxt,
                                       zero, size, prefill.lengths - 1)  # [B, K, H]
        top, cls = self._heads(model, last)
        return SpecBlockState(caches, prefill.lengths, last, top, cls)

    def propose(self, params, state, ctx: DraftContext, key):
        model = self._model(params)
        k = self.config.block_size
        length = state.length
        b = length.shape[0]
        size = state.cache[0][0].shape[2]
        base = length * k  # [B] first scratch entry: right after the committed pairs' entries
        e = jnp.arange(size)

        def expand(carry, blk, slot, token, level):
            caches, hidden, depth, thr, vis = carry  # per block of the previous level
            take = lambda x: jnp.take_along_axis(x, blk.reshape(blk.shape + (1,) * (x.ndim - 2)), axis=1)  # noqa: E731
            cond = jnp.take_along_axis(take(hidden), slot[:, :, None, None], axis=2)[:, :, 0]  # [B, P, H]
            leaf_depth = take(depth) + slot + 1  # [B, P]
            if level == 2:  # leaves of the first block: committed entries of pair length - 1
                leaf_thr = (length - 1)[:, None] * k + slot + 1
                leaf_vis = jnp.zeros((b, blk.shape[1], size), bool)
            else:  # leaves of a scratch block: what it saw, plus its slots up to the leaf's
                blk_start = base[:, None] + (level - 3) * self.beam * k + blk * k  # [B, P]
                leaf_thr = take(thr)
                leaf_vis = take(vis) | ((e >= blk_start[..., None]) & (e <= (blk_start + slot)[..., None]))
            p = blk.shape[1]
            start = base + (level - 2) * self.beam * k  # [B] this level's P*K scratch entries
            query = start[:, None] + jnp.arange(p * k)  # [B, P*K]
            q_blk = jnp.repeat(jnp.arange(p), k)
            same_blk = ((e >= (start[:, None] + q_blk * k)[:, :, None]) & (e <= query[:, :, None]))
            mask = ((e[None, None, None, :] < leaf_thr[:, :, None, None])
                    | leaf_vis[:, :, None, :]).reshape(b, p, 1, size)
            mask = jnp.broadcast_to(mask, (b, p, k, size)).reshape(b, p * k, size) | same_blk
            emb = jnp.take(params["embed"], token, axis=0)
            pos = length[:, None] + leaf_depth - 1
            h, caches = model.block(cond.astype(emb.dtype), emb, pos, mask, caches, start,
                                    jnp.max(start) + p * k)
            top, cls = self._heads(model, h)
            return (caches, h, leaf_depth, leaf_thr, leaf_vis), top, cls

        vis0 = jnp.zeros((b, 1, size), bool)
        carry = (state.cache, state.hidden[:, None], jnp.zeros((b, 1), jnp.int32),
                 jnp.zeros((b, 1), jnp.int32), vis0)
        tree, carry = build_rank_tree(self.tree, ctx.root, state.top, state.cls, expand, carry,
                                      token_map=params.get("d2t"), floor=ctx.floor)
        return tree, state._replace(cache=carry[0])

    def update(self, params, state, ctx: DraftContext, result, hidden):
        """Appends the pairs (target feature of each accepted path node, the token after it); the
        last pair's slots are the first block of the next tree. It runs the smallest row bucket
        (drafters/common.py `switch_on_rows`) that holds the pairs this step committed, at most
        the max_blocks * K + 1 path rows that can be committed."""
        model = self._model(params)
        rows = min(result.path.shape[1], self.update_rows)
        length = state.length
        count = ctx.cache_len - length  # pairs committed this step (0 for finished rows)
        size = state.cache[0][0].shape[2]

        def run(r, caches):
            path = result.path[:, :r]
            feats = model.features(jnp.take_along_axis(hidden, path[:, :, None, None], axis=1))
            return self._committed(model, params, caches, feats, jnp.maximum(result.new_tokens[:, :r], 0),
                                   length, size, jnp.clip(count - 1, 0, r - 1))

        last, caches = switch_on_rows(count, rows, run, state.cache)
        top, cls = self._heads(model, last)
        moved = count > 0
        keep = lambda new, old: jnp.where(moved.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)  # noqa: E731
        return SpecBlockState(caches, length + count, keep(last, state.hidden), jax.tree.map(keep, top, state.top),
                              keep(cls, state.cls))


def load_specblock(path, meta, target, dtype, decoding):
    """The `load` of the "specblock" kind (drafters/registry.py)."""
    config, graphdef, params = load_model(path, meta, target, dtype, SpecBlockConfig, SpecBlockModel)
    settings = {**meta["decoding"], **decoding}
    settings["slot_topk"] = tuple(settings.get("slot_topk", SpecBlockDrafter.slot_topk))
    return SpecBlockDrafter(config, graphdef, **settings), params
