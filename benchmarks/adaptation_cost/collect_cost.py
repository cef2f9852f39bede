"""What does the adapter's collection cost the decode loop at equal work? The same prompts decoded
greedily with a drafter, alternately without an adapter and with one that never updates
(`cost_scale=inf`: the loop collects the target's features and the buffer takes them, nothing
else), several times in one process; tokens/s of the decode loops (compilation excluded).

    python benchmarks/adaptation_cost/collect_cost.py assets/drafters/eagle3 --prompts 6 --reps 5

The first repetition compiles and is left out of the medians.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

import specblock_jax as sbj
from specblock_jax.adaptation import AdaptConfig, Adapter
from specblock_jax.decoding.methods import resolve_method


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("drafter", help="a drafter folder")
    p.add_argument("--target", default="assets/target")
    p.add_argument("--prompt-file", default="assets/prompts/heldout.jsonl")
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=128)
    args = p.parse_args()
    target = sbj.load_target(args.target)
    with open(args.prompt_file) as f:
        prompts = [json.loads(line)["prompt"] for line in f][:args.prompts]
    drafter = resolve_method(args.drafter, target)
    speeds: dict[str, list[float]] = {"plain": [], "collect": []}
    for rep in range(args.reps):
        for name in speeds:
            adapter = Adapter(drafter, AdaptConfig(cost_scale=math.inf)) if name == "collect" else None
            out = sbj.generate(target, prompts, drafter, temperature=0.0, max_new_tokens=args.max_new_tokens,
                               batch_size=args.batch_size, adapter=adapter)
            wall = sum({r.stats.batch: r.stats.total_time_s for r in out}.values())
            speeds[name].append(sum(len(r.token_ids) for r in out) / wall)
            print(f"rep {rep} {name}: {speeds[name][-1]:.1f} tok/s", flush=True)
    med = {k: float(np.median(v[1:])) for k, v in speeds.items()}
    print(json.dumps({"median_tokens_per_s": med, "collect_over_plain": med["collect"] / med["plain"],
                      "pairs": [c / q for c, q in zip(speeds["collect"][1:], speeds["plain"][1:])]}))


if __name__ == "__main__":
    main()
