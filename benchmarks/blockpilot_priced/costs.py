"""The priced step costs of BlockPilot's candidate sizes, copied from the TPU pricing into a small
committed file, so that the priced labels reproduce without libtpu.

    .venv/bin/python benchmarks/blockpilot_priced/costs.py [--results benchmarks/tpu_aot/results.json]

Reads the rows "phases|v5p:2x2x1|1|2048|DFlash block K" (K = 4..8) and
"phases|v5p:2x2x1|1|2048|target-only" of benchmarks/tpu_aot/results.json (Qwen3-8B shapes, batch 1,
context 2048, bf16, layers unrolled): each row's `spec_step` (DFlash: propose + update + the
target's forward over the block + verify and commit, one compiled step) or `target_step`, priced by
`specblock_jax.aot.report.roofline_seconds` (the roofline of the compiler's per-device FLOPs and
bytes on the chip, as benchmarks/tpu_aot/tables.py `_ms`). Writes costs_v5p.json:
{"step_ms": {"4": ms, ...}, "target_step_ms": ms, "source": {row keys, dates, compiler, ...}}.
A size whose row is missing is an error naming the row (the pricing has not reached it yet).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specblock_jax.aot.report import roofline_seconds

HERE = Path(__file__).resolve().parent
TOPOLOGY, BATCH, CONTEXT = "v5p:2x2x1", 1, 2048
SIZES = (4, 5, 6, 7, 8)


def row_key(label: str) -> str:
    return f"phases|{TOPOLOGY}|{BATCH}|{CONTEXT}|{label}"


def priced_ms(rows: dict, label: str, phase: str) -> tuple[float, dict]:
    """(priced ms of `phase` of the row `label`, the row); a clear error when it is not there."""
    key = row_key(label)
    row = rows.get(key)
    rec = (row or {}).get("phases", {}).get(phase)
    ms = None if rec is None else roofline_seconds(rec, row["chip"])
    if ms is None:
        raise SystemExit(f"{key}: no compiled {phase} in the TPU pricing yet (benchmarks/tpu_aot/run.py)")
    return 1000 * ms, row


def costs(results: dict, sizes=SIZES) -> dict:
    rows = results["rows"]
    target_ms, ar = priced_ms(rows, "target-only", "target_step")
    step, keys, dates = {}, {"target": row_key("target-only")}, {"target": ar["date"]}
    for k in sizes:
        step[str(k)], row = priced_ms(rows, f"DFlash block {k}", "spec_step")
        keys[str(k)], dates[str(k)] = row_key(f"DFlash block {k}"), row["date"]
    return {"step_ms": step, "target_step_ms": target_ms,
            "source": {"file": "benchmarks/tpu_aot/results.json", "rows": keys, "dates": dates,
                       "target": ar["target"], "topology": TOPOLOGY, "batch": BATCH, "context": CONTEXT,
                       "dtype": ar["dtype"], "accounting": ar["accounting"],
                       "compiler": results.get("machine", {}).get("compiler"),
                       "price": "specblock_jax.aot.report.roofline_seconds of the phase's per-device "
                                "flops and bytes_accessed (an estimate, not a measurement)"}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", default="benchmarks/tpu_aot/results.json")
    p.add_argument("--out", default=str(HERE / "costs_v5p.json"))
    args = p.parse_args(argv)
    out = costs(json.loads(Path(args.results).read_text()))
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({"step_ms": out["step_ms"], "target_step_ms": out["target_step_ms"]}, indent=2))


if __name__ == "__main__":
    main()
