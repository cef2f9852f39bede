"""The target's layers under `jax.lax.scan` (shipped) vs a Python loop over them (before): compile
seconds and decode ms/token of a greedy decoding loop, for a few depths.

    python benchmarks/scan_layers/scan_vs_unrolled.py [--layers 12,36] [--context 256] [--new 64] [--batch 1]

Both variants run the same weights inside the same jitted `fori_loop` (one token per step, KV
cache, bucketed attention):
  scan      the shipped `Transformer` (models/transformer.py): stacked weights [L, ...], a stacked
            cache [L, B, S, K, D] in the scan's carry, each layer writing its slice in place;
  unrolled  the layout before: L separate layer calls over per-layer weights, one [B, S, K, D]
            cache buffer per layer (rebuilt here from the same `DecoderLayer`).
The last step's logits of the two are compared (max abs difference printed). Run alone on the
machine; prints JSON lines.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import specblock_jax as sbj
from specblock_jax.models.kv_cache import cache_mask
from specblock_jax.models.layers import DecoderLayer, rope_cos_sin


def unrolled_forward(cfg):
    """forward(per-layer params, tokens [B, 1], positions, (k, v) tuples of [B, K, S, D], lengths)."""
    model = nnx.eval_shape(lambda: sbj.models.transformer.Transformer(cfg, nnx.Rngs(0)))
    layer_def = nnx.graphdef(DecoderLayer(cfg, jnp.float32, nnx.Rngs(0)))
    norm_def = nnx.graphdef(model.norm)

    def forward(params, tokens, positions, cache, lengths):
        x = jnp.take(params["embed_tokens"], tokens, axis=0)
        cos, sin = rope_cos_sin(positions, cfg.rope, cfg.head_dim, x.dtype)
        mask = cache_mask(jnp.ones((tokens.shape[0], 1, 1), bool), lengths, cache[0][0].shape[2])
        kv_len = jnp.max(lengths) + tokens.shape[1]
        ks, vs = [], []
        for i, p in enumerate(params["layers"]):
            x, (k, v) = nnx.merge(layer_def, p)(x, cos, sin, mask, (cache[0][i], cache[1][i]), lengths, kv_len)
            ks.append(k)
            vs.append(v)
        x = nnx.merge(norm_def, params["norm"])(x)
        head = params["lm_head"] if "lm_head" in params else params["embed_tokens"].T
        return jnp.einsum("bth,hv->btv", x, head, preferred_element_type=jnp.float32), (tuple(ks), tuple(vs))

    return forward


def decode_loop(step_fn, steps, vocab):
    def run(params, cache, lengths, tok):
        def body(i, c):
            cache, lengths, tok, _ = c
            logits, cache = step_fn(params, tok[:, None], lengths[:, None], cache, lengths)
            nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
            return cache, lengths + 1, nxt, logits[:, -1]
        init = (cache, lengths, tok, jnp.zeros((tok.shape[0], vocab), jnp.float32))
        return jax.lax.fori_loop(0, steps, body, init)[3]  # the last step's logits
    return jax.jit(run)


def measure(layers, context, new, batch, reps):
    cfg = sbj.models.config.tiny(vocab_size=8192, hidden_size=256, intermediate_size=768, num_layers=layers,
                                 num_heads=4, num_kv_heads=2, head_dim=64, max_position_embeddings=4096,
                                 tie_word_embeddings=True)
    target = sbj.init_target(cfg, seed=0)
    size = context + new + 64
    rng = np.random.default_rng(0)
    k = jnp.asarray(rng.normal(size=(layers, batch, 2, size, 64)).astype(np.float32))  # [L, B, K, S, D]
    v = jnp.asarray(rng.normal(size=(layers, batch, 2, size, 64)).astype(np.float32))
    lengths = jnp.full((batch,), context, jnp.int32)
    tok = jnp.zeros((batch,), jnp.int32)

    def scanned(params, tokens, positions, cache, lengths):
        out = sbj.models.apply(target.graphdef, params, tokens, positions,
                               jnp.ones((tokens.shape[0], 1, 1), bool), sbj.KVCache(*cache, lengths))
        return out.logits, (out.cache.k, out.cache.v)

    per_layer = {**target.params, "layers": [jax.tree.map(lambda x: x[i], target.params["layers"])
                                             for i in range(layers)]}
    variants = {"scan": (scanned, target.params, (k, v)),
                "unrolled": (unrolled_forward(cfg), per_layer, (tuple(k), tuple(v)))}
    rows, outs = [], {}
    for name, (fn, params, cache) in variants.items():
        run = decode_loop(fn, new, cfg.vocab_size)
        t0 = time.perf_counter()
        compiled = run.lower(params, cache, lengths, tok).compile()
        compile_s = time.perf_counter() - t0
        outs[name] = np.asarray(compiled(params, cache, lengths, tok))
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(params, cache, lengths, tok))
            times.append(time.perf_counter() - t0)
        rows.append({"variant": name, "layers": layers, "batch": batch, "context": context, "new": new,
                     "compile_s": round(compile_s, 2), "ms_per_token": round(1e3 * float(np.median(times)) / new, 3)})
    diff = float(np.abs(outs["scan"] - outs["unrolled"]).max())
    for r in rows:
        r["max_logit_diff"] = diff
        print(json.dumps(r), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", default="12,36")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    for n in (int(x) for x in a.layers.split(",")):
        measure(n, a.context, a.new, a.batch, a.reps)


if __name__ == "__main__":
    main()
