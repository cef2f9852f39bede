"""`price_method`: compile one decoding method's step phases (and, optionally, its drafter's train
step) for a TPU topology from this CPU, and read the TPU compiler's cost and memory analyses.

    from specblock_jax import aot
    out = aot.price_method("qwen3-8b", "eagle3", "v5p:2x2x1", batch=1, context=2048)
    out["phases"]["spec_step"]["optimal_seconds"], out["phases"]["spec_step"]["fits"]

Phases are compiled in the loop's order, each on the abstract outputs (shapes and the compiler's
output shardings) of the one before: prefill -> target_step; propose -> tree_forward ->
verify_commit -> update; spec_step (the whole step). A phase that fails is recorded with its error
and the phases that need its outputs are recorded as skipped; nothing raises past a phase.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp

from specblock_jax.aot import cost, phases
from specblock_jax.aot.presets import load_target_config, released_drafter
from specblock_jax.aot.topology import get_topology, topology_mesh
from specblock_jax.decoding.job import cache_length
from specblock_jax.decoding.loop import LoopSpec
from specblock_jax.models.config import ModelConfig
from specblock_jax.models.target import abstract_target
from specblock_jax.parallel.mesh import ShardingPlan, mesh_str

ACCOUNTING = ("multiplied", "unrolled")


class _Failed(Exception):
    """A phase's input could not be built because an earlier phase failed."""


@dataclasses.dataclass
class _Pricer:
    """Compiles phases for one (target, drafter, plan, shapes) and keeps their records."""

    cfg: ModelConfig
    drafter: Any
    plan: ShardingPlan
    hbm_bytes: int
    cache_len: int
    max_new: int
    accounting: str
    records: dict = dataclasses.field(default_factory=dict)

    def spec(self, unroll: int, drafter: Any = "same") -> LoopSpec:
        cfg = self.cfg.replace(scan_unroll=unroll)
        return LoopSpec(graphdef=abstract_target(cfg)[0], cfg=cfg,
                        drafter=self.drafter if drafter == "same" else drafter,
                        cache_len=self.cache_len, max_new=self.max_new, greedy=True)

    def run(self, name: str, fn, args: tuple, donate: tuple = (), target_only: bool = False):
        """Compiles phase `name` and records it; returns its abstract outputs (ShapeDtypeStructs
        with the compiler's output shardings), or raises _Failed after recording a failure."""
        if any(isinstance(a, _Failed) for a in jax.tree.leaves(args, is_leaf=lambda x: isinstance(x, _Failed))):
            self.records[name] = {"compiled": False, "error": "skipped: an earlier phase failed",
                                  "hbm_bytes": self.hbm_bytes, "fits": False}
            raise _Failed(name)
        drafter = None if target_only else "same"
        layers = self.cfg.num_layers
        t0 = time.perf_counter()
        try:
            if name not in phases.LAYER_PHASES:
                compiled, _ = cost.lower_compile(fn, (self.spec(1, drafter), self.plan), args, donate)
                priced, loop = cost.costs(compiled), "none"
            elif self.accounting == "unrolled":
                compiled, _ = cost.lower_compile(fn, (self.spec(layers, drafter), self.plan), args, donate)
                priced, loop = cost.costs(compiled), "unrolled"
            else:
                compiled, _ = cost.lower_compile(fn, (self.spec(1, drafter), self.plan), args, donate)
                twice, _ = cost.lower_compile(fn, (self.spec(2, drafter), self.plan), args, donate)
                priced = cost.multiplied(cost.costs(compiled), cost.costs(twice), layers)
                loop = "multiplied"
        except Exception as e:  # noqa: BLE001 - recorded, never raised past the phase
            self.records[name] = cost.failed(e, self.hbm_bytes, time.perf_counter() - t0)
            raise _Failed(name) from None
        self.records[name] = cost.record(compiled, priced, self.hbm_bytes, time.perf_counter() - t0, loop)
        return outputs(compiled)

    def step(self, name: str, fn, args: tuple, donate: tuple = (), target_only: bool = False):
        """`run`, with a failure turned into a _Failed placeholder for the dependent phases."""
        try:
            return self.run(name, fn, args, donate, target_only)
        except _Failed as f:
            return f


def outputs(compiled) -> Any:
    """A compiled function's outputs as ShapeDtypeStructs with its output shardings."""
    return jax.tree.map(lambda o, s: jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=s),
                        compiled.out_info, compiled.output_shardings)


def _field(value, attr):
    return value if isinstance(value, _Failed) else getattr(value, attr)


def price_method(target_cfg: str | ModelConfig, method: str, topology: str, mesh: str | None = None,
                 batch: int = 1, context: int = 2048, nodes: int | None = None, block: int | None = None,
                 *, train: bool = False, train_batch: int = 8, train_seq: int = 2048, max_new: int = 256,
                 accounting: str = "multiplied", dtype: str | None = None) -> dict:
    """Prices decoding method `method` for target `target_cfg` on TPU topology `topology`.

    target_cfg: a preset name (`PRESETS`), an HF folder / config.json, or a ModelConfig; dtype
    overrides its dtype (presets: bf16). method: ar, prompt_lookup, eagle3, specblock, dflash,
    blockpilot or a drafter folder, with optional ':key=value' decoding overrides (presets.py).
    topology: e.g. "v5e:2x2", "v5p:2x2x1", "v6e:2x4". mesh: "data=D,model=K" over its chips
    (default all tensor-parallel for decoding, all FSDP for training). batch B, context P (the
    prompt bucket; the cache holds P + max_new (+ N) slots), nodes N (tree budget), block (DFlash
    block size). train: also price the drafter's train step (global batch train_batch x
    train_seq tokens, the frozen target's features included) under the training plan.
    accounting: the target's layer loop "multiplied" (two small compiles) or "unrolled".

    Returns {"target", "method", "topology", "chip", "devices", "mesh", "batch", "context",
    "nodes", "cache_len", "max_new", "accounting", "phases": {phase: record}} with the records of
    cost.py (per device: optimal_seconds, flops, bytes_accessed, device_bytes, hbm_bytes, fits,
    compile_s; `compiled` false and `error` for a phase that failed). Phases: prefill and
    target_step always; propose, tree_forward, verify_commit, update and spec_step for a drafter
    method; train_step with `train`.
    """
    if accounting not in ACCOUNTING:
        raise ValueError(f"accounting must be one of {ACCOUNTING}, got {accounting!r}")
    cfg = load_target_config(target_cfg, dtype)
    topo = get_topology(topology)
    plan = ShardingPlan(topology_mesh(topo, mesh))
    drafter, dparams = released_drafter(method, cfg, nodes, block)
    n = 0 if drafter is None else drafter.num_nodes
    pricer = _Pricer(cfg, drafter, plan, topo.chip.hbm_bytes, cache_length(context, max_new, n), max_new,
                     accounting)
    _, params = abstract_target(cfg)
    params = phases.with_shardings(params, plan.param_shardings(params))
    dparams = phases.with_shardings(dparams, plan.param_shardings(dparams)) if dparams != () else ()
    stop_ids = jax.ShapeDtypeStruct((phases.STOP_IDS,), jnp.int32, sharding=plan.replicated())
    inputs = phases.abstract_inputs(plan, batch, context)
    s = pricer.step("prefill", phases.prefill, (params, dparams, inputs))
    if drafter is None:
        pricer.step("target_step", phases.target_step, (params, s, stop_ids), donate=(1,))
    else:
        _decode_phases(pricer, params, dparams, s, stop_ids, plan, batch)
    if train:
        from specblock_jax.aot.train import price_train_step

        pricer.records["train_step"] = price_train_step(cfg, drafter, topo, mesh, train_batch, train_seq,
                                                        accounting)
    return {"target": target_cfg if isinstance(target_cfg, str) else "config", "method": method,
            "topology": topology, "chip": topo.chip.name, "devices": topo.num_devices,
            "mesh": mesh_str(plan.mesh), "batch": batch, "context": context, "nodes": n,
            "cache_len": pricer.cache_len, "max_new": max_new, "accounting": accounting,
            "dtype": cfg.dtype, "phases": pricer.records}


def _decode_phases(pricer: _Pricer, params, dparams, s, stop_ids, plan, batch) -> None:
    """target_step at the speculative loop's cache, then propose -> tree_forward -> verify_commit
    -> update on each other's abstract outputs, then the whole spec_step."""
    failed = isinstance(s, _Failed)
    if failed:
        ar = s
    else:
        out = jax.ShapeDtypeStruct((batch, pricer.max_new), jnp.int32,
                                   sharding=plan.batch_sharding(2, batch))
        ar = phases.ar_state(s, pricer.max_new)._replace(out=out)
    pricer.step("target_step", phases.target_step, (params, ar, stop_ids), donate=(1,), target_only=True)
    ctx = s if failed else phases.context(s)
    prop = pricer.step("propose", phases.propose,
                       (dparams, _field(s, "drafter"), ctx, _field(s, "keys"), _field(s, "step")), donate=(1,))
    tree, dstate = (prop, prop) if isinstance(prop, _Failed) else prop
    fwd_out = pricer.step("tree_forward", phases.tree_forward_phase,
                          (params, tree, _field(s, "root"), _field(s, "cache")), donate=(3,))
    tree2, anc, fwd = (fwd_out,) * 3 if isinstance(fwd_out, _Failed) else fwd_out
    part = s if failed else s._replace(cache=None, drafter=None)
    c = pricer.step("verify_commit", phases.verify_phase,
                    (part, tree2, anc, _field(fwd, "logits"), _field(fwd, "cache"), stop_ids), donate=(0, 4))
    pricer.step("update", phases.update,
                (dparams, dstate, _field(c, "ctx"), _field(c, "result"), _field(fwd, "hidden")), donate=(1,))
    pricer.step("spec_step", phases.spec_step_phase, (params, dparams, s, stop_ids), donate=(2,))
