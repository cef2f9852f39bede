"""Transformer building blocks (Flax NNX): RMSNorm, rotary embeddings, GQA attention, SwiGLU MLP.

Shapes: B batch, T new (query) tokens, S key/value slots, H hidden, N query heads, K kv heads,
G = N // K query heads per kv head, D head dim, F MLP width.
Weights are stored in the layout `x @ W` uses ([in, out], heads split out), not HF's [out, in].
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specblock_jax.models.attention import attend, attend_cache, attend_prefix, write_heads_first
from specblock_jax.models.config import ModelConfig, RopeConfig

_INIT_STD = 0.02  # HF initializer_range


def normal_param(rngs: nnx.Rngs, shape, dtype) -> nnx.Param:
    """A weight of `shape` drawn from N(0, 0.02^2) (HF's initializer_range), stored as `dtype`."""
    return nnx.Param((jax.random.normal(rngs.params(), shape, jnp.float32) * _INIT_STD).astype(dtype))


class RMSNorm(nnx.Module):
    """y = w * x / rms(x), normalised in fp32 and cast back before the scale (as HF does)."""

    def __init__(self, dim: int, eps: float, dtype):
        self.eps = eps
        self.weight = nnx.Param(jnp.ones((dim,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...] * y.astype(x.dtype)


# ---------------------------------------------------------------------- rotary embeddings


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> np.ndarray:
    """Inverse frequencies [D/2] (float64 numpy, a trace-time constant), with rope scaling."""
    inv = 1.0 / (rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if rope.kind == "linear":
        return inv / rope.factor
    if rope.kind == "llama3":
        low_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
        high_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / rope.factor, inv)
        smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, scaled)
    return inv


def rope_cos_sin(positions: jax.Array, rope: RopeConfig, head_dim: int, dtype):
    """cos, sin [B, T, D] for integer positions [B, T] in HF's rotate-half layout."""
    inv = jnp.asarray(rope_inv_freq(rope, head_dim), jnp.float32)
    freqs = positions.astype(jnp.float32)[..., None] * inv  # [B, T, D/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, T, heads, D] rotated by position: x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]


# ---------------------------------------------------------------------- attention


def write_kv(cache: jax.Array, new: jax.Array, starts: jax.Array, layer: jax.Array | None = None
             ) -> jax.Array:
    """Writes new [B, T, K, D] at slot starts[b] of each sequence, into a heads-first cache
    [B, K, S, D] (a drafter's), or into layer `layer` of a stacked cache [L, B, K, S, D] (the
    target's; in place inside a scan over layers).

    The caller guarantees starts[b] + T <= S (dynamic_update_slice would clamp otherwise).
    """
    new = new.astype(cache.dtype)
    if layer is not None:  # a scatter of the B x K x T new rows, in place (no copy of the layer)
        b, t, k = new.shape[:3]
        slots = starts[:, None] + jnp.arange(t, dtype=starts.dtype)[None, :]  # [B, T]
        index = (layer, jnp.arange(b)[:, None, None], jnp.arange(k)[None, :, None], slots[:, None, :])
        return cache.at[index].set(jnp.swapaxes(new, 1, 2), mode="promise_in_bounds")

    return write_heads_first(cache, new, starts)


def take_rows(x: jax.Array, rows: jax.Array) -> jax.Array:
    """x [B, T, ...] at rows [B, Q] (indices into T) -> [B, Q, ...]."""
    return jnp.take_along_axis(x, rows.reshape(rows.shape + (1,) * (x.ndim - 2)), axis=1)


class Attention(nnx.Module):
    """GQA self-attention with optional Qwen3 q/k norm; reads and writes one layer of a KV cache."""

    def __init__(self, cfg: ModelConfig, dtype, rngs: nnx.Rngs):
        h, n, k, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = normal_param(rngs, (h, n, d), dtype)
        self.k_proj = normal_param(rngs, (h, k, d), dtype)
        self.v_proj = normal_param(rngs, (h, k, d), dtype)
        self.o_proj = normal_param(rngs, (n, d, h), dtype)
        if cfg.attention_bias:
            self.q_bias = nnx.Param(jnp.zeros((n, d), dtype))
            self.k_bias = nnx.Param(jnp.zeros((k, d), dtype))
            self.v_bias = nnx.Param(jnp.zeros((k, d), dtype))
            self.o_bias = nnx.Param(jnp.zeros((h,), dtype))
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps, dtype)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps, dtype)
        self.bias = cfg.attention_bias
        self.qk_norm = cfg.qk_norm
        self.cache_attention = cfg.attention

    def __call__(self, x, cos, sin, mask, kv_cache=None, starts=None, kv_len=None, layer=None, query_rows=None,
                 write=True):
        """x [B, T, H]; mask [B, T, S] over a heads-first cache (S slots), else [B, T, T] among
        the new tokens (with a stacked cache every slot < starts[b] is visible as well).

        kv_cache: (k, v) each heads-first [B, K, S, D], or stacked [L, B, K, S, D] with this layer's
        index `layer` [] int32 (attended by `attend_cache`), or None; the new K/V are written at
        starts [B]. kv_len [] int32 or None (heads-first cache): no query sees a cache slot >=
        kv_len (attention then costs what the sequence is long, models/attention.py). query_rows [B, Q] int32 or None: the K/V of
        all T rows are computed (and written) as without it, but only rows query_rows[b] query
        (x, cos, sin and mask rows taken there). Returns (out [B, T or Q, H], updated (k, v) or None).
        write=False (a stacked cache): the cache is only read and the new (k, v) [B, T, K, D] come
        back in its place.
        """
        k, v = self.key_value(x, cos, sin)
        if query_rows is not None:
            x, cos, sin, mask = (take_rows(a, query_rows) for a in (x, cos, sin, mask))
        q = self.query(x, cos, sin)
        if kv_cache is not None and not write:
            att = attend_cache(q, k, v, mask, kv_cache[0], kv_cache[1], layer, starts, self.cache_attention,
                               written=False)
            return self.output(att), (k, v)
        if kv_cache is not None:
            kv_cache = (write_kv(kv_cache[0], k, starts, layer), write_kv(kv_cache[1], v, starts, layer))
            if layer is None:
                att = attend_prefix(q, kv_cache[0], kv_cache[1], mask, kv_len)
            else:
                att = attend_cache(q, k, v, mask, kv_cache[0], kv_cache[1], layer, starts, self.cache_attention)
        else:
            att = attend(q, k, v, mask)
        return self.output(att), kv_cache

    def project(self, x, cos, sin):
        """x [B, T, H] -> q [B, T, N, D], k/v [B, T, K, D], RoPE applied (for a caller's own attention)."""
        return (self.query(x, cos, sin),) + self.key_value(x, cos, sin)

    def query(self, x, cos, sin):
        """x [B, T, H] -> q [B, T, N, D] (bias, q norm, RoPE)."""
        q = jnp.einsum("bth,hnd->btnd", x, self.q_proj[...])
        if self.bias:
            q = q + self.q_bias[...]
        if self.qk_norm:
            q = self.q_norm(q)
        return apply_rope(q, cos, sin)

    def key_value(self, x, cos, sin):
        """x [B, T, H] -> k, v [B, T, K, D] (bias, k norm, RoPE on k)."""
        k = jnp.einsum("bth,hkd->btkd", x, self.k_proj[...])
        v = jnp.einsum("bth,hkd->btkd", x, self.v_proj[...])
        if self.bias:
            k, v = k + self.k_bias[...], v + self.v_bias[...]
        if self.qk_norm:
            k = self.k_norm(k)
        return apply_rope(k, cos, sin), v

    def output(self, att):
        """att [B, T, N, D] -> [B, T, H]."""
        out = jnp.einsum("btnd,ndh->bth", att, self.o_proj[...])
        return out + self.o_bias[...] if self.bias else out


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int, dtype, rngs: nnx.Rngs):
        self.gate_proj = normal_param(rngs, (hidden, intermediate), dtype)
        self.up_proj = normal_param(rngs, (hidden, intermediate), dtype)
        self.down_proj = normal_param(rngs, (intermediate, hidden), dtype)

    def __call__(self, x):
        return (jax.nn.silu(x @ self.gate_proj[...]) * (x @ self.up_proj[...])) @ self.down_proj[...]


class DecoderLayer(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, dtype, rngs: nnx.Rngs):
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = Attention(cfg, dtype, rngs)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, dtype, rngs)

    def __call__(self, x, cos, sin, mask, kv_cache=None, starts=None, kv_len=None, layer=None, query_rows=None,
                 write=True):
        """As `Attention.__call__`; with query_rows [B, Q], every row's K/V is written but only
        those rows go through attention and the MLP: out [B, Q, H] equals the full out at them."""
        a, kv_cache = self.self_attn(self.input_layernorm(x), cos, sin, mask, kv_cache, starts, kv_len, layer,
                                     query_rows, write)
        if query_rows is not None:
            x = take_rows(x, query_rows)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, kv_cache
