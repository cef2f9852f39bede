"""Compares two `make run` output folders (outputs/humaneval of two checkouts): every method's
token ids must be identical prompt for prompt, and each method's per-batch taus (batch 1: one per
prompt) of the AFTER run must all occur among the BEFORE run's (AFTER may hold fewer prompts,
`make run LIMIT=12`; the completion files carry no per-prompt tau, results.json's `batch_taus` do).

    python benchmarks/make_run/compare_outputs.py BEFORE_DIR AFTER_DIR
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path


def token_ids(path: Path) -> dict[str, list[int]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {str(r["id"]): r["token_ids"] for r in rows}


def batch_taus(folder: Path) -> dict[str, list[float]]:
    rows = json.loads((folder / "results.json").read_text())["results"]
    return {Path(r["method"]).name: r["batch_taus"] for r in rows}


def main(before: str, after: str) -> int:
    before, after = Path(before), Path(after)
    files = sorted(p.name for p in after.glob("outputs_*.jsonl"))
    if not files:
        raise SystemExit(f"{after}: no outputs_*.jsonl")
    bad = 0
    for name in files:
        a, b = token_ids(before / name), token_ids(after / name)
        same = sum(a.get(k) == b[k] for k in b)
        bad += same != len(b) or not b
        print(f"{name}: token ids identical for {same}/{len(b)} prompts")
    taus_a, taus_b = batch_taus(before), batch_taus(after)
    for method, taus in taus_b.items():
        missing = collections.Counter(round(t, 9) for t in taus) - collections.Counter(
            round(t, 9) for t in taus_a[method])
        bad += bool(missing)
        print(f"{method}: {len(taus) - sum(missing.values())}/{len(taus)} batch taus found among the "
              f"before run's {len(taus_a[method])}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
