"""Why every drafter's tau falls to ~1.5 at T = 1 (results.md): the ceiling the miniature target
itself sets.

    .venv/bin/python benchmarks/seed_claims/t1_acceptance.py [--limit 32] [--max-new-tokens 128]

Decodes the first `limit` held-out prompts with target-only sampling at T = 1 (seed 0), then runs the
target over prompt + sample once and reads, at every generated position, its next-token
distribution p: the mean of max p (the chance that a perfect greedy draft, q one-hot on the
target's argmax, passes rejection sampling: min(1, p/q) = p(argmax)), the mean entropy (nats), and
the tau a one-path greedy draft of depth d would reach if those acceptances were independent
along the path: 1 + a + a^2 + ... + a^d with a = mean max p (at d = 4 and 7; a tree offering
several children per node can pass more often). Printed as JSON.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

import specblock_jax as sbj
from specblock_jax.decoding import encode_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    target = sbj.load_target("assets/target")
    prompts = [r["prompt"] for r in sbj.read_prompts("assets/prompts/heldout.jsonl")[0][: args.limit]]
    results = sbj.generate(target, prompts, max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0)
    pmax, ent = [], []
    for ids, res in zip(encode_prompts(target, prompts), results, strict=True):
        seq = list(ids) + list(res.token_ids)
        logits = sbj.forward(target, jnp.asarray([seq], jnp.int32))[0]
        gen = logits[len(ids) - 1: len(seq) - 1]  # the distributions the new tokens were drawn from
        p = jax.nn.softmax(gen, axis=-1)
        pmax.append(np.asarray(p.max(-1)))
        ent.append(np.asarray(-(p * jax.nn.log_softmax(gen, axis=-1)).sum(-1)))
    a = float(np.concatenate(pmax).mean())
    print(json.dumps({
        "prompts": len(prompts), "positions": int(sum(len(x) for x in pmax)),
        "mean_max_p": round(a, 4), "median_max_p": round(float(np.median(np.concatenate(pmax))), 4),
        "mean_entropy_nats": round(float(np.concatenate(ent).mean()), 3),
        "greedy_path_tau_ceiling": {d: round(sum(a ** k for k in range(d + 1)), 3) for d in (4, 7)},
    }))


if __name__ == "__main__":
    main()
