"""Issue 57: SpecBlock's and EAGLE-3's decode phases priced for v5p:2x2x1 at Qwen3-8B shapes (batch 1,
context 2048 + 128 new tokens), with per-device bytes: the drafter's weights and KV cache as the
decoding plan lays them out, and each phase's compiled memory and accessed bytes. SpecBlock's update
is also priced at each bucket of its row switch (`aot.price_method(row_bucket=...)`). Estimates
from the TPU compiler (libtpu), not measurements.

    python benchmarks/specblock_cost/phases.py --out benchmarks/specblock_cost/after.json
    # "before": the same script run from a worktree of the code before issue 57's items 1-3
    git worktree add /tmp/before 265ea4e && (cd /tmp/before && PYTHONPATH=. python \
        /work/main/benchmarks/specblock_cost/phases.py --out /work/main/benchmarks/specblock_cost/before.json)

Methods (names `aot.price_method` takes): specblock (the released shape with the shipped tree),
eagle3 (the shipped tree: depth 5, top-k 4, 16 nodes) and eagle3:preset=paper (depth 7 + the first
forward = 8 levels, top-k 10, 61 nodes; on code without presets: its settings spelled out).
Resumes: methods already in --out are skipped.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax

import specblock_jax as sbj
from specblock_jax import aot
# below the public faces (issue 64: to be exported, or this script retired): aot.phases, aot.report,
# aot.topology.topology_mesh, models.kv_cache.cache_length, parallel.mesh.tree_bytes
from specblock_jax.aot import phases as aot_phases
from specblock_jax.aot import roofline_seconds, topology_mesh
from specblock_jax.models import cache_length
from specblock_jax.parallel import tree_bytes

get_topology, make_loop, abstract_target = aot.get_topology, sbj.decoding.make_loop, sbj.models.abstract_target
ShardingPlan, shard_bytes = sbj.parallel.ShardingPlan, sbj.parallel.shard_bytes

PAPER = "eagle3:depth=8:top_k=10:num_nodes=61"
METHODS = ("specblock", "eagle3", PAPER)
WANTED = ("propose", "tree_forward", "verify_commit", "update", "spec_step")
TOPOLOGY, CONTEXT, MAX_NEW = "v5p:2x2x1", 2048, 128


def layout_bytes(method: str) -> dict:
    """Per-device and total bytes of the drafter's weights (split into its input projections and
    the rest) and of its KV cache in the loop state, laid out by the decoding plan."""
    cfg = aot.load_target_config("qwen3-8b")
    drafter, dparams = aot.released_drafter(method, cfg)
    plan = ShardingPlan(topology_mesh(get_topology(TOPOLOGY)))
    sh = plan.param_shardings(dparams)
    draft, draft_sh = dparams["draft"], sh["draft"]
    proj = [k for k in ("fc", "fuse", "shift") if k in draft]
    out = {"weights_total": tree_bytes(draft), "weights_per_device": shard_bytes(draft, draft_sh),
           "input_projections": {k: {"total": tree_bytes(draft[k]), "per_device": shard_bytes(draft[k], draft_sh[k])}
                                 for k in proj}}
    graphdef, params = abstract_target(cfg)
    loop = make_loop(graphdef=graphdef, cfg=cfg, drafter=drafter, greedy=True, max_new=MAX_NEW,
                     cache_len=cache_length(CONTEXT, MAX_NEW, drafter.num_nodes))
    inputs = aot_phases.abstract_inputs(plan, 1, CONTEXT)
    state = jax.eval_shape(lambda p, d, i: aot_phases.prefill(loop, plan, p, d, i), params, dparams, inputs)
    cache_sh = aot_phases.state_shardings(plan, state, 1).drafter_state.cache
    out["kv_cache_total"] = tree_bytes(state.drafter_state.cache)
    out["kv_cache_per_device"] = shard_bytes(state.drafter_state.cache, cache_sh)
    return out


def priced(method: str, **kw) -> dict:
    rec = aot.price_method("qwen3-8b", method, TOPOLOGY, batch=1, context=CONTEXT, max_new=MAX_NEW, **kw)
    return {name: {"ms": None if roofline_seconds(p, rec["chip"]) is None else 1e3 * roofline_seconds(p, rec["chip"]),
                   "flops": p.get("flops"), "bytes_accessed": p.get("bytes_accessed"),
                   "device_bytes": p.get("device_bytes"), "error": p.get("error")}
            for name, p in rec["phases"].items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated")
    ap.add_argument("--buckets", default="2,4,9", help="SpecBlock update buckets to price ('' = none)")
    ap.add_argument("--phases", default=",".join(WANTED), help="the phases to price")
    args = ap.parse_args()
    out = json.loads(args.out.read_text()) if args.out.exists() else {}
    out.update(target="qwen3-8b", topology=TOPOLOGY, batch=1, context=CONTEXT, max_new=MAX_NEW,
               estimate="roofline of the TPU compiler's per-device counts (libtpu), not a measurement")
    methods = out.setdefault("methods", {})
    for method in args.methods.split(","):
        if method in methods:
            continue
        t0 = time.perf_counter()
        entry = {"bytes": layout_bytes(method), "phases": priced(method, phases_wanted=tuple(args.phases.split(",")))}
        if method == "specblock" and args.buckets:
            try:
                entry["update_by_bucket"] = {b: priced(method, phases_wanted=("update",), row_bucket=int(b))["update"]
                                             for b in args.buckets.split(",")}
            except TypeError:  # code before price_method(row_bucket=...): the switch only
                entry["update_by_bucket"] = None
        entry["wall_s"] = time.perf_counter() - t0
        methods[method] = entry
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
        print(method, json.dumps({k: round(v["ms"], 4) for k, v in entry["phases"].items() if v["ms"]}),
              entry["bytes"]["weights_per_device"], entry["bytes"]["kv_cache_per_device"], flush=True)


if __name__ == "__main__":
    main()
