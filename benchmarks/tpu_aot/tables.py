"""Markdown tables of benchmarks/tpu_aot/results.json (run.py's rows), printed for results.md.

    python benchmarks/tpu_aot/tables.py [results.json]

ms = the roofline of the TPU compiler's per-device FLOPs and bytes on the chip (report.py
`roofline_seconds`); "compiler ms" = its own optimal_seconds where it gave one. Priced speedup =
tau x priced target_step / priced spec_step, tau measured on the embedded default (run.py TAU).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specblock_jax.aot.report import roofline_seconds

HERE = Path(__file__).resolve().parent
DECODE = ("prefill", "target_step", "propose", "tree_forward", "verify_commit", "update", "spec_step")
GB = 1e9


def _ms(rec, chip):
    if not rec or not rec.get("compiled"):
        return None
    s = roofline_seconds(rec, chip) if rec.get("flops") is not None else None
    return None if s is None else 1000 * s


def _f(x, fmt="{:.2f}"):
    return "-" if x is None else fmt.format(x)


def _fits(rec):
    if not rec:
        return "-"
    if not rec.get("compiled"):
        gb = rec.get("device_bytes")
        return "no (OOM" + (f", {gb / GB:.1f} GB" if gb else "") + ")"
    return ("yes" if rec["fits"] else "NO") + f" ({rec['device_bytes'] / GB:.1f} GB)"


def phase_rows(rows: dict):
    out = {}
    for key, r in rows.items():
        if key.startswith("phases|") and "phases" in r:
            _, topo, b, ctx, label = key.split("|")
            out[(topo, int(b), int(ctx), label)] = r
    return out


def ar_step_ms(rows, topo, b, ctx):
    ar = rows.get((topo, b, ctx, "target-only"))
    return None if ar is None else _ms(ar["phases"].get("target_step"), ar["chip"])


def speedup(rows, key, r):
    topo, b, ctx, _ = key
    step = "target_step" if r["nodes"] == 0 else "spec_step"
    ar, ms = ar_step_ms(rows, topo, b, ctx), _ms(r["phases"].get(step), r["chip"])
    return None if r.get("tau") is None or not ar or not ms else r["tau"] * ar / ms


def phases_table(rows, topo, b, ctx) -> str:
    lines = [f"**{topo}, batch {b}, context {ctx}** (ms per call, per device)", "",
             "| method | N | " + " | ".join(DECODE) + " | spec_step compiler ms | fits (GB/device) | tau | priced speedup | slowest compile s |",
             "|" + "---|" * (len(DECODE) + 7)]
    for (t, bb, cc, label), r in rows.items():
        if (t, bb, cc) != (topo, b, ctx):
            continue
        ph = r["phases"]
        step = ph.get("spec_step") or ph.get("target_step")
        cells = [_f(_ms(ph.get(p), r["chip"]), "{:.3f}") for p in DECODE]
        comp = step.get("optimal_seconds") if step else None
        slowest = max((p.get("compile_s") or 0) for p in ph.values())
        lines.append(f"| {label} | {r['nodes']} | " + " | ".join(cells) +
                     f" | {_f(comp and 1000 * comp, '{:.3f}')} | {_fits(step)} | {_f(r.get('tau'))} | "
                     f"{_f(speedup(rows, (t, bb, cc, label), r))} | {slowest:.0f} |")
    return "\n".join(lines)


def grid_table(rows) -> str:
    keys = sorted({k[:3] for k in rows})
    labels = list(dict.fromkeys(k[3] for k in rows))
    head = " | ".join(f"{t} B={b} {c // 1024}k" for t, b, c in keys)
    lines = ["Step ms (target_step for target-only, spec_step otherwise) / fits / priced speedup", "",
             f"| method | {head} |", "|" + "---|" * (len(keys) + 1)]
    for label in labels:
        cells = []
        for t, b, c in keys:
            r = rows.get((t, b, c, label))
            if r is None:
                cells.append("not run")
                continue
            step = r["phases"].get("spec_step") or r["phases"].get("target_step")
            sp = speedup(rows, (t, b, c, label), r)
            cells.append(f"{_f(_ms(step, r['chip']), '{:.2f}')} / {'yes' if step and step.get('fits') else 'no'}"
                         f" / {_f(sp)}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compile_table(all_rows: dict) -> str:
    lines = ["| topology | batch | method | compiled | fits (GB/device) | compile s |", "|---|---|---|---|---|---|"]
    for key, r in all_rows.items():
        if not key.startswith("compile|") or "phases" not in r:
            continue
        _, topo, b, method = key.split("|")
        rec = r["phases"].get("spec_step") or r["phases"].get("target_step")
        lines.append(f"| {topo} | {b} | {method} | {'yes' if rec.get('compiled') else 'no'} | {_fits(rec)} | "
                     f"{rec.get('compile_s', '-')} |")
    return "\n".join(lines)


def train_table(all_rows: dict) -> str:
    lines = ["| target | slice | mesh | batch x seq | drafter | fits (GB/device) | compile s |",
             "|---|---|---|---|---|---|---|"]
    for key, r in all_rows.items():
        if not key.startswith("train|") or "phases" not in r:
            continue
        _, target, topo, size, method = key.split("|")
        rec = r["phases"].get("train_step", {})
        lines.append(f"| {target} | {topo} | {rec.get('train_mesh', '-')} | {size} | {method} | {_fits(rec)} | "
                     f"{rec.get('compile_s', '-')} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    path = Path((argv or sys.argv[1:] or [HERE / "results.json"])[0])
    data = json.loads(path.read_text())
    rows = phase_rows(data["rows"])
    for topo, b, ctx in sorted({k[:3] for k in rows if k[1] == 1 and k[2] == 2048}):
        print(phases_table(rows, topo, b, ctx), "\n")
    print(grid_table(rows), "\n")
    print(compile_table(data["rows"]), "\n")
    print(train_table(data["rows"]))


if __name__ == "__main__":
    main()
