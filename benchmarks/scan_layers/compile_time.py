"""Compile seconds and steady decode speed of every decoding method, for a target shape.

    python benchmarks/scan_layers/compile_time.py [--layers 12] [--methods ar,prompt_lookup,eagle3,specblock,dflash]
                                   [--new 64] [--reps 3] [--out FILE.jsonl]

Builds a random target of v2's shape (hidden 256, 4 query / 2 KV heads, MLP 768) with `--layers`
layers, and a randomly initialised drafter of each learned kind through its training task (full
target vocabulary). For each method, after `jax.clear_caches()`: the first `sbj.generate` call
(compile + run) and `--reps` more identical calls; compile_s = first - median(rest);
ms_per_token = median(rest) / new tokens. One prompt, batch 1, greedy. Random drafters accept
little (tau near 1), so ms/token here compares code versions, not methods. Run alone on the
machine; uses only the public API, so the same file runs on an older checkout (git worktree) for
a before/after comparison.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

import specblock_jax as sbj
from specblock_jax.drafters import registry

TASK_SETTINGS = {
    "eagle3": {"num_nodes": 16, "top_k": 4, "depth": 5},
    "specblock": {"num_nodes": 16},
    "dflash": {},
}


def drafter_for(method: str, target):
    if method in ("ar", "prompt_lookup"):
        return None if method == "ar" else "prompt_lookup"
    task = registry.get(method).task(TASK_SETTINGS[method], target)
    return task.decoding_drafter(task.init_params(jax.random.key(0)))


def measure(method: str, target, prompt: list[int], new: int, reps: int) -> dict:
    drafter = drafter_for(method, target)
    jax.clear_caches()

    def run():
        t0 = time.perf_counter()
        out = sbj.generate(target, [prompt], drafter=drafter, max_new_tokens=new, batch_size=1)
        return time.perf_counter() - t0, out[0]

    first, res = run()
    rest = [run()[0] for _ in range(reps)]
    steady = float(np.median(rest))
    return {"method": method, "layers": target.config.num_layers, "new_tokens": len(res.token_ids),
            "compile_s": round(first - steady, 2), "steady_s": round(steady, 3),
            "ms_per_token": round(1e3 * steady / max(len(res.token_ids), 1), 3)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--methods", default="ar,prompt_lookup,eagle3,specblock,dflash")
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--prompt-len", type=int, default=100)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    cfg = sbj.models.config.tiny(vocab_size=8192, hidden_size=256, intermediate_size=768,
                                 num_layers=a.layers, num_heads=4, num_kv_heads=2, head_dim=64,
                                 max_position_embeddings=2048, tie_word_embeddings=True)
    target = sbj.init_target(cfg, seed=0)
    prompt = np.random.default_rng(0).integers(4, cfg.vocab_size, a.prompt_len).tolist()
    for method in a.methods.split(","):
        row = measure(method, target, prompt, a.new, a.reps)
        print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
