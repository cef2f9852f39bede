"""Masked grouped-query attention, and attention whose cost follows the sequence, not the cache.

Shapes: B batch, T queries, S key/value slots, N query heads, K kv heads, D head dim.

A decode-time KV cache has a static size S (prompt bucket + budget + tree scratch), but at any step
only its first `kv_len` slots (the batch's longest sequence plus the new tokens) can be visible.
`attend_prefix` attends over a static prefix of the cache just long enough for `kv_len`, chosen at
run time by `lax.switch` among a few length buckets (`length_buckets`: 64, 96, 128, 192, ...,
each at most 1.5x the previous, up to S / 2, then S), so one executable serves every length
without recompiling and a step costs what the sequence is long (within 1.5x, or at most the
whole cache once the sequence fills half of it: a bucket copies its prefix, which only pays well
below S). `switch_on_length` is the
same dispatch for any computation over a cache prefix (DFlash concatenates its block's keys).

The interface is `(q, k_cache, v_cache, mask, kv_len)`; an accelerator kernel that reads only the
live slots (Pallas ragged / paged attention) can replace the bucketed dense path behind it.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

MIN_BUCKET = 64


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Masked softmax attention with grouped kv heads.

    q [B, T, N, D], k/v [B, S, K, D], mask [B, T, S] (True = query may see key) -> [B, T, N, D].
    Scores and softmax in fp32. A row with no visible key yields a uniform average, not NaN.
    """
    b, t, n, d = q.shape
    kv = k.shape[2]
    qg = q.reshape(b, t, kv, n // kv, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32)
    scores = scores / math.sqrt(d)
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, n, d)


def length_buckets(size: int, minimum: int = MIN_BUCKET) -> tuple[int, ...]:
    """Static prefix lengths up to half of `size`, then `size`: 64, 96, 128, 192, 256, ...

    A bucket below the whole cache slices (copies) its prefix before attending, so on a
    bandwidth-bound step it pays only well below the cache size: none is used above size / 2.
    length_buckets(448) == (64, 96, 128, 192, 448); length_buckets(100) == (100,).
    """
    out, b = [], minimum
    while b <= size // 2:
        out += [b] + ([b * 3 // 2] if b * 3 // 2 <= size // 2 else [])
        b *= 2
    return tuple(out) + (size,)


def switch_on_length(kv_len: jax.Array, size: int, fn: Callable, *operands):
    """fn(n, *operands) for the smallest bucket n of `length_buckets(size)` with n >= kv_len.

    kv_len [] int32 (traced): no query may see a slot >= kv_len, so fn may drop slots >= n.
    Every bucket is compiled into one `lax.switch`; one runs per call.
    """
    sizes = length_buckets(size)
    if len(sizes) == 1:
        return fn(size, *operands)
    index = jnp.searchsorted(jnp.asarray(sizes, jnp.int32), kv_len.astype(jnp.int32))
    branches = [lambda ops, n=n: fn(n, *ops) for n in sizes]
    return jax.lax.switch(jnp.minimum(index, len(sizes) - 1), branches, operands)


def attend_prefix(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                  kv_len: jax.Array | None) -> jax.Array:
    """`attend` over the first kv_len slots of a heads-first cache: q [B, T, N, D], k/v
    [B, K, S, D] (the layout the dot reads: no transpose of the cache), mask [B, T, S] hiding
    every slot >= kv_len [] int32 (None: all S slots, the dense path)."""
    if kv_len is None:
        return attend_heads_first(q, k, v, mask)
    return switch_on_length(kv_len, k.shape[2],
                            lambda n, q, k, v, m: attend_heads_first(q, k[:, :, :n], v[:, :, :n], m[..., :n]),
                            q, k, v, mask)


def attend_stacked(q: jax.Array, k: jax.Array, v: jax.Array, layer: jax.Array, mask: jax.Array,
                   kv_len: jax.Array | None) -> jax.Array:
    """`attend` over layer `layer` [] int32 of a stacked heads-first cache k/v [L, B, K, S, D], its
    first kv_len slots (None: all S): each length bucket slices just its prefix of that layer, so
    a step reads and copies O(kv_len) slots, never the whole cache."""
    _, b, kh, s, d = k.shape

    def prefix(n, q, k, v, m):
        kn = jax.lax.dynamic_slice(k, (layer, 0, 0, 0, 0), (1, b, kh, n, d))[0]
        vn = jax.lax.dynamic_slice(v, (layer, 0, 0, 0, 0), (1, b, kh, n, d))[0]
        return attend_heads_first(q, kn, vn, m[..., :n])

    if kv_len is None:
        return prefix(s, q, k, v, mask)
    return switch_on_length(kv_len, s, prefix, q, k, v, mask)


def attend_heads_first(q, kt, vt, mask):
    """`attend` with k/v laid out [B, K, S, D]."""
    b, t, n, d = q.shape
    kv = kt.shape[1]
    qg = q.reshape(b, t, kv, n // kv, d)
    scores = jnp.einsum("btkgd,bksd->bkgts", qg, kt, preferred_element_type=jnp.float32) / math.sqrt(d)
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(vt.dtype)
    return jnp.einsum("bkgts,bksd->btkgd", probs, vt).reshape(b, t, n, d)
