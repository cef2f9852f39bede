"""Side-by-side markdown table of two `specblock-bench` runs (e.g. before and after a change).

    python scripts/bench_compare.py BEFORE_DIR AFTER_DIR

Speedups are ratios within each run (its own target-only baseline), so the two runs compare even
when the machine's absolute speed drifted between them. Columns a run lacks print as '-'.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(run: Path) -> dict:
    data = json.loads((run / "results.json").read_text())["results"]
    return {(r["temperature"], r["batch_size"], r["method"]): r for r in data}


def cell(r: dict | None, key: str, fmt: str) -> str:
    if r is None or r.get(key) is None:
        return "-"
    return format(r[key] * (1000 if key == "draft_s_per_token" else 1), fmt)


def main(before: str, after: str) -> None:
    a, b = rows(Path(before)), rows(Path(after))
    print("| T | batch | method | tau median before / after | speedup before / after | draft ms/token "
          "before / after | draft share before / after | ideal after | achieved / ideal after |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in list(dict.fromkeys([*a, *b])):
        x, y = a.get(key), b.get(key)
        t, bs, m = key
        print(f"| {t:g} | {bs} | {m} | {cell(x, 'tau_median', '.2f')} / {cell(y, 'tau_median', '.2f')} | "
              f"{cell(x, 'speedup', '.2f')}x / {cell(y, 'speedup', '.2f')}x | "
              f"{cell(x, 'draft_s_per_token', '.3f')} / {cell(y, 'draft_s_per_token', '.3f')} | "
              f"{cell(x, 'draft_share', '.0%')} / {cell(y, 'draft_share', '.0%')} | "
              f"{cell(y, 'ideal_speedup', '.2f')}x | {cell(y, 'achieved_over_ideal', '.2f')} |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
