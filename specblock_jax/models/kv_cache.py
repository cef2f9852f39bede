"""Static-shape KV cache with per-sequence lengths.

One k and one v buffer for all layers, each [L, B, K, S, D] (kv heads before slots, the layout the
attention dot reads, so a step never transposes the cache; S = max_len fixed at creation); `lengths[b]`
counts the committed slots of sequence b. A forward writes its T new tokens at slots
lengths[b] .. lengths[b] + T - 1 without advancing `lengths`; the caller then commits them with
`advance` (plain decoding). A tree verify only reads the cache (`apply(write_cache=False)`) and
commits its accepted path's K/V with `append`.
Pass the cache through jit boundaries as a donated argument.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from specblock_jax.models.config import ModelConfig


class KVCache(NamedTuple):
    k: jax.Array  # [L, B, K, S, D]
    v: jax.Array  # [L, B, K, S, D]
    lengths: jax.Array  # [B] int32, committed slots per sequence

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    def advance(self, n: jax.Array) -> "KVCache":
        """Commits n [B] (or scalar) freshly written slots per sequence."""
        return self._replace(lengths=self.lengths + jnp.asarray(n, jnp.int32))

    def append(self, k_new: jax.Array, v_new: jax.Array, count: jax.Array) -> "KVCache":
        """Commits new K/V rows k_new/v_new [L, B, M, K, D] (e.g. a tree's accepted path, `take_path`)
        at slots lengths[b] .. + M - 1 and advances lengths by count [B] <= M: rows past count are
        written but stay invisible. Requires lengths[b] + M <= max_len."""
        put = jax.vmap(lambda c, x, s: jax.lax.dynamic_update_slice(c, x, (0, 0, s, 0)), in_axes=(1, 1, 0),
                       out_axes=1)  # c [L, K, S, D], x [L, K, M, D] per row

        def write(buf, new):
            return put(buf, jnp.swapaxes(new, 2, 3).astype(buf.dtype), self.lengths)

        return KVCache(write(self.k, k_new), write(self.v, v_new), self.lengths + jnp.asarray(count, jnp.int32))


def take_path(new_kv: tuple[jax.Array, jax.Array], rows: jax.Array) -> tuple[jax.Array, jax.Array]:
    """new_kv (k, v) [L, B, T, K, D] (a forward's `new_kv`) at rows [B, M] (indices into T)
    -> (k, v) [L, B, M, K, D]."""
    index = rows.astype(jnp.int32)[None, :, :, None, None]
    return tuple(jnp.take_along_axis(x, index, axis=2) for x in new_kv)


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache (zeros, lengths 0). dtype defaults to the model's compute dtype."""
    dtype = dtype or jnp.dtype(cfg.dtype)
    shape = (cfg.num_layers, batch_size, cfg.num_kv_heads, max_len, cfg.head_dim)
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch_size,), jnp.int32))


def cache_mask(new_mask: jax.Array, lengths: jax.Array, max_len: int) -> jax.Array:
    """Combines a mask among T new tokens with the committed cache prefix.

    new_mask [B, T, T] (query t may see new token t'), lengths [B] -> [B, T, S] where slot j is
    visible if j < lengths[b] (committed) or j = lengths[b] + t' with new_mask[b, t, t'].
    Example, lengths=[2], T=2 causal, S=5:   query 0 -> 1 1 1 0 0
                                             query 1 -> 1 1 1 1 0
    """
    t = new_mask.shape[-1]
    slots = jnp.arange(max_len)[None, :]  # [1, S]
    rel = slots - lengths[:, None]  # [B, S] offset of slot j among the new tokens
    is_new = (rel >= 0) & (rel < t)
    new_part = jnp.take_along_axis(
        new_mask, jnp.broadcast_to(jnp.clip(rel, 0, t - 1)[:, None, :], new_mask.shape[:2] + (max_len,)),
        axis=2,
    )
    return (slots < lengths[:, None])[:, None, :] | (is_new[:, None, :] & new_part)


# Static shapes: prompts are right-padded to a length bucket, caches sized to a multiple of 64.
MIN_BUCKET = 16


def length_bucket(n: int, minimum: int = MIN_BUCKET) -> int:
    """Smallest power of two >= n (and >= minimum)."""
    return max(minimum, 1 << (max(n, 1) - 1).bit_length())


def cache_length(prompt_bucket: int, max_new_tokens: int, extra: int = 0) -> int:
    """Static cache size for a prompt bucket: room for the budget plus `extra` scratch slots,
    rounded up to a multiple of 64."""
    need = prompt_bucket + max_new_tokens + extra
    return -(-need // 64) * 64
