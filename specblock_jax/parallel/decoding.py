"""Sharded batch decoding: the batch split over "data" (data-parallel groups), the target and
its KV cache tensor-parallel over "model" inside a group; the same static-shape loop.

`sbj.generate(..., mesh=mesh)` uses a `DecodeLayout`:
  - weights: `ShardingPlan(fsdp=False)` rules, i.e. replicated across groups, split over "model"
    (heads, kv heads, MLP width, vocabulary);
  - inputs [B, ...] (tokens, lengths, budgets, sampling settings, PRNG key data) split over
    "data"; in a multi-host run each host contributes `batch_size` rows of every global batch;
  - the loop runs under `run_sharded`, which activates the plan while tracing (the KV cache
    created in the loop is pinned to [data, -, model, -]) and splits the outputs over "data";
  - all hosts agree (small all-gathers) on the number of batches, each batch's prompt bucket,
    greedy-or-not and the token budget, so they run the same executables in lockstep; a host
    with fewer prompts runs padding batches. Each host gets back its own rows.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from specblock_jax.parallel import distributed
from specblock_jax.parallel.activation import constrain_batch, use_plan
from specblock_jax.parallel.mesh import ShardingPlan, put_array


def run_sharded(plan: ShardingPlan, fn: Callable, *args):
    """fn(*args) traced under `plan`, e.g. fn = decode_loop with args (loop, params,
    drafter_params, inputs); the last argument is a `LoopInputs` whose keys are raw key data
    [B, 2] (uint32, `DecodeLayout.inputs`), wrapped back into typed keys. Outputs (a pytree of
    [B, ...] arrays) are split over "data"."""
    *rest, inputs = args
    with use_plan(plan):
        return jax.tree.map(constrain_batch, fn(*rest, inputs._replace(keys=jax.random.wrap_key_data(inputs.keys))))


class DecodeLayout:
    """Placement of one `generate` job on a mesh (see the module docstring)."""

    def __init__(self, mesh: Any, batch_size: int):
        self.plan = mesh if isinstance(mesh, ShardingPlan) else ShardingPlan(mesh, fsdp=False)
        procs = jax.process_count()
        bsz = batch_size
        while (bsz * procs) % self.plan.data_size:  # every data group gets whole rows
            bsz += 1
        self.batch_size = bsz  # rows of this host per batch
        self.global_batch = bsz * procs

    def put(self, tree: Any) -> Any:
        """Weights laid out by the decoding rules (a no-op for leaves already placed so)."""
        return self.plan.put(tree)

    def agree_max(self, *values: int) -> list[int]:
        return distributed.host_max(values)

    def agree_all(self, flag: bool) -> bool:
        return bool(distributed.host_min([int(flag)])[0])

    def inputs(self, inputs):
        """A `LoopInputs` of host rows -> one of global arrays; keys become raw key data [B, 2]."""
        def rows(x):
            x = np.asarray(jax.device_get(x))
            shape = (x.shape[0] * jax.process_count(),) + x.shape[1:]
            return jax.make_array_from_process_local_data(self.plan.batch_sharding(x.ndim), x, shape)

        raw = np.asarray(jax.device_get(jax.random.key_data(inputs.keys)))
        stops = put_array(np.asarray(jax.device_get(inputs.stop_ids)), self.plan.replicated())
        return inputs._replace(tokens=rows(inputs.tokens), lengths=rows(inputs.lengths), budgets=rows(inputs.budgets),
                               sampling=jax.tree.map(rows, inputs.sampling), stop_ids=stops, keys=rows(raw))

    def outputs(self, outs) -> tuple:
        """This host's rows of every output, as numpy."""
        return tuple(distributed.local_rows(o) for o in outs)
