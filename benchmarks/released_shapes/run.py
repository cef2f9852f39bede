"""The released SpecBlock and BlockPilot drafters at their deployment shapes, compiled for TPU
v5p:2x2x1 from this CPU (issue 42, item 4): do they fit beside Qwen3-8B / Llama-3.1-8B, and what
does the TPU compiler price their step at.

    .venv/bin/python benchmarks/released_shapes/run.py [--out benchmarks/released_shapes]

No weights anywhere. SpecBlock: the released config.json (shiweijiezero/SpecBlock
configs/specblock/{qwen3,llama3}-8B-specblock.json, specblock_released.RELEASED_CONFIGS) is
imported against the target preset by `hf_format.import_meta` (every field checked) and written as
a config-only drafter folder, which `aot.price_method` (the library under `specblock-aot`) sizes
abstractly. Trees: the shipped one (16 nodes) and the public serving default's ~90 nodes
(`num_nodes=90:root_topk=10`). BlockPilot: z-lab's Qwen3-8B-DFlash-b16 at block 18 (max of its
window 14..18: a request's block is at most that), and the released policy MLP (Linear(151,936 ->
2,048) -> Linear(2,048 -> 2,048) -> Linear(2,048 -> 5), bfloat16) run once per request after the
prefill. Rows are appended to results.json as they finish (a rerun skips rows already there);
results.md is rewritten from it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


TOPOLOGY = "v5p:2x2x1"
CONTEXT = 2048
PHASES = ("prefill", "target_step", "propose", "tree_forward", "verify_commit", "update", "spec_step")


def _specblock_folder(preset: str, tmp: Path) -> Path:
    from specblock_jax.aot import load_preset
    from specblock_jax.drafters import hf_format, specblock_released

    hf = specblock_released.RELEASED_CONFIGS[preset]
    meta = hf_format.import_meta(tmp / f"SpecBlock-{preset}", hf, load_preset(preset))
    folder = tmp / f"specblock-{preset}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({k: meta[k] for k in ("kind", "config", "decoding")}))
    return folder


def _policy_row(batch: int) -> dict:
    """The released BlockPilot policy's forward on [batch, V] prefill logits, compiled for TOPOLOGY."""
    import jax
    import jax.numpy as jnp

    from specblock_jax.aot import cost, get_topology
    from specblock_jax.aot.topology import topology_mesh
    from specblock_jax.parallel.mesh import ShardingPlan

    topo = get_topology(TOPOLOGY)
    plan = ShardingPlan(topology_mesh(topo, None))
    rep = plan.replicated()
    v, w = 151936, 2048
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=rep)  # noqa: E731
    params = {"w0": s(v, w), "b0": s(w), "w1": s(w, w), "b1": s(w), "wo": s(w, 5), "bo": s(5)}

    def policy(p, logits):  # utils/predict.py's MLP, eval mode: argmax + 14
        h = jax.nn.relu(logits.astype(jnp.bfloat16) @ p["w0"] + p["b0"])
        h = jax.nn.relu(h @ p["w1"] + p["b1"]) + h
        return jnp.argmax(h @ p["wo"] + p["bo"], axis=-1) + 14

    t0 = time.perf_counter()
    compiled, _ = cost.lower_compile(policy, (), (params, s(batch, v)))
    return cost.record(compiled, cost.costs(compiled), topo.chip.hbm_bytes, time.perf_counter() - t0, "none")


def rows() -> list[tuple[str, dict]]:
    """(key, spec) of every row, most needed first: spec = price_method arguments, or {"policy": batch}."""
    sb = lambda preset, tree, method, batch: (f"{preset}|specblock-{tree}|{batch}",  # noqa: E731
                                              {"target": preset, "method": method, "batch": batch})
    presets = ("qwen3-8b", "llama-3.1-8b")
    out = [sb(p, 16, "SPECBLOCK", 1) for p in presets]
    out += [(f"qwen3-8b|blockpilot-policy|{b}", {"policy": b}) for b in (1, 32)]
    out.append(("qwen3-8b|blockpilot-18|1", {"target": "qwen3-8b", "method": "blockpilot", "block": 18, "batch": 1}))
    out += [sb(p, 90, "SPECBLOCK:num_nodes=90:root_topk=10", 1) for p in presets]
    out += [(f"{p}|ar|1", {"target": p, "method": "ar", "batch": 1}) for p in presets]
    out += [sb(p, 16, "SPECBLOCK", 32) for p in presets]
    out.append(("qwen3-8b|blockpilot-18|32", {"target": "qwen3-8b", "method": "blockpilot", "block": 18, "batch": 32}))
    return out


def markdown(results: dict) -> str:
    lines = [
        "# Released SpecBlock and BlockPilot drafters at deployment shapes (TPU v5p:2x2x1)",
        "",
        "Date: 2026-12-04. Command: `.venv/bin/python benchmarks/released_shapes/run.py` (the library",
        "under `specblock-aot`: `aot.price_method`). Machine: this 2-core CPU host with libtpu's compiler",
        f"(no TPU: nothing ran on one). Topology {TOPOLOGY}: 4 TPU v5p chips, 95 GiB HBM each,",
        f"tensor-parallel over 4; context {CONTEXT},",
        "256 new tokens; bf16; no weights (abstract shapes). Times are the TPU compiler's own estimate",
        "(`optimal_seconds`, a roofline over FLOPs and bytes per device), not measurements; "
        "see docs/tpu_aot.md.",
        "",
        "SpecBlock rows: the public configs (shiweijiezero/SpecBlock configs/specblock/*-8B-specblock.json:",
        "2 layers, K = 4, 32,000-token draft vocabulary, rank head 256) imported against the target by",
        "`hf_format.import_meta`, every field checked. 16 = the shipped tree, 90 = the public serving",
        "default's budget (`num_nodes=90:root_topk=10`). BlockPilot rows: z-lab's Qwen3-8B-DFlash-b16 at",
        "block 18 (the top of the 14..18 window), and the released policy MLP (151,936 -> 2,048 -> 2,048 ->",
        "5, once per request after the prefill).",
        "",
        "One row by hand: `specblock-aot --target qwen3-8b --method FOLDER --topology v5p:2x2x1 --out r.json`,",
        "FOLDER being the config-only drafter folder run.py writes from the released config (`_specblock_folder`:",
        "`hf_format.import_meta` against the preset, no weights); BlockPilot: `--method blockpilot --block-size 18`.",
        "",
        "| target | drafter | batch | " + " | ".join(f"{p} ms" for p in PHASES)
        + " | max GB/device | fits | compile s | layer loop |",
        "|---|---|---|" + "---|" * (len(PHASES) + 4),
    ]
    for key, r in results.items():
        target, drafter, batch = key.split("|")
        phases = r.get("phases") or {"policy": r}
        ms = []
        for p in PHASES:
            rec = phases.get(p) if "phases" in r else (r if p == "prefill" else None)
            if rec is None:
                ms.append("")
            elif not rec.get("compiled"):
                ms.append("failed")
            elif rec["optimal_seconds"] is None or rec["optimal_seconds"] < 0:
                ms.append("n/a*")
            else:
                ms.append(f"{rec['optimal_seconds'] * 1e3:.3f}")
        recs = [x for x in phases.values() if x.get("compiled")]
        gb = max((x["device_bytes"] for x in recs), default=0) / 1e9
        fits = all(x.get("fits") for x in phases.values())
        comp = sum(x.get("compile_s", 0) for x in phases.values())
        lines.append(f"| {target} | {drafter} | {batch} | " + " | ".join(ms)
                     + f" | {gb:.2f} | {'yes' if fits else 'no'} | {comp:.0f} | {r.get('accounting') or 'none'} |")
    lines += ["", "The policy rows put the policy's forward in the prefill column (it runs once, after the "
              "prefill). A failed phase keeps its error in results.json. n/a*: no `optimal_seconds` from the compiler "
              "for executables holding SpecBlock's tree building (propose, and spec_step which contains it): its "
              "estimate there is negative (about -2 s), which aot records as none; their flops and bytes are in "
              "results.json. GB/device: the largest phase's arguments + outputs + temporaries per chip; fits: "
              "every phase within 95 GiB. Layer loop: how aot counted the target's layers (`unrolled`: all "
              "layers in one compile, aot's default since 2026-12-04 08:20; `multiplied`: the Llama row, priced "
              "before that from 1- and 2-layer cuts, which aot's own check later found up to 34% over on bytes: "
              "read its ms as likely high).", ""]
    missing = [k for k, _ in rows() if k not in results]
    if missing:
        lines += [f"Not run yet (each about 15-25 min of compiles here; rerun run.py to add them): "
                  f"{', '.join(missing)}.", ""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    p.add_argument("--table-only", action="store_true", help="rewrite results.md from results.json")
    args = p.parse_args()
    if args.table_only:
        (args.out / "results.md").write_text(markdown(json.loads((args.out / "results.json").read_text())))
        return 0
    from specblock_jax.aot import price_method

    file = args.out / "results.json"
    results = json.loads(file.read_text()) if file.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        folders = {preset: _specblock_folder(preset, tmp) for preset in ("qwen3-8b", "llama-3.1-8b")}
        for key, spec in rows():
            if key in results:
                continue
            t0 = time.perf_counter()
            if "policy" in spec:
                rec = _policy_row(spec["policy"])
            else:
                method = spec["method"].replace("SPECBLOCK", str(folders[spec["target"]]))
                rec = price_method(spec["target"], method, TOPOLOGY, batch=spec["batch"], context=CONTEXT,
                                   block=spec.get("block"))
                rec["method"] = spec["method"]  # not the temporary folder's path
            results[key] = rec
            file.write_text(json.dumps(results, indent=1))
            (args.out / "results.md").write_text(markdown(results))
            print(f"{key}: {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
