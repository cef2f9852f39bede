"""Target decode-step time against the current sequence length, attention over the whole static
cache ("full") vs length buckets ("bucketed", models/attention.py).

    python benchmarks/efficiency/attention_vs_length.py --target assets/target --out outputs/attention_vs_length

Times one batched one-token decode forward (the autoregressive loop's step) and one 16-node tree
forward (a verification step) with the cache holding `length` tokens, for lengths 64..2048 in a
cache of --cache-len slots; median of --reps calls after a warm-up. Writes <out>.json and <out>.png.
Run it alone on the machine (no training or tests beside it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import jax.numpy as jnp

import specblock_jax as sbj
from specblock_jax.decoding.step_profile import median_seconds
from specblock_jax.models.kv_cache import init_cache
from specblock_jax.models.transformer import apply


def step_ms(graphdef, params, cfg, batch, nodes, length, cache_len, reps):
    cache = init_cache(cfg, batch, cache_len)._replace(lengths=jnp.full((batch,), length, jnp.int32))
    tokens = jnp.zeros((batch, nodes), jnp.int32)
    positions = length + jnp.broadcast_to(jnp.arange(nodes, dtype=jnp.int32), (batch, nodes))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((nodes, nodes), bool)), (batch, nodes, nodes))
    fn = jax.jit(lambda p, c: apply(graphdef, p, tokens, positions, mask, c).logits)
    return 1000 * median_seconds(fn, params, cache, reps=reps)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="assets/target")
    ap.add_argument("--out", type=Path, default=Path("outputs/attention_vs_length"))
    ap.add_argument("--cache-len", type=int, default=2112)
    ap.add_argument("--lengths", default="64,128,256,512,1024,2048")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args(argv)
    target = sbj.load_target(args.target)
    rows = []
    for attention in ("full", "bucketed"):
        variant = target.with_attention(attention)
        cfg, graphdef = variant.config, variant.graphdef
        for length in (int(x) for x in args.lengths.split(",")):
            for nodes in (1, 16):
                ms = step_ms(graphdef, target.params, cfg, args.batch, nodes, length, args.cache_len, args.reps)
                rows.append({"attention": attention, "length": length, "nodes": nodes, "ms": ms})
                print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"target": args.target, "params": sbj.models.count_params(target.params), "batch": args.batch,
            "cache_len": args.cache_len, "backend": jax.default_backend()}
    Path(f"{args.out}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for attention, style in (("full", "--"), ("bucketed", "-")):
        for nodes in (1, 16):
            sub = [r for r in rows if r["attention"] == attention and r["nodes"] == nodes]
            ax.plot([r["length"] for r in sub], [r["ms"] for r in sub], style, marker="o",
                    label=f"{attention}, {nodes} token{'s' if nodes > 1 else ''}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"current length (cache of {args.cache_len} slots)")
    ax.set_ylabel("ms per target forward")
    ax.set_title(f"target decode/verify step vs length ({meta['params'] / 1e6:.1f}M params, batch {args.batch})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{args.out}.png", dpi=110)


if __name__ == "__main__":
    main()
