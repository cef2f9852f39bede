"""EAGLE-3-style drafter: fused target features, one decoder layer, an EAGLE-2 dynamic tree.

Alignment (as in EAGLE): drafter position t reads the pair (feature of token x_t, embedding of
x_{t+1}) and predicts x_{t+2}. The feature is fc([h_a; h_b; h_c]) of the target's hidden states
at `feature_layers` (HF indexing) for committed tokens, and the drafter's own output hidden for
tokens it drafted itself. The layer attends over [norm(embed(x_{t+1})); norm(feature)] (2H wide),
its residual is the feature; logits = lm_head(norm(hidden)). The embedding is the target's, frozen
(passed in `params["embed"]`, never stored with the drafter).

Decoding state: the drafter's own KV cache (one entry per target-cached token, so its length
equals the target cache length), plus the last committed pair's hidden and logits, from which the
next tree grows. Tree expansion writes scratch K/V after the committed entries; the next
`update` overwrites them with the accepted pairs.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from specblock_jax.drafters.base import DraftContext, Prefill
from specblock_jax.drafters.common import TargetWidths, load_model
from specblock_jax.models.attention import attend_prefix
from specblock_jax.models.layers import MLP, RMSNorm, normal_param, apply_rope, rope_cos_sin, write_kv
from specblock_jax.drafters.eagle3._topk_tree import build_topk_tree


@dataclasses.dataclass(frozen=True)
class Eagle3Config(TargetWidths):
    """The drafter's layer has the target's widths (`Eagle3Config.for_target(cfg)`); its LM head
    covers the target vocabulary or a reduced draft vocabulary (drafters/draft_vocab.py)."""


class Eagle3Layer(nnx.Module):
    """The drafter's decoder layer over [norm(embedding); norm(feature)]."""

    def __init__(self, c: Eagle3Config, rngs: nnx.Rngs):
        dt, h = jnp.dtype(c.dtype), c.hidden_size
        self.emb_norm = RMSNorm(h, c.rms_norm_eps, dt)
        self.hidden_norm = RMSNorm(h, c.rms_norm_eps, dt)
        self.q_proj = normal_param(rngs, (2 * h, c.num_heads, c.head_dim), dt)
        self.k_proj = normal_param(rngs, (2 * h, c.num_kv_heads, c.head_dim), dt)
        self.v_proj = normal_param(rngs, (2 * h, c.num_kv_heads, c.head_dim), dt)
        self.o_proj = normal_param(rngs, (c.num_heads, c.head_dim, h), dt)
        self.post_norm = RMSNorm(h, c.rms_norm_eps, dt)
        self.mlp = MLP(h, c.intermediate_size, dt, rngs)

    def project(self, emb, feat, cos, sin):
        """emb, feat [B, T, H] -> rotated q [B, T, N, D], k, v [B, T, K, D]."""
        x = jnp.concatenate([self.emb_norm(emb), self.hidden_norm(feat)], axis=-1)
        q = jnp.einsum("bth,hnd->btnd", x, self.q_proj[...])
        k = jnp.einsum("bth,hkd->btkd", x, self.k_proj[...])
        v = jnp.einsum("bth,hkd->btkd", x, self.v_proj[...])
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def finish(self, feat, attn):
        """Residual on the feature, then the MLP block. attn [B, T, N, D] -> hidden [B, T, H]."""
        h = feat + jnp.einsum("btnd,ndh->bth", attn, self.o_proj[...])
        return h + self.mlp(self.post_norm(h))


class Eagle3Model(nnx.Module):
    def __init__(self, c: Eagle3Config, rngs: nnx.Rngs):
        self.c = c
        self.fc = normal_param(rngs, (len(c.feature_layers) * c.hidden_size, c.hidden_size), jnp.dtype(c.dtype))
        self.layer = Eagle3Layer(c, rngs)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, jnp.dtype(c.dtype))
        self.lm_head = normal_param(rngs, (c.hidden_size, c.head_size), jnp.dtype(c.dtype))

    def fuse(self, target_hidden):
        """[B, T, n, H] target hidden states -> [B, T, H] features."""
        b, t = target_hidden.shape[:2]
        return target_hidden.reshape(b, t, -1) @ self.fc[...]

    def logits(self, hidden):
        return jnp.einsum("bth,hv->btv", self.norm(hidden), self.lm_head[...],
                          preferred_element_type=jnp.float32)

    def step(self, emb, feat, positions, mask, cache, starts, kv_len):
        """One pass over T pairs with a KV cache (k, v) [B, K, S, D] written at starts [B];
        mask [B, T, S] hides every slot >= kv_len [] (attention costs what the sequence is long).
        Returns (hidden [B, T, H], cache); `logits` of the rows that need them."""
        cos, sin = rope_cos_sin(positions, self.c.rope, self.c.head_dim, emb.dtype)
        q, k, v = self.layer.project(emb, feat, cos, sin)
        kc, vc = write_kv(cache[0], k, starts), write_kv(cache[1], v, starts)
        return self.layer.finish(feat, attend_prefix(q, kc, vc, mask, kv_len)), (kc, vc)


class Eagle3State(NamedTuple):
    cache: tuple[jax.Array, jax.Array]  # (k, v) [B, K, S, D]: committed entries, then tree scratch
    length: jax.Array  # [B] int32 committed entries (= the target's cache length)
    hidden: jax.Array  # [B, H] the last committed pair's output hidden (the next tree's root)
    logits: jax.Array  # [B, V'] its logits over the drafter's vocabulary


@dataclasses.dataclass(frozen=True)
class Eagle3Drafter:
    """Decoding-side EAGLE-3 drafter. params = {"draft": trainable params, "embed": [V, H]}, plus
    {"d2t": [K], "t2d": [V]} with a reduced draft vocabulary (drafters/draft_vocab.py)."""

    kind: ClassVar[str] = "eagle3"
    config: Eagle3Config
    graphdef: nnx.GraphDef = dataclasses.field(repr=False)  # the model's structure: not printed
    num_nodes: int = 16
    top_k: int = 4
    depth: int = 5
    sizing: str = "auto"  # step sizing (decoding/sizing.py; measured faster alone); "fixed": always num_nodes

    @property
    def max_children(self) -> int:
        return self.top_k

    @property
    def hidden_ids(self) -> tuple[int, ...]:
        return self.config.feature_layers

    @property
    def forwards_per_step(self) -> int:
        return self.depth  # depth - 1 tree expansions + the update over the accepted path

    def _model(self, params) -> Eagle3Model:
        return nnx.merge(self.graphdef, params["draft"])

    def init_state(self, params, prefill: Prefill, max_len: int):
        model = self._model(params)
        b, p = prefill.tokens.shape
        size = max_len + self.top_k * self.depth  # committed entries + tree scratch
        c = self.config
        shape = (b, c.num_kv_heads, size, c.head_dim)  # heads first, as attention reads it
        cache = (jnp.zeros(shape, jnp.dtype(c.dtype)), jnp.zeros(shape, jnp.dtype(c.dtype)))
        t = jnp.arange(p)[None, :]
        nxt = jnp.concatenate([prefill.tokens[:, 1:], prefill.tokens[:, -1:]], axis=1)
        nxt = jnp.where(t == prefill.lengths[:, None] - 1, prefill.root[:, None], nxt)
        emb = jnp.take(params["embed"], nxt, axis=0)
        slots = jnp.arange(size)[None, None, :]
        mask = jnp.broadcast_to(slots <= t[:, :, None], (b, p, size))
        zero = jnp.zeros((b,), jnp.int32)
        hidden, cache = model.step(emb, model.fuse(prefill.hidden), jnp.broadcast_to(t, (b, p)), mask, cache,
                                   zero, jnp.int32(p))
        last = jnp.take_along_axis(hidden, (prefill.lengths - 1)[:, None, None], axis=1)[:, 0]
        return Eagle3State(cache, prefill.lengths, last, model.logits(last[:, None])[:, 0])

    def propose(self, params, state, ctx: DraftContext, key):
        model = self._model(params)
        length = state.length
        size = state.cache[0].shape[2]
        slots = jnp.arange(size)[None, None, :]

        def expand(carry, tokens, parent, node, anc, d):
            cache, hid = carry  # hid [B, M, H]: the hidden each expanded candidate produced
            par_hidden = jnp.where(parent[:, :, None] < 0, state.hidden[:, None, :],
                                   jnp.take_along_axis(hid, jnp.maximum(parent, 0)[:, :, None], axis=1))
            rel = slots - length[:, None, None]  # candidate m lives in slot length + m
            in_tree = (rel >= 0) & (rel < anc.shape[-1])
            seen = jnp.take_along_axis(anc, jnp.clip(rel, 0, anc.shape[-1] - 1).repeat(anc.shape[1], 1), axis=2)
            mask = (slots < length[:, None, None]) | (in_tree & seen)
            positions = jnp.broadcast_to(length[:, None] + d - 1, tokens.shape)
            emb = jnp.take(params["embed"], tokens, axis=0)
            h, cache = model.step(emb, par_hidden.astype(emb.dtype), positions, mask, cache,
                                  length + node[:, 0], jnp.max(length) + anc.shape[-1])
            hid = hid.at[jnp.arange(tokens.shape[0])[:, None], node].set(h)
            return (cache, hid), jax.nn.log_softmax(model.logits(h), axis=-1)

        b = length.shape[0]
        hid0 = jnp.zeros((b, self.top_k * self.depth, self.config.hidden_size), state.hidden.dtype)
        tree, (cache, _) = build_topk_tree(ctx.root, jax.nn.log_softmax(state.logits, axis=-1), expand,
                                           (state.cache, hid0), self.top_k, self.depth, self.num_nodes,
                                           params.get("d2t"), ctx.floor)
        return tree, state._replace(cache=cache)

    def update(self, params, state, ctx: DraftContext, result, hidden):
        """Appends the pairs (target feature of each accepted path node, the token after it). Only
        the depth + 1 path rows that can be committed run, and logits only for the last one."""
        model = self._model(params)
        rows = min(result.path.shape[1], self.depth + 1)  # accepted drafts <= depth, + the bonus
        length = state.length
        count = ctx.cache_len - length  # pairs committed this step (0 for finished rows)
        path = result.path[:, :rows]
        feats = model.fuse(jnp.take_along_axis(hidden, path[:, :, None, None], axis=1))
        emb = jnp.take(params["embed"], jnp.maximum(result.new_tokens[:, :rows], 0), axis=0)
        size = state.cache[0].shape[2]
        pos = length[:, None] + jnp.arange(rows)[None, :]
        mask = jnp.arange(size)[None, None, :] <= pos[:, :, None]
        h, cache = model.step(emb, feats, pos, mask, state.cache, length, jnp.max(length) + rows)
        last = jnp.take_along_axis(h, jnp.maximum(count - 1, 0)[:, None, None], axis=1)  # [B, 1, H]
        moved = (count > 0)[:, None]
        return Eagle3State(cache, length + count, jnp.where(moved, last[:, 0], state.hidden),
                           jnp.where(moved, model.logits(last)[:, 0], state.logits))


def load_eagle3(path, meta, target, dtype, decoding):
    """The `load` of the "eagle3" kind (drafters/registry.py)."""
    config, graphdef, params = load_model(path, meta, target, dtype, Eagle3Config, Eagle3Model)
    return Eagle3Drafter(config, graphdef, **{**meta["decoding"], **decoding}), params
