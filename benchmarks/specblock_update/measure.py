"""SpecBlock's drafting cost per step (propose, update) and per committed token, against EAGLE-3.

One round: the step profile (decoding/step_profile.py, batch 1, the loop's exact shapes) of the
data-matched SpecBlock (assets/drafters/specblock; specblock-data before 2026-12-07) and EAGLE-3 (assets/drafters/eagle3) on the
first --prompts held-out prompts, medians over prompts; prints one JSON line. With --tau, also a
short greedy run (--tau-prompts held-out prompts, --max-new tokens) per drafter for tau (tokens
per target forward, the bonus included; pooled: new tokens / decoding forwards).

The code measured is the `specblock_jax` on the path: run it from a checkout of the code to
measure (`PYTHONPATH=.`); the assets are always this repository's. --compare runs rounds
interleaved over several checkouts (each round in a fresh process, the order rotating) and prints
the medians per checkout:

    .venv/bin/python benchmarks/specblock_update/measure.py --compare /tmp/before /work/main --rounds 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DRAFTERS = {"specblock": ROOT / "assets/drafters/specblock", "eagle3": ROOT / "assets/drafters/eagle3"}


def one_round(args) -> dict:
    import specblock_jax as sbj
    from specblock_jax.serving.prompt_profile import median_step_profile
    from specblock_jax.decoding.prompts import encode_prompts

    target = sbj.load_target(ROOT / "assets/target")
    records, _ = sbj.read_prompts(ROOT / "assets/prompts/heldout.jsonl")
    prompts = [r["prompt"] for r in records]
    out = {"code": str(Path(sbj.__file__).resolve().parents[1])}
    for name, path in DRAFTERS.items():
        drafter, params = sbj.load_drafter(path, target)
        prof = median_step_profile(target, drafter, params, encode_prompts(target, prompts[:args.prompts]),
                                   max_new=args.max_new)
        row = {k: prof[k] for k in ("propose_ms", "update_ms", "tree_forward_ms", "verify_ms")}
        row["draft_ms"] = row["propose_ms"] + row["update_ms"]
        if args.tau:
            res = sbj.generate(target, prompts[:args.tau_prompts], drafter=sbj.LoadedDrafter(drafter, params),
                               max_new_tokens=args.max_new)
            row["tau"] = sum(r.stats.new_tokens for r in res) / sum(r.stats.target_forwards - 1 for r in res)
            row["draft_ms_per_token"] = row["draft_ms"] / row["tau"]
            row["token_ids"] = [r.token_ids for r in res]
        out[name] = row
    return out


def compare(args) -> None:
    rounds = []
    trees = [str(Path(t).resolve()) for t in args.compare]
    for rnd in range(args.rounds):
        order = trees[rnd % len(trees):] + trees[:rnd % len(trees)]
        for tree in order:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--prompts", str(args.prompts),
                   "--max-new", str(args.max_new)] + (["--tau", "--tau-prompts", str(args.tau_prompts)]
                                                      if args.tau and rnd == 0 else [])
            start = time.time()
            line = subprocess.run(cmd, cwd=tree, env={"PYTHONPATH": tree, "PATH": "/usr/bin:/bin"},
                                  check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            got = json.loads(line)
            got["round"], got["tree"], got["wall_s"] = rnd, tree, time.time() - start
            print(json.dumps({k: got[k] for k in ("round", "tree", "wall_s")}), file=sys.stderr, flush=True)
            rounds.append(got)
    summary = {}
    for tree in trees:
        mine = [r for r in rounds if r["tree"] == tree]
        summary[tree] = {name: {k: float(np.median([r[name][k] for r in mine if k in r[name]]))
                                for k in mine[0][name] if k != "token_ids"} for name in DRAFTERS}
    with_tau = [r for r in rounds if "token_ids" in r["specblock"]]
    same = {name: all(r[name]["token_ids"] == with_tau[0][name]["token_ids"] for r in with_tau)
            for name in DRAFTERS} if with_tau else None
    print(json.dumps({"rounds": rounds, "summary": summary, "same_greedy_tokens_across_checkouts": same}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=8, help="held-out prompts profiled")
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--tau", action="store_true", help="also a greedy run for tau")
    p.add_argument("--tau-prompts", type=int, default=16)
    p.add_argument("--compare", nargs="+", help="checkouts to measure, interleaved")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if args.compare:
        compare(args)
    else:
        print(json.dumps(one_round(args)))


if __name__ == "__main__":
    main()
