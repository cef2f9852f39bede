"""Training FLOPs per step of drafter configs, and the steps that match a compute budget.

Each config's train step is lowered (not compiled, not run) at its batch shape [batch_size, max_len]
and XLA's cost analysis counts its FLOPs (a multiply-add = 2), the same count `specblock-train`
writes into metrics.jsonl ("flops", cumulative) and summary.json ("flops_per_step"). The frozen
target's forward inside the step is included. With --budget-from a finished run's summary.json (or
a FLOP count), prints the max_steps that spends the same compute for every config.

    python scripts/train_flops.py eagle3:configs/drafters/eagle3-v2.yaml \
        specblock:configs/drafters/specblock-v2.yaml --budget-from runs/eagle3/eagle3-v2/summary.json

A draft vocabulary that specblock-train would count from the data is replaced by the first
draft_vocab_size ids here: FLOPs depend on its size only.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import jax
import numpy as np

import specblock_jax as sbj
from specblock_jax.drafters import draft_vocab, registry
from specblock_jax.training.trainer import make_optimizer, make_train_step, step_flops, with_defaults
from train import cli


def config_flops(kind: str, path: str, overrides: list[str], tmp: Path) -> dict:
    """{"config", "kind", "batch", "max_steps", "flops_per_step", "flops_at_max_steps"}."""
    cfg = cli.resolve_paths(cli.load_drafter_config(path, overrides, cli.kind_defaults(kind)), kind)
    run_keys = {*cli.CLI_DEFAULTS, *cli.TRAINER_DEFAULTS, "kind", "run_dir", "out_dir"}
    settings = {k: v for k, v in cfg.items() if k not in run_keys}
    target = sbj.load_target(cfg["target_dir"], dtype=cfg["target_dtype"] or None)
    if settings.get("draft_vocab_size") and not settings.get("draft_vocab"):
        size, vocab_size = settings["draft_vocab_size"], target.config.vocab_size
        counts = np.arange(vocab_size, 0, -1, dtype=np.int64)  # any map of that size costs the same
        folder = tmp / f"{kind}-{size}"
        draft_vocab.save(folder, draft_vocab.from_counts(counts, size))
        settings["draft_vocab"] = str(folder / draft_vocab.FILE)
    task = registry.get(kind).task(settings, target)
    tx, _ = make_optimizer(with_defaults(cfg))
    params = task.init_params(jax.random.key(0))
    shape = (cfg["batch_size"], cfg["max_len"])
    batch = {"tokens": np.zeros(shape, np.int32), "loss_mask": np.ones(shape, np.int32),
             "attention_mask": np.ones(shape, np.int32)}
    flops = step_flops(make_train_step(task, tx), params, tx.init(params), task.frozen(), batch,
                       jax.random.key(0))
    return {"config": path, "kind": kind, "batch": list(shape), "max_steps": cfg["max_steps"],
            "flops_per_step": flops, "flops_at_max_steps": flops * cfg["max_steps"] if flops else None}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="+", help="KIND:CONFIG.yaml items, then key=value overrides for all")
    ap.add_argument("--budget-from", help="a training run's summary.json (its train_flops) or a FLOP count")
    ap.add_argument("--out", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    paths = [c.split(":", 1) for c in args.configs if "=" not in c]
    if any(len(p) != 2 for p in paths):
        ap.error("configs are KIND:CONFIG.yaml, e.g. eagle3:configs/drafters/eagle3-v2.yaml")
    overrides = [c for c in args.configs if "=" in c]
    budget = None
    if args.budget_from:
        src = Path(args.budget_from)
        budget = json.loads(src.read_text())["train_flops"] if src.exists() else float(args.budget_from)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, path in paths:
            row = config_flops(kind, path, overrides, Path(tmp))
            if budget and row["flops_per_step"]:
                row["steps_for_budget"] = round(budget / row["flops_per_step"])
            rows.append(row)
            print(json.dumps(row))
    if args.out:
        Path(args.out).write_text(json.dumps({"budget_flops": budget, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
