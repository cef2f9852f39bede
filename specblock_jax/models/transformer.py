"""The decoder-only target model and its pure-functional forward.

`Transformer` is a Flax NNX module; outside this file the model is `(graphdef, params)` where
`params` is a plain nested dict of arrays, and `apply(graphdef, params, ...)` is the only forward:
causal prefill, one-token decode, tree verification and block drafting all differ only in the
`mask` and `positions` they pass.

The L decoder layers are one stacked module (every weight has a leading [L] axis) run by
`jax.lax.scan`, so compilation does not grow with depth (`ModelConfig.scan_unroll` unrolls it in
cacheless forwards, `cache_scan_unroll` in forwards with a cache); the KV cache is
stacked the same way ([L, B, K, S, D], kv heads before slots) and rides in the scan's carry, each layer writing its new
entries in place (docs/findings.md, scan_layers: compile time and decode speed measured).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from specblock_jax.models.attention import is_prompt, prompt_kernel
from specblock_jax.models.config import ModelConfig
from specblock_jax.models.kv_cache import KVCache
from specblock_jax.models.layers import DecoderLayer, RMSNorm, normal_param, rope_cos_sin


class ForwardOutput(NamedTuple):
    logits: jax.Array | None  # [B, T, V] fp32, or [B, n, V] at logit_indices, None if not asked
    hidden: jax.Array | None  # [B, T, len(hidden_ids), H] or None
    cache: KVCache | None  # new K/V written at lengths[b]..; lengths NOT advanced
    # with write_cache=False: (k, v) each [L, B, T, K, D], the new tokens' K/V (the cache is only
    # read, and `cache` is the input's); KVCache.append commits a chosen subset of them
    new_kv: tuple[jax.Array, jax.Array] | None = None


def stacked_layers(cfg: ModelConfig, dtype, rngs: nnx.Rngs) -> DecoderLayer:
    """cfg.num_layers decoder layers as one module whose weights have a leading [L] axis. Drawn
    one layer after another, so a seed gives the same weights as L separate layers would."""
    layers = [DecoderLayer(cfg, dtype, rngs) for _ in range(cfg.num_layers)]
    graphdef = nnx.graphdef(layers[0])
    return nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.state(x) for x in layers]))


class Transformer(nnx.Module):
    """Qwen3 / Llama-3 decoder: embed -> L pre-norm layers -> final norm -> LM head."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        dtype = jnp.dtype(cfg.dtype)
        self.cfg = cfg
        self.embed_tokens = normal_param(rngs, (cfg.vocab_size, cfg.hidden_size), dtype)
        self.layers = stacked_layers(cfg, dtype, rngs)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        if not cfg.tie_word_embeddings:
            self.lm_head = normal_param(rngs, (cfg.hidden_size, cfg.vocab_size), dtype)

    def head_weight(self) -> jax.Array:
        """LM head [H, V] (the transposed embedding when tied)."""
        if self.cfg.tie_word_embeddings:
            return self.embed_tokens[...].T
        return self.lm_head[...]

    def __call__(self, tokens, positions, mask, cache: KVCache | None = None, hidden_ids=(),
                 logit_indices=None, compute_logits: bool = True, write_cache: bool = True) -> ForwardOutput:
        """The forward of `apply` (shapes and arguments documented there)."""
        cfg = self.cfg
        bad = [i for i in hidden_ids if not 0 <= i <= cfg.num_layers]
        if bad:
            raise ValueError(f"hidden_ids {bad} outside [0, {cfg.num_layers}] (HF hidden_states indexing)")
        x = jnp.take(self.embed_tokens[...], tokens, axis=0)
        cos, sin = rope_cos_sin(positions, cfg.rope, cfg.head_dim, x.dtype)
        starts = None if cache is None else cache.lengths  # the cache part: models/attention.py
        taps = tuple(i for i in hidden_ids if i < cfg.num_layers)  # layer inputs to keep
        tap_ids = jnp.asarray(taps, jnp.int32)
        layer_def, layer_params = nnx.split(self.layers)

        read_only = cache is not None and not write_cache

        def layers(carry, layer_mask):
            def body(carry, xs):
                x, kv, kept = carry
                params, i = xs
                layer = nnx.merge(layer_def, params)
                if taps:  # kept[j] = the input of layer taps[j]
                    kept = jnp.where((tap_ids == i)[:, None, None, None], x[None], kept)
                if read_only:  # the cache stays out of the carry: the layer's new K/V are the scan's ys
                    x, new = layer(x, cos, sin, layer_mask, (cache.k, cache.v), starts, None, i, write=False)
                    return (x, kv, kept), new
                x, kv = layer(x, cos, sin, layer_mask, kv, starts, None, None if kv is None else i)
                return (x, kv, kept), None

            index = jnp.arange(cfg.num_layers, dtype=jnp.int32)
            unroll = min(cfg.scan_unroll if cache is None else cfg.cache_scan_unroll, cfg.num_layers)
            return jax.lax.scan(body, carry, (layer_params, index), unroll=unroll)

        kv = None if cache is None or read_only else (cache.k, cache.v)
        kept = jnp.zeros((len(taps),) + x.shape, x.dtype) if taps else None
        carry = (x, kv, kept)
        new_kv = None
        if read_only:
            (x, _, kept), new_kv = layers(carry, mask)
        elif cache is not None and prompt_kernel(cfg.attention, tokens.shape[1], cfg.head_dim, cache.max_len,
                                                 x.dtype):
            # a prompt on an empty cache runs the causal kernel (mask None) in every layer. The
            # barrier keeps XLA from moving the mask's making into the other branch, whose operands
            # would then be its [B, T, T] int32 iotas (4 GB each at 32k) instead of one bool mask
            mask = jax.lax.optimization_barrier(mask)
            x, kv, kept = jax.lax.cond(is_prompt(mask, cache.lengths), lambda c: layers(c, None)[0],
                                       lambda c: layers(c, mask)[0], carry)
        else:
            x, kv, kept = layers(carry, mask)[0]
        x = self.norm(x)
        hidden = {i: kept[j] for j, i in enumerate(taps)}  # HF hidden_states index -> [B, T, H]
        if cfg.num_layers in hidden_ids:
            hidden[cfg.num_layers] = x
        if kv is not None:
            cache = KVCache(kv[0], kv[1], cache.lengths)
        logits = None
        if compute_logits:
            if logit_indices is not None:
                x = jnp.take_along_axis(x, logit_indices[:, :, None], axis=1)
            logits = jnp.einsum(
                "bth,hv->btv", x, self.head_weight(), preferred_element_type=jnp.float32
            )
        hid = jnp.stack([hidden[i] for i in hidden_ids], axis=2) if hidden_ids else None
        return ForwardOutput(logits, hid, cache, new_kv)


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
    write_cache: bool = True,
) -> ForwardOutput:
    """Pure forward over T new tokens.

    tokens, positions [B, T] int32 (positions are RoPE positions; with a cache the tokens occupy
    slots lengths[b] .. lengths[b] + T - 1 whatever their positions, so tree nodes can share a
    depth). mask [B, T, T] among the new tokens (see `causal_mask`); with a cache every query also
    sees the committed slots < lengths[b] (`models.attention.attend_cache`, as `cache_mask`).
    hidden_ids index HF's `hidden_states`: i < L is the
    input of layer i (0 = embeddings), L is the final normed hidden. write_cache=False: the cache
    is only read and the new tokens' K/V come back as `new_kv` [L, B, T, K, D] each (a tree verify
    then commits only its accepted path, `KVCache.append`). Keep `hidden_ids`, `compute_logits`,
    `write_cache` static under jit.
    """
    model = nnx.merge(graphdef, params)
    return model(tokens, positions, mask, cache, tuple(hidden_ids), logit_indices, compute_logits, write_cache)


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
