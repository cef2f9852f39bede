"""Which parameters should serving-time adaptation train? One replay buffer of served prompts, then
the same number of update rounds per setting; tau on held-out prompts after 4 and 8 rounds and the
seconds the rounds took (compilation excluded). Prints one JSON line per setting.

    python scripts/adaptation_subsets.py --drafter assets/drafters/eagle3 \
        "subset=all,learning_rate=1e-4,depth=4" "subset=layer,learning_rate=3e-4,depth=2"

Buffer: served answers (128 new tokens, greedy, batch 4) to window prompts 0-99; evaluation: mean
tau over window prompts 100-163 (greedy, batch 8). Settings are AdaptConfig keys; give every key
that matters explicitly (defaults change).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

import specblock_jax as sbj
from specblock_jax.adaptation import AdaptConfig, Adapter


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("settings", nargs="+", help="AdaptConfig keys, e.g. subset=layer,learning_rate=3e-4")
    p.add_argument("--drafter", default="assets/drafters/eagle3")
    p.add_argument("--target", default="assets/target")
    p.add_argument("--prompts", default="assets/prompts/windows.jsonl")
    p.add_argument("--rounds", default="4,8")
    args = p.parse_args()
    target = sbj.load_target(args.target)
    prompts = [json.loads(line)["prompt"] for line in open(args.prompts, encoding="utf-8")]
    served, held_out = prompts[:100], prompts[100:164]
    drafter, params = sbj.load_drafter(args.drafter, target)

    def tau(weights) -> float:
        res = sbj.generate(target, held_out, drafter=(drafter, weights), max_new_tokens=128, batch_size=8)
        return statistics.mean(r.stats.tau for r in res if r.stats.tau is not None)  # None: no step (EOS first)

    collect = Adapter(drafter, params, AdaptConfig(cost_scale=math.inf, capacity=128, window=256))
    sbj.generate(target, served, drafter=(drafter, params), max_new_tokens=128, batch_size=4, adapter=collect)
    print(json.dumps({"setting": "none", "tau": round(tau(params), 3)}), flush=True)
    marks = [int(r) for r in args.rounds.split(",")]
    for setting in args.settings:
        cfg = AdaptConfig.parse(f"capacity=128,window=256,{setting}")
        ad = Adapter(drafter, params, cfg)
        ad.buffer = collect.buffer
        spent, curve = 0.0, []
        for r in range(1, max(marks) + 1):
            ad.trainable, ad.opt_state, loss, seconds = ad._update()
            spent += seconds
            if r in marks:
                curve.append({"rounds": r, "update_s": round(spent, 1), "loss": round(loss, 3),
                              "tau": round(tau(ad.params), 3)})
        print(json.dumps({"setting": setting, "trainable": ad.num_trainable, "curve": curve}), flush=True)


if __name__ == "__main__":
    main()
