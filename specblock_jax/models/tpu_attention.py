"""TPU attention kernels (Pallas), each with its cost stated for pricing (models/kernel_cost.py).

Shapes: B batch, T queries, N query heads, K kv heads (G = N / K), D head dim, S cache slots,
L layers.

- `causal_prefill`: JAX's shipped splash attention (jax.experimental.pallas.ops.tpu), causal, one
  MQA kernel per kv head (GQA): q [B, T, N, D], k/v [B, T, K, D] -> [B, T, N, D]. Never holds
  [T, T] scores; blocks above the diagonal are skipped.
- `prefix_attention`: the committed part of cascade attention. Every query of row b sees exactly
  the cache slots j < lengths[b]; the G query heads of a kv head and all T queries form one
  [G*T, D] block, so each live cache block is read once per (row, kv head), blocks past the row's
  length are neither read (their block index repeats: no DMA) nor computed. It reads layer
  `layer` of the stacked cache [L, B, K, S, D] in place (scalar-prefetched index, no slice copy).
  None of the shipped kernels fits this: ragged paged attention masks causally among the new
  tokens (no tree), paged attention wants [K, pages, page, D] (a transpose of this cache).

Both run under `shard_map` when a sharding plan is active (parallel/activation.py): rows over
"data", kv heads (and their query heads) over "model", as the cache is laid out.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec as P

from specblock_jax.models.kernel_cost import KernelCost, estimate, kernel_scope
from specblock_jax.parallel.activation import active_plan

PREFIX_BLOCK = 512  # cache slots per kernel step
SPLASH_BLOCK = 512  # splash query / key block


def _block(size: int, most: int) -> int:
    b = most
    while size % b:
        b //= 2
    return b


# ------------------------------------------------------------------ causal prefill (splash)


def _splash_cost(b, t, n, k, d, itemsize, block) -> KernelCost:
    """Causal attention: 4 D FLOPs per visible (query, key) pair and head; the MQA kernel reads
    q and o once and each kv block once per query head and query block at or below it."""
    pairs = t * (t + 1) / 2
    nq = t // block
    kv_blocks = nq * (nq + 1) / 2
    hbm = itemsize * (2 * b * n * t * d + 2 * b * n * kv_blocks * block * d)
    return KernelCost("splash_causal", 4 * b * n * pairs * d, hbm, b * n * pairs, "analytic")


def _causal_local(q, k, v, *, interpret: bool):
    b, t, n, d = q.shape
    kh = k.shape[2]
    g = n // kh
    blk = _block(t, SPLASH_BLOCK)
    sizes = splash.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk)
    mask = splash.MultiHeadMask([splash.CausalMask((t, t))] * g)
    kernel = splash.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)
    qg = (q / math.sqrt(d)).astype(q.dtype).reshape(b, t, kh, g, d).transpose(0, 2, 3, 1, 4)
    kt, vt = (jnp.swapaxes(x, 1, 2) for x in (k, v))  # [B, K, T, D]
    cost = _splash_cost(b, t, n, kh, d, q.dtype.itemsize, blk)
    with kernel_scope(cost):
        out = jax.vmap(jax.vmap(kernel))(qg, kt, vt)  # [B, K, G, T, D]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, d)


def causal_prefill(q: jax.Array, k: jax.Array, v: jax.Array, interpret: bool = False) -> jax.Array:
    """Causal GQA attention among T new tokens (T a multiple of 128 on TPU)."""
    fn = functools.partial(_causal_local, interpret=interpret)
    specs = _specs(k.shape[2], q.shape[0])
    if specs is None:
        return fn(q, k, v)
    row = P(specs.batch, None, specs.heads, None)
    return jax.shard_map(fn, mesh=specs.mesh, in_specs=(row, row, row), out_specs=row, check_vma=False)(q, k, v)


# ------------------------------------------------------------------ committed prefix (own kernel)


def _prefix_kernel(lengths_ref, layer_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, m_sc, l_sc, acc_sc, *,
                   block: int, scale: float):
    b, j = pl.program_id(0), pl.program_id(2)
    length = lengths_ref[b]

    @pl.when(j == 0)
    def _():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    @pl.when(j * block < length)
    def _():
        q, k, v = q_ref[...], k_ref[...], v_ref[...]  # [GT, D], [C, D], [C, D]
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
        slots = j * block + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(slots < length, s, -jnp.inf)
        # the last block may reach past S: zero what lies beyond the length (0 x NaN is NaN)
        v = jnp.where(j * block + jax.lax.broadcasted_iota(jnp.int32, v.shape, 0) < length, v, 0)
        m_prev = m_sc[...]  # [GT, 1]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))  # finite: slot j*C is live
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m_prev - m_new)
        l_sc[...] = alpha * l_sc[...] + jnp.sum(p, axis=1, keepdims=True)
        acc_sc[...] = alpha * acc_sc[...] + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        m_sc[...] = m_new

    @pl.when(j == pl.num_programs(2) - 1)
    def _():
        l = l_sc[...]
        seen = l > 0
        o_ref[...] = jnp.where(seen, acc_sc[...] / jnp.where(seen, l, 1.0), 0.0)
        lse = jnp.where(seen, m_sc[...] + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)
        lse_ref[...] = jnp.broadcast_to(lse, lse_ref.shape)


def _prefix_local(q, k_cache, v_cache, layer, lengths, *, interpret: bool):
    b, t, n, d = q.shape
    _, _, kh, s, _ = k_cache.shape
    g = n // kh
    gt = g * t
    c = min(PREFIX_BLOCK, s)
    qg = q.reshape(b, t, kh, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kh, gt, d)

    def kv_index(bi, h, j, lengths_ref, layer_ref):  # past the row's last live block: repeat it
        last = jnp.maximum((lengths_ref[bi] + c - 1) // c - 1, 0)
        return layer_ref[0], bi, h, jnp.minimum(j, last), 0

    item = k_cache.dtype.itemsize
    cost = KernelCost("cache_prefix", 4 * b * n * t * s * d,
                      2 * b * kh * s * d * item + b * n * t * d * (q.dtype.itemsize + 4), b * n * t * s,
                      "CostEstimate")
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2, grid=(b, kh, pl.cdiv(s, c)),
        in_specs=[pl.BlockSpec((None, None, gt, d), lambda bi, h, j, *_: (bi, h, 0, 0)),
                  pl.BlockSpec((None, None, None, c, d), kv_index),
                  pl.BlockSpec((None, None, None, c, d), kv_index)],
        out_specs=[pl.BlockSpec((None, None, gt, d), lambda bi, h, j, *_: (bi, h, 0, 0)),
                   pl.BlockSpec((None, None, gt, 128), lambda bi, h, j, *_: (bi, h, 0, 0))],
        scratch_shapes=[pltpu.VMEM((gt, 1), jnp.float32), pltpu.VMEM((gt, 1), jnp.float32),
                        pltpu.VMEM((gt, d), jnp.float32)])
    call = pl.pallas_call(
        functools.partial(_prefix_kernel, block=c, scale=1 / math.sqrt(d)), grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct((b, kh, gt, d), jnp.float32),
                   jax.ShapeDtypeStruct((b, kh, gt, 128), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        cost_estimate=estimate(cost), interpret=interpret, name="cache_prefix")
    with kernel_scope(cost):
        out, lse = call(lengths.astype(jnp.int32), jnp.reshape(layer, (1,)).astype(jnp.int32), qg, k_cache, v_cache)
    out = out.reshape(b, kh, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, n, d)
    lse = lse[..., 0].reshape(b, kh, g, t).transpose(0, 3, 1, 2).reshape(b, t, n)
    return out, lse


def prefix_attention(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, layer: jax.Array | None,
                     lengths: jax.Array, interpret: bool = False) -> tuple[jax.Array, jax.Array]:
    """q [B, T, N, D] over slots j < lengths[b] of layer `layer` [] int32 of k/v [L, B, K, S, D]
    (or of a heads-first [B, K, S, D] with layer None) -> (out [B, T, N, D] fp32, lse [B, T, N]
    fp32; 0 and -inf for a row of length 0), as models/online_softmax.py. S a multiple of 16."""
    if layer is None:
        k_cache, v_cache, layer = k_cache[None], v_cache[None], jnp.int32(0)
    fn = functools.partial(_prefix_local, interpret=interpret)
    specs = _specs(k_cache.shape[2], q.shape[0])
    if specs is None:
        return fn(q, k_cache, v_cache, layer, lengths)
    row = P(specs.batch, None, specs.heads, None)
    cache = P(None, specs.batch, specs.heads, None, None)
    return jax.shard_map(fn, mesh=specs.mesh, in_specs=(row, cache, cache, P(), P(specs.batch)),
                         out_specs=(row, P(specs.batch, None, specs.heads)), check_vma=False)(
        q, k_cache, v_cache, layer, lengths)


# ------------------------------------------------------------------ sharding


class _Specs(NamedTuple):
    """Mesh axes for the rows and the kv heads of a kernel call under the active plan."""
    mesh: Any
    batch: str | None
    heads: str | None


def _specs(kv_heads: int, batch: int) -> _Specs | None:
    """None without a plan; else rows over "data" and kv heads over "model" where they divide
    (the cache's own layout, parallel/mesh.py), each otherwise replicated."""
    plan = active_plan()
    if plan is None:
        return None
    spec = plan.spec(("batch", "kv_heads"), (batch, kv_heads))
    return _Specs(plan.mesh, spec[0], spec[1])


def supported(head_dim: int, slots: int) -> bool:
    """Whether the TPU kernels take these sizes (a lane-aligned head dim and slot count)."""
    return head_dim % 128 == 0 and slots % 16 == 0
