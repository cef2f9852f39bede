"""Issue 41 item 4: one long-job run's table (tau over the job, the wall time split, the updates).

    .venv/bin/python benchmarks/long_jobs/summary.py OUT_DIR [NAME]

OUT_DIR is a `specblock-bench` output folder (results.json, adapt_*.jsonl, adapt_tau.png). Prints a
markdown table and copies the run's rows (results.json.gz, compact, per-batch series to 4 digits), its
adaptation events (gzipped jsonl) and its tau plot to benchmarks/long_jobs/NAME/ (NAME defaults to
OUT_DIR's name): the folder stays small (docs/ and benchmarks/ hold at most 3 MB).
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def events_of(out_dir: Path, row: dict) -> list[dict]:
    """The row's adaptation events (adapt_<label>_T<t>_b<b>.jsonl), [] for a plain row."""
    if not row.get("adapt"):
        return []
    t, b = row["temperature"], row["batch_size"]
    path = out_dir / f"adapt_{_label(row['method'])}_T{t:g}_b{b}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _label(method: str) -> str:
    """The bench's file label of a method (infer/labels.py `method_label`, made portable)."""
    base, sep, rest = method.partition(":")
    path = Path(base)
    name = path.parent.name if path.name == "export" and path.parent.name else path.name
    return (name + sep + rest).replace(":", "__").replace("=", "-").replace("/", "-")


def table(out_dir: Path) -> str:
    data = json.loads((out_dir / "results.json").read_text())
    meta, rows = data["meta"], data["results"]
    lines = [f"`{meta['command']}`", "", f"{meta['num_prompts']} prompts, {meta['date']}, complete: "
             f"{meta.get('complete')}. Wall split: decoding (the decode loops) and adaptation, the latter "
             "divided into update rounds, their evaluations and the calibration (adaptation events); "
             "compilation excluded from both, as in the bench.", "",
             "| T | batch | method | new tokens | tau (run) | speedup vs target-only [round min-max] | decode s "
             "| adapt s | of it: updates / evaluations / calibration s | updates made / kept / rolled back |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ev = events_of(out_dir, r)
        upd = sum(e.get("update_s", 0.0) for e in ev)
        evs = sum(e.get("eval_s", 0.0) for e in ev)
        cal = sum(e.get("calibration_s", 0.0) for e in ev)
        a = r.get("adapt") or {}
        made, back = a.get("updates", 0), a.get("rolled_back", 0)
        rounds = r["round_speedups"]
        lines.append(
            f"| {r['temperature']:g} | {r['batch_size']} | {r['method']} | {r['new_tokens']} | {r['tau_run']:.3f} | "
            f"{r['speedup']:.3f}x [{min(rounds):.2f}-{max(rounds):.2f}] | {r['decode_s']:.1f} | {r['adapt_s']:.1f} | "
            + (f"{upd:.1f} / {evs:.1f} / {cal:.1f} | {made} / {made - back} / {back} |" if a else "- | - |"))
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    out_dir = Path(argv[0])
    name = argv[1] if len(argv) > 1 else out_dir.name
    dest = HERE / name
    dest.mkdir(exist_ok=True)
    if (out_dir / "adapt_tau.png").exists():
        shutil.copy(out_dir / "adapt_tau.png", dest / "adapt_tau.png")
    for p in out_dir.glob("adapt_*.jsonl"):
        (dest / (p.name + ".gz")).write_bytes(gzip.compress(p.read_bytes(), mtime=0))
    data = json.loads((out_dir / "results.json").read_text())
    for r in data["results"]:
        for key in ("batch_taus", "batch_tokens_per_s"):
            if r.get(key) is not None:
                r[key] = [round(x, 4) for x in r[key]]
    (dest / "results.json.gz").write_bytes(gzip.compress(json.dumps(data, separators=(",", ":")).encode(), mtime=0))
    md = table(out_dir)
    (dest / "results.md").write_text(f"# Long job: {name}\n\n{md}\n")
    print(md)


if __name__ == "__main__":
    main(sys.argv[1:])
