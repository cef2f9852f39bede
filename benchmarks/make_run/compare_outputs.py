"""Compares two `make run` output folders (outputs/humaneval of two checkouts): per method and
prompt, the token ids and tau must be identical (a refactor of the decode loop changes neither).
AFTER_DIR may hold fewer prompts (`make run LIMIT=12`): every prompt it holds is compared.

    python benchmarks/make_run/compare_outputs.py BEFORE_DIR AFTER_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def read(path: Path) -> dict[str, tuple[list[int], float | None]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {str(r["id"]): (r["token_ids"], r["stats"].get("tau")) for r in rows}


def main(before: str, after: str) -> int:
    files = sorted(p.name for p in Path(before).glob("outputs_*.jsonl"))
    if not files:
        raise SystemExit(f"{before}: no outputs_*.jsonl")
    bad = 0
    for name in files:
        a, b = read(Path(before) / name), read(Path(after) / name)
        same_ids = sum(a[k][0] == b[k][0] for k in b if k in a)
        same_tau = sum(a[k][1] == b[k][1] for k in b if k in a)
        ok = bool(b) and set(b) <= set(a) and same_ids == same_tau == len(b)
        bad += not ok
        print(f"{name}: {len(b)} prompts compared, token ids identical {same_ids}/{len(b)}, tau identical "
              f"{same_tau}/{len(b)}{'' if ok else '  DIFFERENT'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
