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

The target's cache attention is `attend_cache`: the new tokens' mask [B, T, T] and the committed
lengths [B] describe what a query sees, and the backend chooses how:
- "dense": one softmax over a [B, T, S] mask built from them (`cache_mask`), over a length bucket
  of the cache ("bucketed") or all of it ("full", the reference). On CPU "bucketed" keeps this
  path while T x S <= DENSE_MAX (decoding and prompts of the embedded target: its tokens stay
  bit-identical to the dense path's).
- "cascade" (FlashInfer's name): the committed slots under a length mask only (TPU: the Pallas
  kernel of models/tpu_attention.py; elsewhere key blocks with an online softmax, reading the
  blocks below the longest row only) plus the new tokens under the [T, T] mask, merged by
  log-sum-exp (models/online_softmax.py). No [B, T, S] mask and no [B, N, T, S] scores exist.
  A forward of at least PREFILL_ROWS tokens on an empty cache under a causal mask (the prompt's
  prefill, `is_prompt`) runs a causal kernel instead: splash attention on TPU,
  `jax.nn.dot_product_attention` on GPU (`apply` chooses at run time, one `lax.cond` around its
  layer loop; any other such forward takes the blockwise cascade, its queries in chunks).
"cascade" is also a setting of its own: the cascade path whatever the platform and sizes.
A row that sees no key yields a uniform average on the dense path and 0 on the others; no caller
reads it.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

from specblock_jax.models import online_softmax, tpu_attention
from specblock_jax.models.kv_cache import cache_mask
from specblock_jax.parallel.activation import active_plan

MIN_BUCKET = 64
DENSE_MAX = 1 << 21  # on CPU, "bucketed" attends densely while T x S stays at most this
PREFILL_ROWS = 1024  # forwards this long on an empty cache try the causal prefill kernel


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
                   kv_len: jax.Array | None, fresh: tuple | None = None) -> jax.Array:
    """`attend` over layer `layer` [] int32 of a stacked heads-first cache k/v [L, B, K, S, D], its
    first kv_len slots (None: all S): each length bucket slices just its prefix of that layer, so
    a step reads and copies O(kv_len) slots, never the whole cache. fresh (k_new, v_new [B, T, K, D],
    starts [B]): new K/V the cache does not hold, written into the sliced copy at starts (the cache
    itself is only read)."""
    _, b, kh, s, d = k.shape

    def prefix(n, q, k, v, m):
        kn = jax.lax.dynamic_slice(k, (layer, 0, 0, 0, 0), (1, b, kh, n, d))[0]
        vn = jax.lax.dynamic_slice(v, (layer, 0, 0, 0, 0), (1, b, kh, n, d))[0]
        if fresh is not None:
            k_new, v_new, starts = fresh
            kn, vn = write_heads_first(kn, k_new, starts), write_heads_first(vn, v_new, starts)
        return attend_heads_first(q, kn, vn, m[..., :n])

    if kv_len is None:
        return prefix(s, q, k, v, mask)
    return switch_on_length(kv_len, s, prefix, q, k, v, mask)


def write_heads_first(cache: jax.Array, new: jax.Array, starts: jax.Array) -> jax.Array:
    """new [B, T, K, D] written at slot starts[b] of a heads-first cache [B, K, S, D]
    (starts[b] + T <= S)."""
    def one(c, x, st):  # c [K, S, D], x [T, K, D]
        return jax.lax.dynamic_update_slice(c, jnp.swapaxes(x, 0, 1).astype(c.dtype), (0, st, 0))
    return jax.vmap(one)(cache, new, starts)


def attend_heads_first(q, kt, vt, mask):
    """`attend` with k/v laid out [B, K, S, D]."""
    b, t, n, d = q.shape
    kv = kt.shape[1]
    qg = q.reshape(b, t, kv, n // kv, d)
    scores = jnp.einsum("btkgd,bksd->bkgts", qg, kt, preferred_element_type=jnp.float32) / math.sqrt(d)
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(vt.dtype)
    return jnp.einsum("bkgts,bksd->btkgd", probs, vt).reshape(b, t, n, d)


def platform() -> str:
    """The platform being compiled for: the active plan's devices (aot: a TPU topology from this
    CPU), else JAX's default backend."""
    plan = active_plan()
    return plan.mesh.devices.flat[0].platform if plan is not None else jax.default_backend()


def cache_path(mode: str, t: int, s: int) -> str:
    """"dense" or "cascade" for a forward of T new tokens over S cache slots; mode is
    `ModelConfig.attention` ("bucketed", "full" or "cascade")."""
    if mode == "full" or (mode == "bucketed" and platform() == "cpu" and t * s <= DENSE_MAX):
        return "dense"
    return "cascade"


def prompt_kernel(mode: str, t: int, head_dim: int, slots: int, dtype) -> bool:
    """Whether a forward of T new tokens over S cache slots in `dtype` tries the causal prompt
    kernel (T >= PREFILL_ROWS; on GPU in 16-bit dtypes, which cuDNN's flash attention takes: in
    fp32 `dot_product_attention` would build the scores; `apply` chooses it where `is_prompt`)."""
    plat = platform()
    if mode == "full" or t < PREFILL_ROWS:
        return False
    if plat == "gpu":
        return jnp.dtype(dtype).itemsize == 2
    return plat == "tpu" and tpu_attention.supported(head_dim, slots)


def is_prompt(mask: jax.Array, lengths: jax.Array) -> jax.Array:
    """[] bool: the cache is empty (lengths [B] all 0) and mask [B, T, T] is causal."""
    t = mask.shape[-1]
    return (jnp.max(lengths) == 0) & jnp.all(mask == jnp.tril(jnp.ones((t, t), bool)))


def attend_cache(q: jax.Array, k_new: jax.Array, v_new: jax.Array, mask: jax.Array | None, k_cache: jax.Array,
                 v_cache: jax.Array, layer: jax.Array, lengths: jax.Array, mode: str, written: bool = True
                 ) -> jax.Array:
    """The target's attention over layer `layer` [] int32 of its stacked cache k/v [L, B, K, S, D]
    and the new K/V k_new/v_new [B, T, K, D], which the cache already holds at slots
    lengths[b] .. + T - 1 when `written` (else it is only read: a tree verify leaves it untouched).

    q [B, T, N, D]; mask [B, T, T] among the new tokens, or None for a prompt (`is_prompt`: causal,
    the cache empty); lengths [B] committed slots (all visible to every query). -> [B, T, N, D] in
    q's dtype. Equal, to fp32 rounding, to `attend` under `cache_mask(mask, lengths, S)` (module
    docstring: which path, and rows that see nothing).
    """
    if mask is None:
        if platform() == "tpu":
            return tpu_attention.causal_prefill(q, k_new, v_new)
        return jax.nn.dot_product_attention(q, k_new, v_new, is_causal=True, implementation="cudnn")
    t, s = q.shape[1], k_cache.shape[3]
    if cache_path(mode, t, s) == "dense":
        kv_len = jnp.max(lengths) + t if mode == "bucketed" else None
        fresh = None if written else (k_new, v_new, lengths)
        return attend_stacked(q, k_cache, v_cache, layer, cache_mask(mask, lengths, s), kv_len, fresh)
    # the TPU kernel for the committed part, except in a prompt-sized forward: there it sits in
    # the branch a prompt does not take, yet aot adds kernel costs per call in the program
    kernel = platform() == "tpu" and tpu_attention.supported(q.shape[-1], s) and t < PREFILL_ROWS

    def rows(q, mask):
        if kernel:
            committed = tpu_attention.prefix_attention(q, k_cache, v_cache, layer, lengths)
        else:
            committed = online_softmax.attend_prefix_blocks(q, k_cache, v_cache, lengths, layer)
        new = online_softmax.attend_masked_blocks(q, k_new, v_new, mask)
        return online_softmax.merge(committed, new).astype(q.dtype)

    return online_softmax.by_query_chunks(rows, q, mask)
