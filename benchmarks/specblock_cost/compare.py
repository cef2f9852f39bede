"""Issue 57 item 6, the one comparison: `run.sh`'s compare stage (bench.sh) (held-out, HumanEval, sympy; T = 0 and 1;
batch 1 and 8) gathered into one table: tau, drafter forwards per token, CPU draft ms per token
(propose + update per step / tau, from each run's step profile), CPU speedup with its round range,
and, at batch 1, the priced speedup and priced drafting per token for v5p:2x2x1 at Qwen3-8B shapes
(estimates: each tree's phases from grid.json, its step the sum of the phases, SpecBlock's update
as this run's mix of row buckets; target-only's step from costs_v5p.json).

    python benchmarks/specblock_cost/compare.py      # -> compare.json, the table printed
"""

from __future__ import annotations

import json
from pathlib import Path

from grid_price import CHAIN, update_rows
from specblock_jax.drafters import bucket_of

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RUNS = ROOT / "outputs/benchmarks/specblock_cost"


def priced(method: str, row: dict, grid: dict, target_ms: float) -> dict:
    """Priced step, speedup and drafting per token of one batch-1 row (None where unpriced)."""
    p = grid["priced"].get(method)
    if p is None:
        return {}
    ph = dict(p["phases"])
    rows = update_rows(method)
    if rows is not None and row.get("commit_hist"):
        by = p["update_by_bucket"]
        steps: dict[str, int] = {}
        for count, n in enumerate(row["commit_hist"]):
            if n and count:
                b = str(bucket_of(count, rows))
                steps[b] = steps.get(b, 0) + n
        if not set(steps) <= set(by):
            return {}
        ph["update"] = sum(by[b]["ms"] * n for b, n in steps.items()) / sum(steps.values())
    step, tau = sum(ph[k] for k in CHAIN), row["tau_run"]
    return {"priced_step_ms": step, "priced_speedup": tau * target_ms / step,
            "priced_draft_ms_per_token": (ph["propose"] + ph["update"]) / tau}


def main() -> None:
    grid = json.loads((HERE / "grid.json").read_text())
    target_ms = grid["target_step_ms"]
    out: dict = {"note": __doc__.split("\n\n")[0], "groups": {}}
    for run in sorted(RUNS.glob("*_T*_b*/results.json")):
        for r in json.loads(run.read_text())["results"]:
            method = r["method"].removeprefix("assets/drafters/")
            name = run.parent.name.split("_T")[0]
            key = f"{name} T={r['temperature']:g} b={r['batch_size']}"
            row = {"tau": r["tau_run"], "drafter_forwards_per_token": r["draft_forwards_per_token"],
                   "cpu_speedup": r["speedup"], "cpu_round_speedups": r["round_speedups"],
                   "cpu_propose_ms": r["propose_ms"], "cpu_update_ms": r["update_ms"],
                   "cpu_draft_ms_per_token": None if r["draft_s_per_token"] is None else 1e3 * r["draft_s_per_token"],
                   "same_as_ar": r["same_as_ar"]}
            if method != "ar" and r["batch_size"] == 1:
                row.update(priced(method, r, grid, target_ms))
            out["groups"].setdefault(key, {})[method] = row
    (HERE / "compare.json").write_text(json.dumps(out, indent=1) + "\n")
    print("| set, T, batch | method | tau | drafter fwd/token | CPU draft ms/token (propose, update ms/step) "
          "| CPU speedup [rounds] | priced speedup | priced draft ms/token |\n|---|---|---|---|---|---|---|---|")
    for key, rows in out["groups"].items():
        for m, r in rows.items():
            if m == "ar":
                continue
            rs = r["cpu_round_speedups"]
            ps = f"{r['priced_speedup']:.2f}x" if "priced_speedup" in r else "-"
            pd = f"{r['priced_draft_ms_per_token']:.3f}" if "priced_draft_ms_per_token" in r else "-"
            cd = "-" if r["cpu_draft_ms_per_token"] is None else (
                f"{r['cpu_draft_ms_per_token']:.2f} ({r['cpu_propose_ms']:.2f}, {r['cpu_update_ms']:.2f})")
            print(f"| {key} | {m} | {r['tau']:.2f} | {r['drafter_forwards_per_token']:.2f} | {cd} | "
                  f"{r['cpu_speedup']:.2f}x [{min(rs):.2f}-{max(rs):.2f}] | {ps} | {pd} |")


if __name__ == "__main__":
    main()
