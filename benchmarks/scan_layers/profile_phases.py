"""Median step profile (decoding/step_profile.py) of several methods over a prompt set, per phase.

    python benchmarks/scan_layers/profile_phases.py --methods assets/drafters/eagle3,assets/drafters/specblock \
        --prompts assets/prompts/humaneval.jsonl --limit 16 --reps 15

For each method and prompt (batch 1, the prompt's own length bucket, `generate`'s cache length),
every phase of one decoding step is compiled alone and timed (median of --reps calls); the
medians over prompts are printed as JSON lines. Run it alone on the machine. It measures the same
drafters before and after an engine change when run from each commit's tree (benchmarks/scan_layers/results.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import specblock_jax as sbj
from specblock_jax.decoding.job import encode_prompts
from specblock_jax.decoding.methods import resolve_drafter, resolve_method
from specblock_jax.decoding.prompt_profile import median_step_profile


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="assets/target")
    ap.add_argument("--prompts", default="assets/prompts/humaneval.jsonl")
    ap.add_argument("--methods", required=True)
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args(argv)
    target = sbj.load_target(args.target)
    records, _ = sbj.read_prompts(Path(args.prompts))
    ids = encode_prompts(target, [r["prompt"] for r in records[:args.limit]])
    for method in args.methods.split(","):
        spec = resolve_drafter(resolve_method(method, target))
        drafter, params = spec if spec is not None else (None, ())
        prof = median_step_profile(target, drafter, params, ids, max_new=args.max_new_tokens, reps=args.reps)
        keys = [k for k in prof if k.endswith("_ms")]
        print(json.dumps({"method": method, "prompts": len(ids),
                          **{k: round(prof[k], 4) for k in keys}}), flush=True)


if __name__ == "__main__":
    main()
