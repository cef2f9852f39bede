"""Issue 58, phase 0 (go/no-go before any long BlockPilot run): do requests differ in their best
DFlash block size at all, in a window on both sides of the drafter's training size?

The shipped DFlash (training block B = 8) decodes 64 training prompts greedily (T = 0) at every
size of the window B-2..B+2 = 6..10, at 128 and at 64 new tokens. Per prompt and size, tau =
tokens committed per verification forward (bonus included; the prefill's token and forward left
out). Greedy rows are independent of their batch, so batches of 8 give each prompt's batch-1 tau.

Reported (results.json and the printed table):
  - the per-size tau curve (mean over prompts, at 128 tokens): is there a peak near B?
  - the share of prompts whose forward counts tie at all sizes;
  - the per-prompt oracle (each prompt at its best size) against the best fixed size: mean gain in
    tau and its standard error over prompts (paired); go only if the gain > 2 standard errors;
  - a split-half check: each prompt's preferred size (highest tau, ties to the smallest size, as
    the reference's labels) on tokens 1-64 (the 64-token run) against tokens 65-128 (the 128-token
    run's tokens and forwards beyond the 64-token run's): their correlation over prompts.

    python benchmarks/blockpilot_phase0/phase0.py [--prompts N] [--out benchmarks/blockpilot_phase0/results.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

import specblock_jax as sbj

ROOT = Path(__file__).resolve().parents[2]


def taus(target, drafter, prompts, size: int, new_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(new tokens, decoding forwards) per prompt with the drafter at block `size`."""
    sized = sbj.LoadedDrafter(dataclasses.replace(drafter.drafter, block_size=size), drafter.params)
    res = sbj.generate(target, prompts, sized, max_new_tokens=new_tokens,
                       options=sbj.DecodeOptions(batch_size=8, refill=False))
    return (np.asarray([r.stats.new_tokens - 1 for r in res], float),
            np.asarray([r.stats.target_forwards - 1 for r in res], float))


def preferred(tau: np.ndarray, sizes: list[int]) -> np.ndarray:
    """Each prompt's size of highest tau, ties to the smallest size ([P, S] -> [P] sizes)."""
    best = tau.max(axis=1, keepdims=True)
    return np.asarray(sizes)[np.argmax(np.isclose(tau, best, rtol=0, atol=1e-12), axis=1)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/blockpilot_phase0/results.json")
    args = p.parse_args()
    target = sbj.load_target(ROOT / "assets/target")
    drafter = sbj.load_drafter(ROOT / "assets/drafters/dflash", target)
    trained = int(drafter.drafter.config.block_size)
    sizes = list(range(trained - 2, trained + 3))
    records, _ = sbj.read_prompts(ROOT / "assets/prompts/train.jsonl")
    prompts = [r["prompt"] for r in records[:args.prompts]]
    start = time.perf_counter()
    runs = {n: [taus(target, drafter, prompts, s, n) for s in sizes] for n in (64, 128)}
    tok = {n: np.stack([t for t, _ in runs[n]], axis=1) for n in runs}  # [P, S]
    fwd = {n: np.stack([f for _, f in runs[n]], axis=1) for n in runs}
    tau = tok[128] / fwd[128]
    fixed = tau.mean(axis=0)
    best_fixed = int(np.argmax(fixed))
    gain = tau.max(axis=1) - tau[:, best_fixed]  # per prompt, paired with the best fixed size
    se = float(gain.std(ddof=1) / np.sqrt(len(gain)))
    first = preferred(tok[64] / fwd[64], sizes)
    second = preferred((tok[128] - tok[64]) / np.maximum(fwd[128] - fwd[64], 1), sizes)
    corr = float(np.corrcoef(first, second)[0, 1]) if first.std() and second.std() else float("nan")
    out = {
        "date": time.strftime("%Y-%m-%d"), "prompts": len(prompts), "trained_block": trained, "sizes": sizes,
        "tau_mean_128": dict(zip(map(str, sizes), map(float, fixed))),
        "tau_mean_64": dict(zip(map(str, sizes), map(float, (tok[64] / fwd[64]).mean(axis=0)))),
        "best_fixed_size": sizes[best_fixed],
        "ties_at_all_sizes": float(np.mean(np.all(fwd[128] == fwd[128][:, :1], axis=1))),
        "oracle_gain_tau": float(gain.mean()), "oracle_gain_se": se,
        "oracle_gain_relative": float(gain.mean() / fixed[best_fixed]),
        "go": bool(gain.mean() > 2 * se),
        "preferred_size_counts_128": {str(s): int(np.sum(preferred(tau, sizes) == s)) for s in sizes},
        "split_half_corr": corr,
        "split_half_same_size": float(np.mean(first == second)),
        "per_prompt": {"tokens": {str(n): tok[n].tolist() for n in tok}, "forwards": {str(n): fwd[n].tolist() for n in fwd}},
        "wall_s": time.perf_counter() - start,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "per_prompt"}, indent=1))


if __name__ == "__main__":
    main()
