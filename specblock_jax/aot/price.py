"""`price_method`: compile one decoding method's step phases (and, optionally, its drafter's train
step) for a TPU topology from this CPU, and read the TPU compiler's cost and memory analyses.

    from specblock_jax import aot
    out = aot.price_method("qwen3-8b", "eagle3", "v5p:2x2x1", batch=1, context=2048)
    out["phases"]["spec_step"]["flops"], out["phases"]["spec_step"]["fits"]

Phases are compiled in the loop's order, each on the abstract outputs (shapes and the compiler's
output shardings) of the one before: prefill -> target_step; propose -> tree_forward ->
verify_commit -> update; spec_step (the whole step). A phase that fails is recorded with its error
and the phases that need its outputs are recorded as skipped; nothing raises past a phase.

Layer accounting. XLA's cost analysis counts a loop body once, and inside the rolled layer loop
it charges each dynamic slice of the stacked weights and cache as a read of the whole stack, so
costs come from straight-line programs. "unrolled" (the default) compiles all L layers unrolled
(`cost.unrolled`: `ModelConfig.scan_unroll` and `cache_scan_unroll` = L; the library's decoding
keeps the rolled scan): costs and memory of that exact program. "multiplied" compiles
the target cut to 2 and to 3 layers (unrolled; drafter feature layers clamped, shapes unchanged)
and prices L layers as c2 + (L - 2) (c3 - c2): exact for FLOPs, which grow linearly with depth;
the compiler's bytes accessed do not (its fusion choices differ from one depth to the next: at
Qwen3-8B shapes the one-token step's bytes from the 2/3 cuts are 10% under the unrolled program's,
from 1/2 cuts 34% over), so bytes and time from it are rough. Memory, `compiled`
and `fits` come from the L-layer executable (rolled, the one the library runs, for "multiplied"
and "memory").
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp

from specblock_jax.aot import cost, phases
from specblock_jax.aot.presets import load_target_config, released_drafter
from specblock_jax.aot.train import price_train_step
from specblock_jax.aot.topology import Chip, get_topology, topology_mesh
from specblock_jax.models.kv_cache import cache_length
from specblock_jax.decoding.loop import DecodeLoop, make_loop
from specblock_jax.drafters.common import forced_row_bucket
from specblock_jax.models.config import ModelConfig
from specblock_jax.models.target import abstract_target
from specblock_jax.parallel.mesh import ShardingPlan, mesh_str

ACCOUNTING = ("unrolled", "multiplied", "memory")
# what each decode phase reads from another phase's outputs (the loop state they start from is
# the loop's `start` shapes, laid out by the plan: no compile needed)
NEEDS = {"prefill": (), "target_step": (), "propose": (), "tree_forward": ("propose",),
         "verify_commit": ("tree_forward",), "update": ("verify_commit",), "spec_step": ()}


def needed(wanted) -> set[str]:
    """The decode phases to compile for `wanted` (None = all): them and those they read."""
    out: set[str] = set()
    todo = list(NEEDS if wanted is None else wanted)
    while todo:
        name = todo.pop()
        if name not in NEEDS:
            if name == "train_step":
                continue
            raise ValueError(f"unknown phase {name!r} (phases: {', '.join(phases.PHASES)})")
        if name not in out:
            out.add(name)
            todo.extend(NEEDS[name])
    return out


class _Failed(Exception):
    """A phase failed (its error is kept), or could not run because an earlier one failed."""

    def __init__(self, error: BaseException | str, seconds: float = 0.0):
        super().__init__(str(error))
        self.error, self.seconds = error, seconds


def outputs(compiled) -> Any:
    """A compiled function's outputs as ShapeDtypeStructs with its output shardings."""
    return jax.tree.map(lambda o, s: jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=s),
                        compiled.out_info, compiled.output_shardings)


@dataclasses.dataclass
class _Chain:
    """Compiles the phases of one variant in loop order; `done[name]` = (compiled, seconds,
    kernels) or a _Failed."""
    variant: cost.Variant
    plan: ShardingPlan
    cache_len: int
    max_new: int
    wanted: set
    done: dict = dataclasses.field(default_factory=dict)

    def loop(self, target_only: bool) -> DecodeLoop:
        cfg = self.variant.cfg
        return make_loop(graphdef=abstract_target(cfg)[0], cfg=cfg,
                         drafter=None if target_only else self.variant.drafter,
                         cache_len=self.cache_len, max_new=self.max_new, greedy=True)

    def step(self, name: str, fn, args: tuple, donate: tuple = (), target_only: bool = False):
        """Compiles phase `name` on `args`; its abstract outputs, or a _Failed for dependents
        (None, no record, for a phase not wanted)."""
        if name not in self.wanted:
            return None
        upstream = [a for a in jax.tree.leaves(args, is_leaf=lambda x: isinstance(x, _Failed))
                    if isinstance(a, _Failed)]
        if upstream:
            self.done[name] = _Failed("skipped: an earlier phase failed")
            return self.done[name]
        t0 = time.perf_counter()
        try:
            compiled, seconds, kernels = cost.lower_compile(fn, (self.loop(target_only), self.plan), args, donate)
        except Exception as e:  # noqa: BLE001 - recorded, never raised past the phase
            self.done[name] = _Failed(e, time.perf_counter() - t0)
            return self.done[name]
        self.done[name] = (compiled, seconds, kernels)
        return outputs(compiled)


def _field(value, attr):
    return value if value is None or isinstance(value, _Failed) else getattr(value, attr)


def run_chain(variant: cost.Variant, plan: ShardingPlan, batch: int, context: int, max_new: int,
              cache_len: int, dparams, wanted: set) -> dict:
    """Compiles the decode phases `wanted` of `variant`: {phase: (compiled, seconds, kernels) | _Failed}."""
    chain = _Chain(variant, plan, cache_len, max_new, wanted)
    _, params = abstract_target(variant.cfg)
    params = phases.with_shardings(params, plan.param_shardings(params))
    stop_ids = jax.ShapeDtypeStruct((phases.STOP_IDS,), jnp.int32, sharding=plan.replicated())
    inputs = phases.abstract_inputs(plan, batch, context)
    chain.step("prefill", phases.prefill, (params, dparams, inputs))
    # the loop state every step phase starts from: its shapes, laid out by the plan's rules
    s = jax.eval_shape(lambda p, d, i: phases.prefill(chain.loop(False), plan, p, d, i), params, dparams, inputs)
    s = phases.with_shardings(s, phases.state_shardings(plan, s, batch))
    if variant.drafter is None:
        chain.step("target_step", phases.target_step, (params, s, stop_ids), donate=(1,))
        return chain.done
    out = jax.ShapeDtypeStruct((batch, max_new), jnp.int32, sharding=plan.batch_sharding(2, batch))
    ar = phases.target_state(s, max_new)._replace(out=out)
    chain.step("target_step", phases.target_step, (params, ar, stop_ids), donate=(1,), target_only=True)
    ctx = phases.context(s)
    prop = chain.step("propose", phases.propose,
                      (dparams, s.drafter_state, ctx, s.keys, s.step), donate=(1,))
    tree, dstate = (prop, prop) if prop is None or isinstance(prop, _Failed) else prop
    fwd_out = chain.step("tree_forward", phases.tree_forward_phase,
                         (params, tree, s.root, s.cache))  # the cache is only read
    tree2, anc, fwd = (fwd_out,) * 3 if fwd_out is None or isinstance(fwd_out, _Failed) else fwd_out
    part = s._replace(drafter_state=None)
    c = chain.step("verify_commit", phases.verify_phase,
                   (part, tree2, anc, _field(fwd, "logits"), _field(fwd, "new_kv"), stop_ids), donate=(0, 4))
    chain.step("update", phases.update,
               (dparams, dstate, _field(c, "ctx"), _field(c, "result"), _field(fwd, "hidden")), donate=(1,))
    chain.step("spec_step", phases.spec_step_phase, (params, dparams, s, stop_ids), donate=(2,))
    return chain.done


def combine(main: dict, cut: list[dict], layers: int, chip: Chip, accounting: str) -> dict:
    """Phase records: memory and fits from the L-layer chain `main`, costs from it ("unrolled")
    or from the cut chains `cut` ("multiplied"), each with its kernels' costs (`cost.with_kernels`)."""
    records = {}
    for name, got in main.items():
        cut_got = [c.get(name) for c in cut]
        if isinstance(got, _Failed):
            records[name] = cost.failed(got.error, chip.hbm_bytes, got.seconds)
            continue
        compiled, seconds, kernels = got
        if accounting == "memory":
            priced, loop = None, "not priced"
        elif not cut:
            priced, loop = cost.checked(cost.with_kernels(cost.costs(compiled), kernels, chip)), "unrolled"
        elif any(not isinstance(c, tuple) for c in cut_got):
            records[name] = cost.record(compiled, None, chip.hbm_bytes, seconds, "failed", kernels)
            continue
        else:
            c1, c2 = (cost.with_kernels(cost.costs(c[0]), c[2], chip) for c in cut_got)
            priced, loop = cost.multiplied(c1, c2, layers), "multiplied"
            seconds += sum(c[1] for c in cut_got)
        records[name] = cost.record(compiled, priced, chip.hbm_bytes, seconds, loop, kernels)
    return records


def price_method(target_cfg: str | ModelConfig, method: str, topology: str, mesh: str | None = None,
                 batch: int = 1, context: int = 2048, nodes: int | None = None, block: int | None = None,
                 *, train: bool = False, train_batch: int = 8, train_seq: int = 2048, max_new: int = 256,
                 accounting: str = "unrolled", attention: str = "cascade", dtype: str | None = None,
                 phases_wanted: tuple[str, ...] | None = None, train_settings: dict | None = None,
                 row_bucket: int | None = None) -> dict:
    """Prices decoding method `method` for target `target_cfg` on TPU topology `topology`.

    target_cfg: a preset name (`PRESETS`), an HF folder / config.json, or a ModelConfig; dtype
    overrides its dtype (presets: bf16). method: ar, prompt_lookup, eagle3, specblock, dflash,
    blockpilot or a drafter folder, with optional ':key=value' decoding overrides (presets.py).
    topology: e.g. "v5e:2x2", "v5p:2x2x1", "v6e:2x4". mesh: "data=D,model=K" over its chips
    (default all tensor-parallel for decoding, all FSDP for training). batch B, context P (the
    prompt bucket; the cache holds P + max_new (+ N) slots), nodes N (tree budget), block (DFlash
    block size). train: also price the drafter's train step (global batch train_batch x
    train_seq tokens, the frozen target's features included) under the training plan.
    accounting: "unrolled" or "multiplied" (module docstring), or "memory" (the rolled
    executable only: compiled, memory and fits, no costs). attention: the target's cache
    attention (models/attention.py), "cascade" (what runs on TPU: the Pallas kernels, each one's
    cost added where the compiler cannot see it, cost.py), "full" (dense over the whole cache, the
    reference and the tables' path before issue 66) or "bucketed" (on TPU the same as cascade).
    phases_wanted: compile only these phases (and those whose outputs they read); None = all.
    train_settings: training-config keys of the drafter's kind over the released shape's
    (`train.task_settings`), e.g. {"remat_attention": True} for SpecBlock.
    row_bucket: an update that switches on the rows a step committed (SpecBlock's,
    `drafters.common.switch_on_rows`) is compiled with only the bucket holding this many rows
    (XLA prices a switch at its costliest branch); None: the switch as it runs.

    Returns {"target", "method", "topology", "chip", "devices", "mesh", "batch", "context",
    "nodes", "cache_len", "max_new", "accounting", "dtype", "phases": {phase: record}} with the
    records of cost.py (per device: optimal_seconds, flops, bytes_accessed, device_bytes,
    hbm_bytes, fits, compile_s; `compiled` false and `error` for a phase that failed). Phases:
    prefill and target_step always; propose, tree_forward, verify_commit, update and spec_step
    for a drafter method; train_step with `train`.
    """
    if accounting not in ACCOUNTING:
        raise ValueError(f"accounting must be one of {ACCOUNTING}, got {accounting!r}")
    cfg = load_target_config(target_cfg, dtype).replace(attention=attention)
    topo = get_topology(topology)
    plan = ShardingPlan(topology_mesh(topo, mesh))
    drafter, dparams = released_drafter(method, cfg, nodes, block)
    dparams = phases.with_shardings(dparams, plan.param_shardings(dparams)) if dparams != () else ()
    n = 0 if drafter is None else drafter.num_nodes
    cache_len = cache_length(context, max_new, n)
    main, cut = cost.variants(cfg, drafter, accounting)
    wanted = needed(phases_wanted)
    if drafter is None:
        wanted &= {"prefill", "target_step"}
    if row_bucket is not None:
        jax.clear_caches()  # no trace of the switch may be reused for the forced bucket, nor after it
    with forced_row_bucket(row_bucket):
        done = [run_chain(v, plan, batch, context, max_new, cache_len, dparams, wanted) for v in [main, *cut]]
    if row_bucket is not None:
        jax.clear_caches()
    records = combine(done[0], done[1:], cfg.num_layers, topo.chip, accounting)
    if train or (phases_wanted and "train_step" in phases_wanted):
        records["train_step"] = price_train_step(cfg, drafter, topo, mesh, train_batch, train_seq, accounting,
                                                    train_settings)
    return {"target": target_cfg if isinstance(target_cfg, str) else "config", "method": method,
            "topology": topology, "chip": topo.chip.name, "devices": topo.num_devices,
            "mesh": mesh_str(plan.mesh), "batch": batch, "context": context, "nodes": n,
            "cache_len": cache_len, "max_new": max_new, "accounting": accounting, "dtype": cfg.dtype,
            "row_bucket": row_bucket, "phases": records}
