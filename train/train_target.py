"""Train the reference target model (Qwen3 architecture) on the packed corpus, then export it.

    specblock-train target --config configs/target/reference.yaml [key=value ...]
    python -m train.train_target --config configs/target/reference.yaml [key=value ...]

Overrides are typed by the YAML default's type; the YAML sets every key. The run is
`specblock_jax.trainer.target_task.TargetTask` through the one trainer
(`specblock_jax.trainer.trainer.train`): AdamW with warmup and cosine decay over `max_steps`,
stopping at `max_steps` or when the run's wall time reaches `time_budget_min`.

The run directory (default `runs/target/<name>/`) holds `metrics.jsonl`, orbax checkpoints (params,
optimizer state, step, data iterator position and its seed; keep 2) and, at the end,
`summary.json` and `samples.jsonl`. Rerunning the same command resumes from the latest checkpoint
and reproduces the uninterrupted run exactly. The exported model (bf16 safetensors + tokenizer)
goes to `out_dir`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

import yaml

from specblock_jax import overrides as kv
from specblock_jax.trainer.target_task import TargetTask, target_settings
from specblock_jax.trainer.trainer import train as run_trainer


def load_config(path: str | Path, overrides: list[str] = ()) -> dict[str, Any]:
    """The YAML config dict with `key=value` overrides applied (unknown keys are refused)."""
    cfg = yaml.safe_load(Path(path).read_text())
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a mapping of settings")
    return apply_overrides(cfg, overrides)


def apply_overrides(cfg: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """`cfg` with each `key=value` of `overrides` applied, typed like the value it replaces (an
    unknown key or a malformed item is refused)."""
    cfg.update(kv.parse(overrides, "override", defaults=cfg))
    return cfg


def train(cfg: dict[str, Any]) -> dict[str, Any]:
    """Trains (resuming from the run's latest checkpoint), exports, and returns the summary."""
    cfg = {**cfg, "run_dir": cfg["run_dir"] or f"runs/target/{cfg['name']}"}
    task = TargetTask(target_settings(cfg), cfg["run_dir"], cfg["seed"])
    print(f"model: {task.config.num_params():,} parameters; {len(task.train_windows):,} train windows "
          f"of {task.settings.seq_len}, {len(task.train_windows) // task.settings.batch_size} steps per epoch")
    return run_trainer(task, cfg, task.batches, task.evaluate)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML config (configs/target/*.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value settings overriding the config")
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    print(json.dumps(cfg))
    train(cfg)


if __name__ == "__main__":
    main()
