"""Sharding constraints inside traced code, driven by the plan active while tracing.

The decoding loop builds its KV cache inside jit; `constrain_cache` pins it to the plan's layout
(batch over "data", kv heads over "model") so that the loop carry stays tensor-parallel. With no
plan active (the single-device default) these functions return their input unchanged: that is
the unsharded path, not a silent fallback for a sharded one.

    with use_plan(plan):            # while tracing / lowering
        cache = constrain_cache(init_cache(cfg, b, s))
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, Sequence

import jax

from specblock_jax.parallel.mesh import ShardingPlan

_ACTIVE: contextvars.ContextVar[ShardingPlan | None] = contextvars.ContextVar("sbj_plan", default=None)


@contextlib.contextmanager
def use_plan(plan: ShardingPlan | None) -> Iterator[ShardingPlan | None]:
    token = _ACTIVE.set(plan)
    try:
        yield plan
    finally:
        _ACTIVE.reset(token)


def active_plan() -> ShardingPlan | None:
    """The plan active while tracing (None: the single-device default)."""
    return _ACTIVE.get()


def constrain(x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
    """x laid out by logical axes under the active plan (unchanged without one)."""
    plan = _ACTIVE.get()
    if plan is None:
        return x
    return jax.lax.with_sharding_constraint(x, plan.sharding(logical, x.shape))


def constrain_batch(x: jax.Array) -> jax.Array:
    """[B, ...] split over "data" under the active plan."""
    return constrain(x, ("batch",) + (None,) * (x.ndim - 1))


def constrain_cache(cache: Any) -> Any:
    """A KVCache laid out by the active plan's `cache_shardings` (unchanged without a plan)."""
    plan = _ACTIVE.get()
    if plan is None:
        return cache
    return jax.lax.with_sharding_constraint(cache, plan.cache_shardings(cache))


def constrain_drafter_state(state: Any) -> Any:
    """A drafter state whose `cache` field (per layer (k, v) [B, K, S, D], or one (k, v)) is laid
    out as the target's cache: batch over "data", kv heads over "model" (unchanged without a plan
    or a `cache` field)."""
    if _ACTIVE.get() is None or getattr(state, "cache", None) is None:
        return state
    return state._replace(cache=constrain_cache(state.cache))
