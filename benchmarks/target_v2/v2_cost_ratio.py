"""Cost of one EAGLE-3 drafter forward relative to one target forward, for candidate target shapes.

    python benchmarks/target_v2/v2_cost_ratio.py [--context 256] [--draft-vocab 2048]

For each candidate (layers, hidden, MLP, heads, KV heads) it builds a random target and an
EAGLE-3 drafter with a reduced draft vocabulary, compiles a one-token decoding forward of each with
a KV cache at `context` tokens (batch 1 and 8), and reports median times and their ratio, with the
parameter counts. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp

import specblock_jax as sbj
from specblock_jax.decoding.step_profile import median_seconds
from specblock_jax.drafters.common import init_model
from specblock_jax.drafters.eagle3 import Eagle3Config, Eagle3Model
from specblock_jax.models.kv_cache import init_cache

CANDIDATES = [  # layers, hidden, intermediate, heads, kv heads
    (4, 256, 768, 4, 4),  # v1
    (12, 256, 768, 4, 2),
    (14, 256, 768, 4, 2),
    (16, 256, 768, 4, 2),
    (12, 256, 1024, 4, 2),
]


def measure(layers, hidden, inter, heads, kv, batch, context, draft_vocab) -> dict:
    cfg = sbj.models.config.tiny(vocab_size=8192, hidden_size=hidden, intermediate_size=inter,
                                 num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=64,
                                 max_position_embeddings=2048)
    target = sbj.init_target(cfg, seed=0)
    cache = init_cache(cfg, batch, context + 64)._replace(lengths=jnp.full((batch,), context, jnp.int32))
    tok = jnp.zeros((batch, 1), jnp.int32)
    pos = jnp.full((batch, 1), context, jnp.int32)
    one = jnp.ones((batch, 1, 1), bool)
    tfwd = jax.jit(lambda p, c: sbj.models.apply(target.graphdef, p, tok, pos, one, c).logits)
    t_target = median_seconds(tfwd, target.params, cache, reps=30)

    dcfg = Eagle3Config.for_target(cfg)
    dcfg = Eagle3Config(**{**dcfg.__dict__, "vocab_size": draft_vocab})
    graphdef, dparams = init_model(Eagle3Model, dcfg)
    size = context + 64
    dcache = (jnp.zeros((batch, size, kv, 64)), jnp.zeros((batch, size, kv, 64)))
    emb = jnp.zeros((batch, 1, hidden))
    feat_in = jnp.zeros((batch, 1, len(dcfg.feature_layers), hidden))
    mask = jnp.broadcast_to(jnp.arange(size)[None, None, :] <= context, (batch, 1, size))
    starts = jnp.full((batch,), context, jnp.int32)

    def dfwd(p, c):
        from flax import nnx
        m = nnx.merge(graphdef, p)
        h, _ = m.step(emb, m.fuse(feat_in), pos, mask, c, starts, jnp.int32(context + 1))
        return m.logits(h)  # one forward: the layer over the cache, then the (draft-vocabulary) head

    t_draft = median_seconds(jax.jit(dfwd), dparams, dcache, reps=30)
    return {"layers": layers, "hidden": hidden, "intermediate": inter, "heads": heads, "kv_heads": kv,
            "batch": batch, "target_params": sbj.models.count_params(target.params),
            "drafter_params": sbj.models.count_params(dparams), "target_ms": 1e3 * t_target,
            "drafter_ms": 1e3 * t_draft, "ratio": t_draft / t_target}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--draft-vocab", type=int, default=2048)
    args = p.parse_args()
    for cand in CANDIDATES:
        for batch in (1, 8):
            print(json.dumps(measure(*cand, batch, args.context, args.draft_vocab)), flush=True)


if __name__ == "__main__":
    main()
