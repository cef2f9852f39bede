"""DFlash-style block-diffusion drafter: one forward drafts a whole block of B - 1 tokens.

Model (z-lab/dflash `DFlashDraftModel`, scaled to our target): target context features
    ctx = RMSNorm(Linear(n*H -> H)([h_a; h_b; ...]))   h = target hidden states at `feature_layers`
and L_d Qwen3-style decoder layers over the block [x_p, MASK, ..., MASK] at positions p..p+B-1.
Every layer takes its queries from the block only; its keys/values are
    K = [k_norm(k_proj(ctx)) ; k_norm(k_proj(norm(block)))],  V = [v_proj(ctx) ; v_proj(norm(block))]
(KV injection through the layer's own projections, RoPE at absolute positions), and a block query
sees the context strictly before p and every token of its block (non-causal inside the block).
The target's embedding and LM head are reused, frozen (`params["embed"]`, `params["head"]`, taken
from the target at load time, never stored with the drafter). Logits at block offsets 1..B-1 are
the drafts.

Attention mask of one block query (context slots 0..S-1, then the B block slots), p = 3, B = 3,
S = 5 (context entries 3, 4 hold stale values and are hidden):
    ctx: 1 1 1 0 0 | block: 1 1 1        (the same row for all three block queries)
A sequence drafting with a smaller block size b <= B also hides block slots >= b.

Decoding state: per layer the context K/V of every committed token except the root (the same
entries as the target's KV cache, so `length` equals its length); block K/V are never kept.
`update` appends the accepted path's context K/V. Per-sequence block sizes live in the state
(`block` [B] int32) under the static maximum `block_size`: nodes past a sequence's size are
invalid and hidden from the block's attention, so a batch mixes sizes without recompiling.

Draft tokens: `draft_mode="greedy"` takes deterministic drafts (q one-hot): the best prefixes of
per-offset top-`candidates` tokens, a tree of `num_nodes` nodes (`_tree.py`; candidates 1: today's
chain of argmax drafts, of block_size nodes). "sample" samples each offset from
softmax(logits / draft_temperature) and keeps that q as `draft_probs`, a chain the engine's
rejection sampling verifies losslessly; "auto" (default) drafts deterministically until the
sequence commits a token that is not the target's argmax (which only happens when the loop
samples; the drafter protocol does not receive the sampling parameters), then samples.
`_tree.py` says why both stay exact.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from specblock_jax.drafters.base import DraftContext, Prefill
from specblock_jax.drafters.common import load_model, target_head
from specblock_jax.models.config import ModelConfig, RopeConfig
from specblock_jax.models.attention import attend_heads_first, switch_on_length
from specblock_jax.models.layers import MLP, RMSNorm, normal_param, apply_rope, rope_cos_sin, write_kv
from specblock_jax.drafters.dflash._tree import best_prefixes, lattice_size, sampled_chain
from specblock_jax.trees.tree import DraftTree

DRAFT_MODES = ("auto", "greedy", "sample")


@dataclasses.dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    feature_layers: tuple[int, ...]  # target hidden states (HF indexing) fused into the context
    target_layers: int  # the target's depth (its final normed hidden is index target_layers)
    block_size: int = 16  # training block size
    mask_token_id: int = 3
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = RopeConfig()
    dtype: str = "float32"

    @classmethod
    def for_target(cls, cfg: ModelConfig, num_layers: int = 3, feature_layers=None, block_size: int = 16,
                   mask_token_id: int = 3) -> "DFlashConfig":
        """Target widths. Features default to up to 5 layer outputs evenly spread from layer 1 to
        the last (HF indices 1..L; a 4-layer target gives (1, 2, 3, 4))."""
        n = cfg.num_layers
        if feature_layers is None:
            k = min(5, n)
            feature_layers = sorted({round(1 + i * (n - 1) / max(k - 1, 1)) for i in range(k)})
        return cls(cfg.hidden_size, cfg.intermediate_size, num_layers, cfg.num_heads, cfg.num_kv_heads,
                   cfg.head_dim, cfg.vocab_size, tuple(feature_layers), n, block_size, mask_token_id,
                   cfg.rms_norm_eps, cfg.rope, cfg.dtype)


class DFlashLayer(nnx.Module):
    """Pre-norm decoder layer whose attention injects context K/V (see the module docstring)."""

    def __init__(self, c: DFlashConfig, rngs: nnx.Rngs):
        dt, h = jnp.dtype(c.dtype), c.hidden_size
        self.input_layernorm = RMSNorm(h, c.rms_norm_eps, dt)
        self.q_proj = normal_param(rngs, (h, c.num_heads, c.head_dim), dt)
        self.k_proj = normal_param(rngs, (h, c.num_kv_heads, c.head_dim), dt)
        self.v_proj = normal_param(rngs, (h, c.num_kv_heads, c.head_dim), dt)
        self.o_proj = normal_param(rngs, (c.num_heads, c.head_dim, h), dt)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dt)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dt)
        self.post_attention_layernorm = RMSNorm(h, c.rms_norm_eps, dt)
        self.mlp = MLP(h, c.intermediate_size, dt, rngs)

    def kv(self, x, cos, sin):
        """x [B, T, H] (context features or normed block) -> rotated k, v [B, T, K, D]."""
        k = self.k_norm(jnp.einsum("bth,hkd->btkd", x, self.k_proj[...]))
        v = jnp.einsum("bth,hkd->btkd", x, self.v_proj[...])
        return apply_rope(k, cos, sin), v

    def __call__(self, x, cos, sin, ctx_k, ctx_v, mask, kv_len=None):
        """x [B, T, H] block; ctx_k/ctx_v [B, K, S, D]; mask [B, T, S + T] -> [B, T, H]. kv_len []
        (or None): no query sees a context slot >= kv_len, so attention spans only a length bucket
        of the context (models/attention.py)."""
        h = self.input_layernorm(x)
        q = apply_rope(self.q_norm(jnp.einsum("bth,hnd->btnd", h, self.q_proj[...])), cos, sin)
        k, v = self.kv(h, cos, sin)
        size = ctx_k.shape[2]

        def over(n, q, ctx_k, ctx_v, k, v, mask):  # the first n context slots, then the block
            return attend_heads_first(
                q, jnp.concatenate([ctx_k[:, :, :n], jnp.swapaxes(k, 1, 2).astype(ctx_k.dtype)], 2),
                jnp.concatenate([ctx_v[:, :, :n], jnp.swapaxes(v, 1, 2).astype(ctx_v.dtype)], 2),
                jnp.concatenate([mask[..., :n], mask[..., size:]], -1))

        operands = (q, ctx_k, ctx_v, k, v, mask)
        out = over(size, *operands) if kv_len is None else switch_on_length(kv_len, size, over, *operands)
        x = x + jnp.einsum("btnd,ndh->bth", out, self.o_proj[...])
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashModel(nnx.Module):
    def __init__(self, c: DFlashConfig, rngs: nnx.Rngs):
        dt = jnp.dtype(c.dtype)
        self.c = c
        self.fc = normal_param(rngs, (len(c.feature_layers) * c.hidden_size, c.hidden_size), dt)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, dt)
        self.layers = nnx.List([DFlashLayer(c, rngs) for _ in range(c.num_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, dt)

    def context(self, target_hidden):
        """[B, T, n, H] target hidden states -> [B, T, H] context features."""
        b, t = target_hidden.shape[:2]
        return self.hidden_norm(target_hidden.reshape(b, t, -1) @ self.fc[...])

    def context_kv(self, ctx, positions):
        """ctx [B, T, H] at RoPE positions [B, T] -> per layer (k, v) [B, T, K, D]."""
        cos, sin = rope_cos_sin(positions, self.c.rope, self.c.head_dim, ctx.dtype)
        return [layer.kv(ctx, cos, sin) for layer in self.layers]

    def context_cache(self, ctx, positions):
        """`context_kv` laid out as attention reads it: per layer (k, v) [B, K, T, D]."""
        return [(jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)) for k, v in self.context_kv(ctx, positions)]

    def block(self, emb, positions, ctx_kv, mask, kv_len=None):
        """emb [B, T, H] block embeddings at positions [B, T]; ctx_kv per layer (k, v) [B, K, S, D];
        mask [B, T, S + T] hiding context slots >= kv_len [] (None: no bound). Returns the final
        normed hidden [B, T, H]."""
        cos, sin = rope_cos_sin(positions, self.c.rope, self.c.head_dim, emb.dtype)
        x = emb
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, k, v, mask, kv_len)
        return self.norm(x)


class DFlashState(NamedTuple):
    cache: tuple  # per layer (k, v) [B, K, S, D]: context K/V of every committed token but the root
    length: jax.Array  # [B] int32 committed entries (= the target's cache length)
    block: jax.Array  # [B] int32 each sequence's block size (<= the static block_size)
    sampled: jax.Array  # [B] bool: the sequence committed a non-argmax token ("auto" mode samples)


def head_logits(hidden, head):
    """hidden [..., H] @ head [H, V] -> fp32 logits."""
    return jnp.einsum("...h,hv->...v", hidden, head, preferred_element_type=jnp.float32)


@dataclasses.dataclass(frozen=True)
class DFlashDrafter:
    """Decoding-side DFlash drafter. params = {"draft", "embed" [V, H], "head" [H, V]}.

    block_size (static): the largest block (root + block_size - 1 offsets drafted by one forward);
    each sequence drafts with its own size <= block_size (`init_state(..., block=)`, default all).
    num_nodes, candidates (static): the tree of deterministic drafts, the best num_nodes - 1
    prefixes of per-offset top-`candidates` tokens (`_tree.py`). candidates 1 is the chain, whose
    num_nodes is the block size; 0 (default) picks 1 when num_nodes is 0 or the block size (today's
    chain), else num_nodes - 1 (the best prefixes, unbounded). num_nodes 0 is the block size; it is
    capped at the prefixes there are. Both are resolved here, so `replace(block_size=)` of a chain
    stays a chain of the new size.
    """

    kind: ClassVar[str] = "dflash"
    config: DFlashConfig
    graphdef: nnx.GraphDef = dataclasses.field(repr=False)  # the model's structure: not printed
    block_size: int = 16
    draft_mode: str = "auto"
    draft_temperature: float = 1.0
    num_nodes: int = 0
    candidates: int = 0
    sizing: str = "fixed"  # "auto": step sizing (decoding/sizing.py); "fixed": always num_nodes

    def __post_init__(self):
        if self.draft_mode not in DRAFT_MODES:
            raise ValueError(f"draft_mode must be one of {DRAFT_MODES}, got {self.draft_mode!r}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2, got {self.block_size}")
        if self.num_nodes == 1 or self.num_nodes < 0 or self.candidates < 0:
            raise ValueError(f"num_nodes must be 0 or >= 2 and candidates >= 0, got {self.num_nodes}, "
                             f"{self.candidates}")
        nodes = self.num_nodes or self.block_size
        c = self.candidates or (1 if nodes == self.block_size else nodes - 1)
        nodes = self.block_size if c == 1 else 1 + lattice_size(c, self.block_size - 1, nodes - 1)
        object.__setattr__(self, "num_nodes", nodes)
        object.__setattr__(self, "candidates", c)

    max_children = property(lambda self: min(self.candidates, self.num_nodes - 1))
    forwards_per_step = property(lambda self: 1)  # one block forward (+ K/V projections in update)

    @property
    def hidden_ids(self) -> tuple[int, ...]:
        """The feature layers, plus the target's final normed hidden in "auto" mode (to see
        whether a committed token was the target's argmax)."""
        last = (self.config.target_layers,)
        extra = last if self.draft_mode == "auto" and last[0] not in self.config.feature_layers else ()
        return tuple(self.config.feature_layers) + extra

    def _model(self, params) -> DFlashModel:
        return nnx.merge(self.graphdef, params["draft"])

    def _features(self, hidden):
        n = len(self.config.feature_layers)
        return hidden[:, :, :n]

    def _is_sampled(self, params, final_hidden, token):
        """Whether `token` [B] differs from the target's argmax given its final hidden [B, H]."""
        return jnp.argmax(head_logits(final_hidden, params["head"]), -1) != token

    def _final_index(self):
        return self.hidden_ids.index(self.config.target_layers)

    def init_state(self, params, prefill: Prefill, max_len: int, block=None):
        """Context K/V of the prompt (slots 0..P-1); block [B] per-sequence sizes (default all
        `block_size`)."""
        model = self._model(params)
        b, p = prefill.tokens.shape
        c = self.config
        dt = jnp.dtype(c.dtype)
        pos = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
        kv = model.context_kv(model.context(self._features(prefill.hidden).astype(dt)), pos)
        shape = (b, c.num_kv_heads, max_len, c.head_dim)  # heads first, as attention reads it
        zero = jnp.zeros((b,), jnp.int32)
        cache = tuple((write_kv(jnp.zeros(shape, dt), k, zero), write_kv(jnp.zeros(shape, dt), v, zero))
                      for k, v in kv)
        if block is None:
            block = jnp.full((b,), self.block_size, jnp.int32)
        sampled = jnp.zeros((b,), bool)
        if self.draft_mode == "auto":
            sampled = jnp.argmax(prefill.logits, -1) != prefill.root
        return DFlashState(cache, prefill.lengths.astype(jnp.int32),
                           jnp.clip(block.astype(jnp.int32), 1, self.block_size), sampled)

    def block_mask(self, length, block, size):
        """[B, N, size + N] bool: context slots < length[b] and block slots < block[b]."""
        n = self.block_size
        ctx = jnp.arange(size)[None, :] < length[:, None]
        blk = jnp.arange(n)[None, :] < block[:, None]
        row = jnp.concatenate([ctx, blk], axis=1)
        return jnp.broadcast_to(row[:, None, :], (length.shape[0], n, size + n))

    def draft_logits(self, params, state, root):
        """Logits [B, N - 1, V] of block offsets 1..N-1 for the block rooted at root [B]."""
        model = self._model(params)
        n = self.block_size
        b = root.shape[0]
        size = state.cache[0][0].shape[2]
        tokens = jnp.full((b, n), self.config.mask_token_id, jnp.int32).at[:, 0].set(root)
        positions = state.length[:, None] + jnp.arange(n, dtype=jnp.int32)[None, :]
        emb = jnp.take(params["embed"], tokens, axis=0).astype(jnp.dtype(self.config.dtype))
        hidden = model.block(emb, positions, state.cache, self.block_mask(state.length, state.block, size),
                             jnp.max(state.length))
        return head_logits(hidden[:, 1:], params["head"])

    def propose(self, params, state, ctx: DraftContext, key):
        logits = self.draft_logits(params, state, ctx.root)  # [B, D, V], D = block_size - 1
        b, v = ctx.root.shape[0], logits.shape[-1]
        ok = jnp.arange(1, self.block_size)[None, :] < state.block[:, None]  # offsets each row drafts
        tree = best_prefixes(ctx.root, jax.nn.log_softmax(logits, -1), ok, self.num_nodes, self.candidates)
        if self.draft_mode == "greedy":  # deterministic drafts: q is one-hot (draft_probs None)
            return tree, state
        sample = state.sampled if self.draft_mode == "auto" else jnp.ones((b,), bool)
        one_hot = jax.nn.one_hot(tree.tokens, v, dtype=jnp.float32).at[:, 0].set(0.0)

        def sampled(_):  # rows that sample draft the chain from q; the others keep the tree, one-hot
            scaled = logits / self.draft_temperature
            drawn = jax.vmap(lambda k, lg: jax.random.categorical(k, lg, axis=-1))(key, scaled).astype(jnp.int32)
            chain = sampled_chain(ctx.root, drawn, jax.nn.softmax(scaled, -1), ok, self.num_nodes)
            pick = lambda x, y: jnp.where(sample.reshape((b,) + (1,) * (x.ndim - 1)), x, y)  # noqa: E731
            return jax.tree.map(pick, chain, tree._replace(draft_probs=one_hot))

        def deterministic(_):  # no row samples (auto mode at T=0): skip the vocabulary-wide draws
            return tree._replace(draft_probs=one_hot)

        return jax.lax.cond(jnp.any(sample), sampled, deterministic, None), state

    def update(self, params, state, ctx: DraftContext, result, hidden):
        """Appends the context K/V of the accepted path (root + accepted drafts)."""
        model = self._model(params)
        b, n = result.path.shape
        length = state.length
        count = ctx.cache_len - length  # committed this step (0 for finished rows)
        on_path = jnp.take_along_axis(hidden, result.path[:, :, None, None], axis=1)  # [B, N, n, H]
        feats = self._features(on_path).astype(jnp.dtype(self.config.dtype))
        pos = length[:, None] + jnp.arange(n, dtype=jnp.int32)[None, :]
        kv = model.context_kv(model.context(feats), pos)
        cache = tuple((write_kv(ck, k, length), write_kv(cv, v, length))
                      for (ck, cv), (k, v) in zip(state.cache, kv))
        sampled = state.sampled
        if self.draft_mode == "auto":
            last = jnp.take_along_axis(on_path, result.num_accepted[:, None, None, None], axis=1)
            seen = self._is_sampled(params, last[:, 0, self._final_index()], result.bonus)
            sampled = sampled | (seen & (count > 0))
        return state._replace(cache=cache, length=length + count, sampled=sampled)


def load_dflash(path, meta, target, dtype, decoding):
    """The `load` of the "dflash" kind (drafters/registry.py)."""
    config, graphdef, params = load_model(path, meta, target, dtype, DFlashConfig, DFlashModel)
    if target.config.num_layers != config.target_layers:
        raise ValueError(f"{path}: drafter trained for a {config.target_layers}-layer target, the "
                         f"target has {target.config.num_layers}")
    settings = {**meta["decoding"], **decoding}
    if "num_nodes" in decoding and "candidates" not in decoding:  # a new budget: candidates follow it
        settings["candidates"] = 0
    drafter = DFlashDrafter(config, graphdef, **settings)
    asked = decoding.get("num_nodes") or drafter.num_nodes  # saved settings may follow a new block_size
    if asked != drafter.num_nodes:
        raise ValueError(f"{path}: num_nodes={asked}: {drafter.candidates} candidates per offset over a block of "
                         f"{drafter.block_size} make {drafter.num_nodes} nodes (candidates=1 is the chain)")
    return drafter, {**params, "head": target_head(target)}
