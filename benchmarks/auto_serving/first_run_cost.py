"""Is a decode loop's first run slower than its later runs? The same prompt groups decoded four times
in one process (greedy, 128 new tokens, batch 1 by default); the first pass compiles each loop (its warm-up
included, decoding/compiled.py) and runs it first.

    python benchmarks/auto_serving/first_run_cost.py assets/drafters/eagle3      # or ar
    python benchmarks/auto_serving/first_run_cost.py ar --batch-size 4 --pairs 2  # groups of 2 x 4 prompts

Prints tokens/s of each group's decode loops (compilation excluded) per pass.
"""

from __future__ import annotations

import argparse
import json

import specblock_jax as sbj
from specblock_jax.serving.methods import resolve_method


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("method", help="ar, prompt_lookup or a drafter folder")
    p.add_argument("--target", default="assets/target")
    p.add_argument("--prompts", default="assets/prompts/heldout.jsonl")
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--passes", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=1, help="each group is 2 x batch-size prompts")
    args = p.parse_args()
    target = sbj.load_target(args.target)
    with open(args.prompts) as f:
        prompts = [json.loads(line)["prompt"] for line in f][:2 * args.pairs * args.batch_size]
    drafter = resolve_method(args.method, target)
    for rep in range(args.passes):
        group = 2 * args.batch_size
        for k in range(0, len(prompts), group):
            out = sbj.generate(target, prompts[k:k + group], drafter, temperature=0.0, max_new_tokens=128,
                               batch_size=args.batch_size)
            wall = sum({r.stats.batch: r.stats.total_time_s for r in out}.values())
            compile_s = sum({r.stats.batch: r.stats.compile_s for r in out}.values())
            tokens = sum(len(r.token_ids) for r in out)
            print(f"{args.method} pass {rep} group {k // group}: {tokens / wall:.0f} tok/s (loops {wall:.3f} s, "
                  f"compile {compile_s:.2f} s)", flush=True)


if __name__ == "__main__":
    main()
