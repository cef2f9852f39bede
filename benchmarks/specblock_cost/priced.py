"""Issue 57's targets, priced: SpecBlock (the shipped, data-matched drafter) against EAGLE-3 at its
shipped tree and at the paper's (preset=paper) on held-out (32), HumanEval (24) and the sympy windows
(32), T = 0, batch 1, 128 new tokens. tau and each run's commit counts are measured here (greedy
decoding: they do not depend on the machine's load); step costs come from phases.py's after.json
(v5p:2x2x1, Qwen3-8B shapes, the TPU compiler's roofline: estimates). SpecBlock's update is priced
as the run's mix of its row buckets (each compiled alone), its step as spec_step with the switch's
update replaced by that mix; priced speedup = tau x target-only step / step; priced drafting per
token = (propose + update) / tau.

    python benchmarks/specblock_cost/priced.py      # -> priced.json, and the table printed
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

import specblock_jax as sbj
from specblock_jax.drafters import bucket_of

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SETS = {"heldout": ("heldout.jsonl", 32), "humaneval": ("humaneval.jsonl", 24), "sympy": ("shift_sympy.jsonl", 32)}
METHODS = {"specblock": ("assets/drafters/specblock", {}), "eagle3": ("assets/drafters/eagle3", {}),
           "eagle3:depth=8:top_k=10:num_nodes=61": ("assets/drafters/eagle3", {"preset": "paper"})}


def main() -> None:
    costs = json.loads((HERE / "after.json").read_text())["methods"]
    target_ms = json.loads((ROOT / "benchmarks/blockpilot_window/costs_v5p.json").read_text())["target_ms"]["1"]
    target = sbj.load_target(ROOT / "assets/target")
    out = {"date": time.strftime("%Y-%m-%d"), "target_step_ms": target_ms, "sets": {}}
    for name, (file, limit) in SETS.items():
        records, _ = sbj.read_prompts(ROOT / "assets/prompts" / file)
        prompts = [r["prompt"] for r in records[:limit]]
        rows = {}
        for method, (folder, settings) in METHODS.items():
            drafter = sbj.load_drafter(ROOT / folder, target, **settings)
            res = sbj.generate(target, prompts, drafter, max_new_tokens=128,
                               options=sbj.DecodeOptions(batch_size=1))
            tau = sum(r.stats.new_tokens - 1 for r in res) / sum(r.stats.target_forwards - 1 for r in res)
            hist = np.sum([r.stats.commit_hist for r in res], axis=0)
            ph = {k: v["ms"] for k, v in costs[method]["phases"].items()}
            propose, update, step = ph["propose"], ph["update"], ph["spec_step"]
            row = {"tau": tau, "drafter_forwards_per_token": drafter.drafter.forwards_per_step / tau,
                   "commit_hist": hist.tolist(), "update_switch_ms": update}
            rows_ = getattr(drafter.drafter, "update_rows", None)
            if rows_:
                by = costs[method]["update_by_bucket"]
                steps: dict[int, int] = {}
                for c, n in enumerate(hist):
                    if n and c:
                        steps[bucket_of(c, rows_)] = steps.get(bucket_of(c, rows_), 0) + int(n)
                mix = sum(by[str(b)]["ms"] * n for b, n in steps.items()) / sum(steps.values())
                row["update_mix"] = {str(b): n / sum(steps.values()) for b, n in sorted(steps.items())}
                step, update = step - update + mix, mix
            row.update(propose_ms=propose, update_ms=update, step_ms=step,
                       priced_speedup=tau * target_ms / step, priced_draft_ms_per_token=(propose + update) / tau)
            rows[method] = row
            print(name, method, json.dumps({k: round(v, 4) for k, v in row.items() if isinstance(v, float)}), flush=True)
        s, e, p = rows["specblock"], rows["eagle3"], rows["eagle3:depth=8:top_k=10:num_nodes=61"]
        rows["targets"] = {
            "draft_per_token_vs_paper (<= 0.55)": s["priced_draft_ms_per_token"] / p["priced_draft_ms_per_token"],
            "speedup_vs_paper (>= 1.08)": s["priced_speedup"] / p["priced_speedup"],
            "speedup_vs_shipped_eagle3 (>= 1.0)": s["priced_speedup"] / e["priced_speedup"]}
        print(name, json.dumps({k: round(v, 3) for k, v in rows["targets"].items()}), flush=True)
        out["sets"][name] = rows
    (HERE / "priced.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
