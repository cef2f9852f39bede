"""Repetition rate of greedy completions: the share of repeated token 4-grams.

    python assets/target/provenance/repetition_rate.py outputs/humaneval/outputs_ar_T0_b1.jsonl [...]

Per completion (a `specblock-bench` / `specblock-decode` output line with `token_ids`): 1 - distinct
4-grams / 4-grams; printed as the mean over completions with at least one 4-gram, with the share
of completions that end on EOS (fewer tokens than the budget) when `--budget` is given.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import numpy as np


def repetition(ids: list[int], n: int = 4) -> float | None:
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else None


def read(path: Path) -> list[list[int]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["token_ids"] for line in f if line.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--budget", type=int, default=None, help="max_new_tokens of the run")
    args = p.parse_args()
    for path in args.files:
        seqs = read(path)
        rates = [r for r in (repetition(s) for s in seqs) if r is not None]
        out = {"file": str(path), "completions": len(seqs), "repeated_4gram_share": float(np.mean(rates))}
        if args.budget:
            out["ended_before_budget"] = float(np.mean([len(s) < args.budget for s in seqs]))
        print(json.dumps(out))


if __name__ == "__main__":
    main()
