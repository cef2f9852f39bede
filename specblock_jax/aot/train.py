"""The drafter's train step priced ahead of time: the project's own sharded step (`TrainLayout`
and `train_step_fn`, parallel/training.py and trainer/trainer.py) of the drafter kind's training
task, the frozen target's feature forward included, FSDP + tensor-parallel by the training plan
(`ShardingPlan(fsdp=True)`), on abstract parameters, optimizer state and batch.

A reduced draft vocabulary (EAGLE-3, SpecBlock: 32,000 ids) needs a map file for the task; a
placeholder map (the first ids) is written to a temporary folder: only its size sets shapes.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from specblock_jax import overrides
from specblock_jax.aot import cost
from specblock_jax.aot.phases import with_shardings
from specblock_jax.aot.topology import Topology, topology_mesh
from specblock_jax.drafters import registry
from specblock_jax.drafters.common import abstract_model
from specblock_jax.models.config import ModelConfig
from specblock_jax.models.target import Target, abstract_target
from specblock_jax.parallel.mesh import ShardingPlan
from specblock_jax.parallel.training import TrainLayout
from specblock_jax.trainer.trainer import make_optimizer, train_step_fn, with_defaults

def task_settings(drafter: Any, vocab_dir: Path) -> dict:
    """The training settings that reproduce `drafter`'s config (widths, feature layers, draft
    vocabulary, layers, block size), as its kind's `AotPreset.train_settings` gives them (EAGLE-3
    with its released 7 TTT steps, SpecBlock with the public recipe's 3 blocks)."""
    return registry.kind_of(drafter).aot.train_settings(drafter, vocab_dir)


def _task(kind: str, settings: dict, target: Target):
    """The kind's TrainTask on an abstract target (built by its `AotPreset.abstract_task` when its
    task reads the target's weights when built, e.g. DFlash's head)."""
    entry = registry.get(kind)
    if entry.aot is not None and entry.aot.abstract_task is not None:
        return entry.aot.abstract_task(entry.task, settings, target)
    return entry.task(settings, target)


def trainable_kinds() -> list[str]:
    """The kinds whose drafters' train step is priced: a training task, and their released
    drafter's training settings (`AotPreset.train_settings`)."""
    return [k for k in registry.kinds(trainable=True) if (p := registry.get(k).aot) is not None
            and p.train_settings is not None and p.drafter.kind == k]


def parse_train_settings(items: list[str]) -> dict:
    """['remat_attention=true', 'num_blocks=2'] -> {"remat_attention": True, "num_blocks": 2}
    (true/false, ints and floats parsed; the task checks the keys); ValueError naming a bad item."""
    return overrides.parse(items, "train setting")


def price_train_step(cfg: ModelConfig, drafter: Any, topo: Topology, mesh: str | None, batch: int,
                     seq: int, accounting: str = "unrolled", settings: dict | None = None) -> dict:
    """The train_step record (cost.py) of `drafter`'s kind for target `cfg`: global batch
    [batch, seq] tokens split over "data", the mesh default all-FSDP (`default_mesh(train=True)`);
    `settings` override the kind's training-config keys (`task_settings`'s)."""
    if drafter is None or getattr(drafter, "kind", None) not in trainable_kinds():
        return {"compiled": False, "error": f"no train step: the method has no trainable drafter "
                f"(kinds: {', '.join(trainable_kinds())})", "hbm_bytes": topo.chip.hbm_bytes, "fits": False}
    plan = ShardingPlan(topology_mesh(topo, mesh, train=True), fsdp=True)
    tx, _ = make_optimizer(with_defaults({"run_dir": "unused", "out_dir": "unused"}))
    t0 = time.perf_counter()

    def compile_for(v):
        graphdef, frozen_params = abstract_target(v.cfg)
        with tempfile.TemporaryDirectory() as tmp:
            task = _task(v.drafter.kind, {**task_settings(v.drafter, Path(tmp)), **(settings or {})},
                         Target(v.cfg, graphdef, frozen_params))
        _, params = abstract_model(task.model_cls, task.config)
        frozen = task.frozen()
        layout = TrainLayout.make(plan, tx, params, frozen)
        opt = jax.eval_shape(tx.init, params)
        rows = {k: jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=plan.batch_sharding(2, batch))
                for k in ("tokens", "loss_mask", "attention_mask")}
        key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=plan.replicated())
        step = layout.jit_step(train_step_fn(task, tx)).jitted
        return step.lower(with_shardings(params, layout.params), with_shardings(opt, layout.opt_state),
                          with_shardings(frozen, layout.frozen), rows, key).compile()

    main, cut = cost.variants(cfg, drafter, accounting)
    try:
        compiled = compile_for(main)
    except Exception as e:  # noqa: BLE001 - recorded (e.g. the compiler's out-of-memory)
        return cost.failed(e, topo.chip.hbm_bytes, time.perf_counter() - t0)
    if accounting == "memory":
        priced, loop = None, "not priced"
    elif cut:
        c1, c2 = (cost.costs(compile_for(v)) for v in cut)
        priced, loop = cost.multiplied(c1, c2, cfg.num_layers), "multiplied"
    else:
        priced, loop = cost.checked(cost.costs(compiled)), "unrolled"
    rec = cost.record(compiled, priced, topo.chip.hbm_bytes, time.perf_counter() - t0, loop)
    rec.update(train_batch=batch, train_seq=seq, train_mesh=f"data={plan.data_size},model={plan.model_size}",
               train_settings=settings or {})
    return rec
