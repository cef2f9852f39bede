"""Seconds per training step of the target trainer (train/train_target.py) for a target config.

    python scripts/train_step_time.py [--config configs/target/v2.yaml] [--steps 3]

Compiles the jitted train step (params and optimizer state donated) on random token windows of
the config's batch x seq_len and prints the compile seconds and the median step seconds (tokens/s)
as one JSON line. Run alone on the machine; it uses only train.train_target's own functions, so it
also runs on an older checkout for a before/after comparison.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

from specblock_jax.models import init_target
from train.train_target import load_config, make_optimizer, make_steps, model_config


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="configs/target/v2.yaml")
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    cfg = load_config(a.config)
    target = init_target(model_config(cfg), seed=0)
    tx, _ = make_optimizer(cfg)
    params, opt_state = target.params, tx.init(target.params)
    train_step, _ = make_steps(target.graphdef, tx)
    rng = np.random.default_rng(0)
    batch = rng.integers(0, cfg["vocab_size"], (cfg["batch_size"], cfg["seq_len"] + 1)).astype(np.int32)
    t0 = time.perf_counter()
    params, opt_state, m = train_step(params, opt_state, batch)
    jax.block_until_ready(m["loss"])
    first = time.perf_counter() - t0
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        params, opt_state, m = train_step(params, opt_state, batch)
        jax.block_until_ready(m["loss"])
        times.append(time.perf_counter() - t0)
    step = float(np.median(times))
    print(json.dumps({"config": a.config, "compile_s": round(first - step, 2), "step_s": round(step, 3),
                      "tokens_per_s": round(cfg["batch_size"] * cfg["seq_len"] / step, 1)}), flush=True)


if __name__ == "__main__":
    main()
