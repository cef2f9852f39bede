"""Issue 57 item 4(b), the priced half: every tree of the grid stage of `run.sh` priced for v5p:2x2x1 at Qwen3-8B
shapes (batch 1, context 2048 + 128 new tokens; the TPU compiler's roofline: estimates), and each
kind's best tree picked twice: by the priced speedup (v5p) and by the measured CPU speedup (this
machine), both on run.sh's grid stage's training prompts, never on an evaluation set.

Per tree, `aot.price_method(phases_wanted=("update",))` compiles the chain propose -> tree_forward
-> verify_commit -> update; SpecBlock's row-switched update is compiled once per row bucket its run
used (`row_bucket=`) and priced as the run's mix (`commit_hist`). The step is priced as the sum of
those phases (the whole step compiled as one fuses a little: 3-5% below the sum for the three trees
phases.py priced both ways, after.json), alike for every tree; priced speedup = tau x target-only
step / step, priced drafting per token = (propose + update) / tau.

    STAGES=grid sh benchmarks/specblock_cost/run.sh         # the grid's runs, then this script
    python benchmarks/specblock_cost/grid_price.py          # -> grid.json, the table printed

Resumes: trees already in grid.json are not compiled again.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specblock_jax import aot
from specblock_jax.aot import roofline_seconds
from specblock_jax.drafters import bucket_of

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TOPOLOGY, CONTEXT, MAX_NEW = "v5p:2x2x1", 2048, 128
CHAIN = ("propose", "tree_forward", "verify_commit", "update")


def aot_name(method: str) -> str:
    """The bench's method ('assets/drafters/eagle3:depth=4') -> aot's name of that tree at the released
    drafter's shapes ('eagle3:depth=4'; the shipped folders' trees are aot's presets' defaults)."""
    return method.removeprefix("assets/drafters/")


def priced_chain(method: str, row_bucket: int | None = None) -> dict[str, float]:
    """{phase: estimated ms} of the drafting chain of `method` (aot's name) at batch 1."""
    rec = aot.price_method("qwen3-8b", method, TOPOLOGY, batch=1, context=CONTEXT, max_new=MAX_NEW,
                           phases_wanted=("update",), row_bucket=row_bucket)
    out = {}
    for name in CHAIN:
        seconds = roofline_seconds(rec["phases"][name], rec["chip"])
        if seconds is None:
            raise RuntimeError(f"{method}: phase {name} did not price: {rec['phases'][name].get('error')}")
        out[name] = 1e3 * seconds
    return out


def update_rows(method: str) -> int | None:
    """The rows a row-switched update switches over (SpecBlock), None for a plain update."""
    drafter, _ = aot.released_drafter(method, aot.load_target_config("qwen3-8b"))
    return getattr(drafter, "update_rows", None)


def price_tree(method: str, commit_hist: list[int]) -> dict:
    """The tree's phases, its update as the run's bucket mix where it switches on rows."""
    rows = update_rows(method)
    if rows is None:
        return {"phases": priced_chain(method), "update_by": "the update as compiled"}
    steps: dict[int, int] = {}
    for count, n in enumerate(commit_hist):
        if n and count:
            steps[bucket_of(count, rows)] = steps.get(bucket_of(count, rows), 0) + int(n)
    total = sum(steps.values())
    by_bucket = {b: priced_chain(method, row_bucket=b) for b in sorted(steps)}
    first = by_bucket[min(by_bucket)]
    phases = {k: first[k] for k in CHAIN[:3]}
    phases["update"] = sum(by_bucket[b]["update"] * n for b, n in steps.items()) / total
    return {"phases": phases, "update_by": "the run's mix of row buckets",
            "update_by_bucket": {str(b): {"ms": by_bucket[b]["update"], "share_of_steps": n / total}
                                 for b, n in sorted(steps.items())}}


def summary(rows: list[dict], priced: dict, target_ms: float) -> dict:
    """Per tree: the measured and priced figures; per kind: its priced-best and CPU-best tree."""
    trees = {}
    for r in rows:
        if r["method"] == "ar" or r["method"] not in priced:
            continue
        ph, tau = priced[r["method"]]["phases"], r["tau_run"]
        step = sum(ph[k] for k in CHAIN)
        trees[r["method"]] = {
            "tau": tau, "drafter_forwards_per_token": r["draft_forwards_per_token"],
            "cpu_speedup": r["speedup"], "cpu_round_speedups": r["round_speedups"],
            "cpu_propose_ms": r["propose_ms"], "cpu_update_ms": r["update_ms"],
            "priced_ms": ph, "priced_step_ms": step, "priced_speedup": tau * target_ms / step,
            "priced_draft_ms_per_token": (ph["propose"] + ph["update"]) / tau}
    picks = {}
    for kind in sorted({m.split(":")[0] for m in trees}):
        mine = {m: t for m, t in trees.items() if m.split(":")[0] == kind}
        picks[kind] = {"priced_best": max(mine, key=lambda m: mine[m]["priced_speedup"]),
                       "cpu_best": max(mine, key=lambda m: mine[m]["cpu_speedup"])}
    return {"trees": trees, "picks": picks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=ROOT / "outputs/benchmarks/specblock_cost/grid/results.json")
    ap.add_argument("--out", type=Path, default=HERE / "grid.json")
    args = ap.parse_args()
    run = json.loads(args.results.read_text())
    rows = [{**r, "method": aot_name(r["method"])} for r in run["results"]
            if r["temperature"] == 0 and r["batch_size"] == 1]
    target_ms = json.loads((ROOT / "benchmarks/blockpilot_window/costs_v5p.json").read_text())["target_ms"]["1"]
    out = json.loads(args.out.read_text()) if args.out.exists() else {}
    out.update(target="qwen3-8b", topology=TOPOLOGY, batch=1, context=CONTEXT, max_new=MAX_NEW,
               target_step_ms=target_ms, prompts="train.jsonl records 2000-2023 (run.sh, grid stage)",
               estimate="roofline of the TPU compiler's per-device counts (libtpu), not a measurement; "
                        "step = sum of the priced phases")
    priced = out.setdefault("priced", {})
    for r in rows:
        if r["method"] == "ar" or r["method"] in priced:
            continue
        priced[r["method"]] = price_tree(r["method"], r["commit_hist"])
        args.out.write_text(json.dumps(out, indent=1) + "\n")
        print(r["method"], json.dumps({k: round(v, 4) for k, v in priced[r["method"]]["phases"].items()}),
              flush=True)
    out.update(summary(rows, priced, target_ms))
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print("| tree | tau | forwards/token | CPU speedup [rounds] | priced step ms | priced speedup "
          "| priced draft ms/token |\n|---|---|---|---|---|---|---|")
    for m, t in out["trees"].items():
        rs = t["cpu_round_speedups"]
        print(f"| {m} | {t['tau']:.2f} | {t['drafter_forwards_per_token']:.2f} | {t['cpu_speedup']:.2f}x "
              f"[{min(rs):.2f}-{max(rs):.2f}] | {t['priced_step_ms']:.3f} | {t['priced_speedup']:.3f}x | "
              f"{t['priced_draft_ms_per_token']:.3f} |")
    print(json.dumps(out["picks"], indent=1))


if __name__ == "__main__":
    main()
