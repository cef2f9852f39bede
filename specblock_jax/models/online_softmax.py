"""Attention in key blocks with an online softmax, and the log-sum-exp merge of attention parts.

Shapes: B batch, T queries, N query heads, K kv heads (G = N / K per kv head), D head dim, C key
block. A part of attention returns (out, lse): out [B, T, N, D] fp32 normalised over the keys that
part saw, lse [B, T, N] fp32 their log-sum-exp of scaled scores (-inf where the row saw none, out
then 0). Two parts over disjoint key sets merge exactly (`merge`): softmax over the union.

No [B, N, T, S] scores and no [B, T, S] mask is ever held: a block's scores are [B, K, G, T, C].
This is the portable path (XLA on CPU and GPU); models/tpu_attention.py holds the TPU kernels.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

BLOCK = 512  # keys per block (and queries per chunk in `by_query_chunks`)


def block_size(size: int, most: int = BLOCK) -> int:
    """The largest power of two <= most dividing size (caches are multiples of 64): 448 -> 64."""
    b = most
    while size % b:
        b //= 2
    return b


def _grouped(q: jax.Array, kv_heads: int) -> jax.Array:
    """q [B, T, N, D] -> [B, K, G, T, D] scaled by 1/sqrt(D), fp32."""
    b, t, n, d = q.shape
    qg = q.reshape(b, t, kv_heads, n // kv_heads, d).transpose(0, 2, 3, 1, 4)
    return qg.astype(jnp.float32) / math.sqrt(d)


def _ungrouped(x: jax.Array) -> jax.Array:
    """[B, K, G, T, ...] -> [B, T, N, ...]."""
    b, k, g, t = x.shape[:4]
    return jnp.moveaxis(x, 3, 1).reshape((b, t, k * g) + x.shape[4:])


def attend_blocks(q: jax.Array, kv_heads: int, key_block: Callable, visible: Callable, num_blocks
                  ) -> tuple[jax.Array, jax.Array]:
    """Online-softmax attention over key blocks 0 .. num_blocks - 1.

    q [B, T, N, D] over K = kv_heads; key_block(i) -> (k, v) each [B, K, C, D] (block i's keys);
    visible(i) -> [B, T, C] bool (query t may see key c of block i); num_blocks an int or a traced
    [] int32 (a dynamic trip count: only blocks below it are read). Returns (out, lse) as above.
    """
    qg = _grouped(q, kv_heads)  # [B, K, G, T, D]
    stat = qg.shape[:4]
    init = (jnp.full(stat, -jnp.inf), jnp.zeros(stat), jnp.zeros(qg.shape))

    def body(i, carry):
        m, l, acc = carry
        k, v = key_block(i)
        s = jnp.einsum("bkgtd,bkcd->bkgtc", qg, k.astype(jnp.float32))
        s = jnp.where(visible(i)[:, None, None], s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # a row that saw nothing yet stays at 0
        p = jnp.exp(s - safe[..., None])
        alpha = jnp.exp(m - safe)
        acc = acc * alpha[..., None] + jnp.einsum("bkgtc,bkcd->bkgtd", p, v.astype(jnp.float32))
        return m_new, l * alpha + jnp.sum(p, axis=-1), acc

    m, l, acc = jax.lax.fori_loop(0, num_blocks, body, init)
    seen = l > 0
    out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None], 0.0)
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)
    return _ungrouped(out), _ungrouped(lse)


def attend_prefix_blocks(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array,
                         layer: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Queries q [B, T, N, D] over the committed slots j < lengths[b] of a heads-first cache k/v
    [B, K, S, D] (or layer `layer` of a stacked [L, B, K, S, D]); only the blocks below
    max(lengths) are read. -> (out, lse)."""
    s, d = k.shape[-2], k.shape[-1]
    c = block_size(s)
    bkd = k.shape[-4:-2]

    def key_block(i):
        if layer is None:
            start = (0, 0, i * c, 0)
            return tuple(jax.lax.dynamic_slice(x, start, bkd + (c, d)) for x in (k, v))
        start = (layer, 0, 0, i * c, 0)
        return tuple(jax.lax.dynamic_slice(x, start, (1,) + bkd + (c, d))[0] for x in (k, v))

    def visible(i):
        slots = i * c + jnp.arange(c)
        return jnp.broadcast_to((slots[None, :] < lengths[:, None])[:, None, :], (q.shape[0], q.shape[1], c))

    live = (jnp.max(lengths) + c - 1) // c
    return attend_blocks(q, k.shape[-3], key_block, visible, live.astype(jnp.int32))


def attend_masked_blocks(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array
                         ) -> tuple[jax.Array, jax.Array]:
    """Queries q [B, T, N, D] over keys k/v [B, M, K, D] under mask [B, T, M] (True = visible),
    in blocks of keys (one block when M <= BLOCK). -> (out, lse)."""
    m = k.shape[1]
    c = block_size(m)
    kt, vt = (jnp.swapaxes(x, 1, 2) for x in (k, v))  # [B, K, M, D]
    b, kh, _, d = kt.shape

    def key_block(i):
        return tuple(jax.lax.dynamic_slice(x, (0, 0, i * c, 0), (b, kh, c, d)) for x in (kt, vt))

    def visible(i):
        return jax.lax.dynamic_slice_in_dim(mask, i * c, c, axis=2)

    return attend_blocks(q, kh, key_block, visible, m // c)


def by_query_chunks(fn: Callable, q: jax.Array, mask: jax.Array, chunk: int = BLOCK) -> jax.Array:
    """fn(q, mask) -> [B, T, N, D], run on chunks of `chunk` query rows one after another (a long
    prompt's blocks then hold [B, K, G, chunk, C] scores, not [.., T, C]); q [B, T, N, D], mask
    [B, T, M]. One call when T <= chunk or chunk does not divide T."""
    b, t, n, d = q.shape
    if t <= chunk or t % chunk:
        return fn(q, mask)
    split = lambda x: jnp.moveaxis(x.reshape((b, t // chunk, chunk) + x.shape[2:]), 1, 0)  # noqa: E731
    out = jax.lax.map(lambda a: fn(*a), (split(q), split(mask)))  # [T / chunk, B, chunk, N, D]
    return jnp.moveaxis(out, 0, 1).reshape(b, t, n, d)


def merge(*parts: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Parts (out [B, T, N, D], lse [B, T, N]) over disjoint keys -> attention over their union
    [B, T, N, D] fp32 (0 for a row no part saw)."""
    lse = jnp.stack([p[1] for p in parts])  # [P, B, T, N]
    top = jnp.max(lse, axis=0)
    w = jnp.exp(lse - jnp.where(top == -jnp.inf, 0.0, top))  # 0 for a part that saw nothing
    total = jnp.sum(w, axis=0)
    w = w / jnp.where(total > 0, total, 1.0)
    return sum(w[i][..., None] * p[0] for i, p in enumerate(parts))
