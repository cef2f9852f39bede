"""Where a serving-time adaptation round's time goes, on the embedded default.

Decodes a few prompts with forced updates (cost_scale=0) and reports, from the adapter's events,
the median seconds of: the buffer insert + bookkeeping, one update round (`steps` optimizer steps),
one evaluation by exact replay (`eval_rows` rows); then times on the same buffered rows the exact
replay against the old 2-step tau proxy (the objective's), and one optimizer step, each warm
(compilation excluded). Run alone (nothing else on the CPU):

    .venv/bin/python benchmarks/adaptation_cost/adapt_round_profile.py [--drafter DIR] [--prompt-file F]
        [--prompts N] [--settings train_window=64] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jax

import specblock_jax as sbj
from specblock_jax.adaptation import AdaptConfig, Adapter
from specblock_jax.adaptation.replay import buffer_spans, replay_tau
from specblock_jax.decoding.step_profile import median_seconds


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--prompt-file", type=Path, default=Path("assets/prompts/humaneval.jsonl"))
    p.add_argument("--drafter", default="assets/drafters/eagle3")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--settings", default="", help="AdaptConfig keys, e.g. train_window=64,steps=4")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    target = sbj.load_target("assets/target")
    drafter = sbj.load_drafter(args.drafter, target)
    records, _ = sbj.read_prompts(args.prompt_file)
    prompts = [r["prompt"] for r in records[: args.prompts]]
    ad = Adapter(drafter, AdaptConfig.parse(",".join(filter(None, ["cost_scale=0", args.settings]))))
    t0 = time.perf_counter()
    res = sbj.generate(target, prompts, drafter=drafter, adapter=ad, max_new_tokens=args.max_new_tokens,
                       batch_size=args.batch_size, refill=False)
    wall = time.perf_counter() - t0
    ev = ad.events
    med = lambda k: statistics.median([e[k] for e in ev if k in e]) if any(k in e for e in ev) else None  # noqa: E731
    c = ad.config
    rows = ad.buffer.rows(list(range(min(c.eval_rows, ad.buffer.size))))
    start, end = buffer_spans(rows["valid"], rows["loss_mask"])
    d = ad.drafter
    replay = jax.jit(lambda prm: replay_tau(d, ad.vocab_size, prm, rows["tokens"], rows["hidden"], start, end))
    proxy = jax.jit(lambda prm: ad.objective(d, prm, rows["hidden"], rows["tokens"], rows["loss_mask"],
                                             rows["valid"], jax.random.key(0), c.depth)[1])
    merged = ad.params  # the drafter's params with the current (adapted) weights
    out = {
        "drafter": args.drafter, "prompts": len(prompts), "batch_size": args.batch_size,
        "max_new_tokens": args.max_new_tokens, "config": {k: getattr(c, k) for k in (
            "steps", "batch_rows", "eval_rows", "window", "train_window", "capacity", "depth", "subset")},
        "trainable_params": ad.num_trainable, "job_wall_s": wall,
        "decode_s_per_batch": med("decode_s"), "adapt_s_per_batch": med("adapt_s"),
        "update_round_s": med("update_s"), "eval_s": med("eval_s"),
        "updates": ad.summary()["updates"], "adapt_compile_s": ad.compile_s,
        "replay_eval_one_weight_set_s": median_seconds(replay, merged, reps=3),
        "proxy_eval_one_weight_set_s": median_seconds(proxy, merged, reps=3),
        "tokens": sum(len(r.token_ids) for r in res),
    }
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
