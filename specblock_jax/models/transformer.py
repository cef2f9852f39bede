"""The decoder-only target model and its pure-functional forward.

`Transformer` is a Flax NNX module; outside this file the model is `(graphdef, params)` where
`params` is a plain nested dict of arrays, and `apply(graphdef, params, ...)` is the only forward:
causal prefill, one-token decode, tree verification and block drafting all differ only in the
`mask` and `positions` they pass.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from specblock_jax.models.config import ModelConfig
from specblock_jax.models.kv_cache import KVCache, cache_mask
from specblock_jax.models.layers import DecoderLayer, RMSNorm, normal_param, rope_cos_sin


class ForwardOutput(NamedTuple):
    logits: jax.Array | None  # [B, T, V] fp32, or [B, n, V] at logit_indices, None if not asked
    hidden: jax.Array | None  # [B, T, len(hidden_ids), H] or None
    cache: KVCache | None  # new K/V written at lengths[b]..; lengths NOT advanced


class Transformer(nnx.Module):
    """Qwen3 / Llama-3 decoder: embed -> L pre-norm layers -> final norm -> LM head."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        dtype = jnp.dtype(cfg.dtype)
        self.cfg = cfg
        self.embed_tokens = normal_param(rngs, (cfg.vocab_size, cfg.hidden_size), dtype)
        self.layers = nnx.List([DecoderLayer(cfg, dtype, rngs) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        if not cfg.tie_word_embeddings:
            self.lm_head = normal_param(rngs, (cfg.hidden_size, cfg.vocab_size), dtype)

    def head_weight(self) -> jax.Array:
        """LM head [H, V] (the transposed embedding when tied)."""
        if self.cfg.tie_word_embeddings:
            return self.embed_tokens[...].T
        return self.lm_head[...]

    def __call__(self, tokens, positions, mask, cache: KVCache | None = None, hidden_ids=(),
                 logit_indices=None, compute_logits: bool = True) -> ForwardOutput:
        """The forward of `apply` (shapes and arguments documented there)."""
        cfg = self.cfg
        bad = [i for i in hidden_ids if not 0 <= i <= cfg.num_layers]
        if bad:
            raise ValueError(f"hidden_ids {bad} outside [0, {cfg.num_layers}] (HF hidden_states indexing)")
        x = jnp.take(self.embed_tokens[...], tokens, axis=0)
        cos, sin = rope_cos_sin(positions, cfg.rope, cfg.head_dim, x.dtype)
        kv_len = None
        if cache is not None:
            full_mask, starts = cache_mask(mask, cache.lengths, cache.max_len), cache.lengths
            if cfg.attention == "bucketed":  # no query sees past the longest row's new tokens
                kv_len = jnp.max(cache.lengths) + tokens.shape[1]
        else:
            full_mask, starts = mask, None
        hidden = {}  # HF hidden_states index -> [B, T, H]
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            if i in hidden_ids:
                hidden[i] = x
            layer_cache = None if cache is None else (cache.k[i], cache.v[i])
            x, layer_cache = layer(x, cos, sin, full_mask, layer_cache, starts, kv_len)
            if cache is not None:
                new_k.append(layer_cache[0])
                new_v.append(layer_cache[1])
        x = self.norm(x)
        if cfg.num_layers in hidden_ids:
            hidden[cfg.num_layers] = x
        if cache is not None:
            cache = KVCache(tuple(new_k), tuple(new_v), cache.lengths)
        logits = None
        if compute_logits:
            if logit_indices is not None:
                x = jnp.take_along_axis(x, logit_indices[:, :, None], axis=1)
            logits = jnp.einsum(
                "bth,hv->btv", x, self.head_weight(), preferred_element_type=jnp.float32
            )
        hid = jnp.stack([hidden[i] for i in hidden_ids], axis=2) if hidden_ids else None
        return ForwardOutput(logits, hid, cache)


def apply(
    graphdef: nnx.GraphDef,
    params: dict,
    tokens: jax.Array,
    positions: jax.Array,
    mask: jax.Array,
    cache: KVCache | None = None,
    *,
    hidden_ids: tuple[int, ...] = (),
    logit_indices: jax.Array | None = None,
    compute_logits: bool = True,
) -> ForwardOutput:
    """Pure forward over T new tokens.

    tokens, positions [B, T] int32 (positions are RoPE positions; with a cache the tokens occupy
    slots lengths[b] .. lengths[b] + T - 1 whatever their positions, so tree nodes can share a
    depth). mask [B, T, T] among the new tokens (see `causal_mask`); with a cache it is combined
    with the committed prefix (`cache_mask`). hidden_ids index HF's `hidden_states`: i < L is the
    input of layer i (0 = embeddings), L is the final normed hidden. Keep `hidden_ids`,
    `compute_logits` static under jit.
    """
    model = nnx.merge(graphdef, params)
    return model(tokens, positions, mask, cache, tuple(hidden_ids), logit_indices, compute_logits)


def causal_mask(batch: int, length: int, valid: jax.Array | None = None) -> jax.Array:
    """[B, T, T] lower-triangular mask; valid [B, T] (1 = real token) also hides padded keys.

    T=3:  1 0 0
          1 1 0
          1 1 1
    """
    idx = jnp.arange(length)
    mask = jnp.broadcast_to(idx[None, :, None] >= idx[None, None, :], (batch, length, length))
    if valid is not None:
        mask = mask & valid.astype(bool)[:, None, :]
    return mask


def positions_from_valid(valid: jax.Array) -> jax.Array:
    """RoPE positions [B, T] for a padded batch: cumsum(valid) - 1, clipped at 0 (left or right pad)."""
    return jnp.maximum(jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1, 0)
