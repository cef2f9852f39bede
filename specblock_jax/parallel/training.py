"""The sharded train step: parameters and optimizer state FSDP + tensor-parallel, the batch split
over "data", the frozen target laid out by the same rules; one `jax.jit` with in/out shardings.

    layout = TrainLayout.make(plan, tx, params, frozen)
    params, frozen = layout.put(params), layout.put_frozen(frozen)
    opt_state = layout.init_opt(params)
    step = layout.jit_step(step_fn)          # step_fn(params, opt_state, frozen, batch, key)
    params, opt_state, metrics = step(params, opt_state, frozen, numpy_batch, key)

`numpy_batch` is this host's part of the global batch (the whole batch in a single process): its
rows become the host's rows of the global [B, T] arrays. Params and optimizer state are donated.
Optimizer-state leaves take the sharding of the parameter whose key path they end with (Adam's
mu / nu mirror the params); scalars (step counts) are replicated.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np
import optax

from specblock_jax.parallel.mesh import ShardingPlan, put_array, shard_bytes


@dataclasses.dataclass(frozen=True)
class TrainLayout:
    plan: ShardingPlan
    tx: optax.GradientTransformation
    params: Any  # tree of NamedSharding
    opt_state: Any
    frozen: Any

    @classmethod
    def make(cls, plan: ShardingPlan, tx: optax.GradientTransformation, params: Any,
             frozen: Any) -> "TrainLayout":
        """Shardings for (trainable params, optimizer state, frozen tree) from the plan's rules."""
        abstract_opt = jax.eval_shape(tx.init, params)
        return cls(plan, tx, plan.param_shardings(params), plan.param_shardings(abstract_opt),
                   plan.param_shardings(frozen))

    def put(self, params: Any) -> Any:
        return self.plan.put(params, self.params)

    def put_frozen(self, frozen: Any) -> Any:
        return self.plan.put(frozen, self.frozen)

    def init_opt(self, params: Any) -> Any:
        """tx.init(params), created directly in its sharded layout."""
        return jax.jit(self.tx.init, out_shardings=self.opt_state)(params)

    def put_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """This host's rows -> global [B, ...] arrays split over "data" (B = rows x processes)."""
        out = {}
        for k, v in batch.items():
            v = np.asarray(v)
            global_shape = (v.shape[0] * jax.process_count(),) + v.shape[1:]
            if global_shape[0] % self.plan.data_size:
                raise ValueError(f"batch of {global_shape[0]} rows does not split over "
                                 f"data={self.plan.data_size}")
            out[k] = jax.make_array_from_process_local_data(
                self.plan.batch_sharding(v.ndim), v, global_shape)
        return out

    def jit_step(self, step_fn: Callable) -> Callable:
        """`step_fn` jitted with this layout; the returned callable takes a numpy batch (this
        host's rows) and a typed PRNG key, like the unsharded step."""
        repl = self.plan.replicated()

        def with_raw_key(params, opt_state, frozen, batch, raw_key):
            return step_fn(params, opt_state, frozen, batch, jax.random.wrap_key_data(raw_key))

        jitted = jax.jit(with_raw_key, donate_argnums=(0, 1),
                         in_shardings=(self.params, self.opt_state, self.frozen,
                                       self.plan.batch_sharding(2), repl),
                         out_shardings=(self.params, self.opt_state, repl))

        def step(params, opt_state, frozen, batch, key):
            raw = put_array(np.asarray(jax.device_get(jax.random.key_data(key))), repl)
            return jitted(params, opt_state, frozen, self.put_batch(batch), raw)

        step.jitted = jitted  # for AOT lowering (`jitted.lower(...)`)
        return step

    def bytes_per_device(self, params: Any, opt_state: Any, frozen: Any) -> dict[str, int]:
        """Bytes one device holds of each tree (arrays or ShapeDtypeStructs)."""
        return {"params": shard_bytes(params, self.params),
                "opt_state": shard_bytes(opt_state, self.opt_state),
                "frozen": shard_bytes(frozen, self.frozen)}
