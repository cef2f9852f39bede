"""Drafting cost (propose + update) of the same drafters under two engine versions.

    python benchmarks/efficiency/draft_cost_compare.py --target DIR --drafters D1,D2 --accepted 3,1 [--batch 1]

Uses only the drafter protocol (`init_state`, `propose`, `update`), which is unchanged since the
efficiency work began, so the same file runs from an old commit's tree (`git worktree`) and from
the current one and times the same drafter folders at the same shapes: a batch of B prompts of
`--length` tokens in a prompt bucket of `--bucket`, the cache sized as `generate` sizes it, a tree
proposed from that state, and an `update` after a verification that accepted `--accepted` nodes
along the tree's first-child chain (the state and inputs are zeros: on a CPU the cost of these
static-shape programs does not depend on values, except through the accepted count, which selects
row buckets in the newer `update`s). Each call is compiled alone and timed as the median of
`--reps` calls. Prints one JSON line per drafter.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

import specblock_jax as sbj
from specblock_jax.decoding.step_profile import median_seconds
from specblock_jax.drafters.base import DraftContext, Prefill
from specblock_jax.trees.verify import VerifyResult


def _chain_result(parents: np.ndarray, tokens: np.ndarray, accepted: int) -> VerifyResult:
    """VerifyResult accepting `accepted` nodes along each row's first-child chain (host side)."""
    b, n = parents.shape
    path = np.zeros((b, n), np.int32)
    count = np.zeros((b,), np.int32)
    for r in range(b):
        node, depth = 0, 0
        while depth < accepted:
            kids = [j for j in range(1, n) if parents[r, j] == node]
            if not kids:
                break
            node = kids[0]
            depth += 1
            path[r, depth] = node
        count[r] = depth
    new = np.full((b, n), -1, np.int32)
    for r in range(b):
        new[r, :count[r]] = tokens[r, path[r, 1:count[r] + 1]]
        new[r, count[r]] = 0
    return VerifyResult(jnp.asarray(path), jnp.asarray(count), jnp.zeros((b,), jnp.int32), jnp.asarray(new))


def measure(target, drafter, params, *, batch: int, length: int, bucket: int, max_new: int,
            accepted: int, reps: int) -> dict:
    cfg = target.config
    n = drafter.num_nodes
    cache_len = -(-(bucket + max_new + n) // 64) * 64
    n_hidden = len(drafter.hidden_ids)
    dtype = jnp.dtype(cfg.dtype)
    hidden = jnp.zeros((batch, bucket, n_hidden, cfg.hidden_size), dtype) if n_hidden else None
    lengths = jnp.full((batch,), length, jnp.int32)
    prefill = Prefill(jnp.zeros((batch, bucket), jnp.int32), lengths, hidden,
                      jnp.zeros((batch, cfg.vocab_size), jnp.float32), jnp.zeros((batch,), jnp.int32))
    state = jax.jit(lambda p, pre: drafter.init_state(p, pre, cache_len))(params, prefill)
    ctx = DraftContext(jnp.zeros((batch, cache_len), jnp.int32), lengths + 1,
                       jnp.zeros((batch,), jnp.int32), lengths)
    keys = jax.random.split(jax.random.key(0), batch)
    propose = jax.jit(lambda p, s, c, k: drafter.propose(p, s, c, k))
    tree, after = propose(params, state, ctx, keys)
    propose_ms = 1e3 * median_seconds(propose, params, state, ctx, keys, reps=reps)
    result = _chain_result(np.asarray(tree.parents), np.asarray(tree.tokens), accepted)
    tree_hidden = jnp.zeros((batch, n, n_hidden, cfg.hidden_size), dtype) if n_hidden else None
    update = jax.jit(lambda p, s, c, r, h: drafter.update(p, s, c, r, h))
    update_ms = 1e3 * median_seconds(update, params, after, ctx, result, tree_hidden, reps=reps)
    return {"propose_ms": round(propose_ms, 4), "update_ms": round(update_ms, 4),
            "draft_ms": round(propose_ms + update_ms, 4), "accepted": int(np.max(np.asarray(result.num_accepted))),
            "num_nodes": n, "batch": batch, "length": length, "cache_len": cache_len}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafters", required=True, help="comma-separated drafter folders")
    ap.add_argument("--accepted", required=True, help="accepted nodes per drafter, comma-separated")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--length", type=int, default=192, help="tokens in the cache when drafting")
    ap.add_argument("--bucket", type=int, default=256, help="the prompt bucket (static prompt width)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--label", default="")
    args = ap.parse_args(argv)
    target = sbj.load_target(args.target)
    folders = args.drafters.split(",")
    accepted = [int(a) for a in args.accepted.split(",")]
    if len(accepted) != len(folders):
        ap.error(f"--accepted has {len(accepted)} entries for {len(folders)} drafters")
    for folder, acc in zip(folders, accepted):
        drafter, params = sbj.load_drafter(folder, target)
        row = measure(target, drafter, params, batch=args.batch, length=args.length, bucket=args.bucket,
                      max_new=args.max_new_tokens, accepted=acc, reps=args.reps)
        print(json.dumps({"label": args.label, "drafter": folder, **row}), flush=True)


if __name__ == "__main__":
    main()
