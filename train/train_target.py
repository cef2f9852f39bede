"""Train the reference target model (Qwen3 architecture) on the packed corpus, then export it.

    python -m train.train_target --config configs/target/reference.yaml [key=value ...]

Overrides are typed by the YAML default's type. One `jax.jit` train step, a pure function
(params, opt_state, batch [B, seq_len + 1]) -> (params, opt_state, metrics) with params and optimizer
state donated; loss = mean next-token cross-entropy over the packed windows. AdamW with linear
warmup and cosine decay over `max_steps`, global-norm clipping, fp32. Training stops at `max_steps`
or when the total training wall time reaches `time_budget_min`, whichever comes first.

The run directory (default `runs/target/<name>/`) holds `metrics.jsonl`, orbax checkpoints (params,
optimizer state, step, data iterator position and its seed; keep 2) and, at the end,
`summary.json` and `samples.jsonl`. Rerunning the same command resumes from the latest checkpoint
and reproduces the uninterrupted run exactly. The exported model (bf16 safetensors + tokenizer)
goes to `out_dir`.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import yaml
from tqdm import tqdm

import specblock_jax as sbj
from specblock_jax.models import (ModelConfig, RopeConfig, Target, apply, causal_mask, init_target,
                                  load_target, load_tokenizer, save_target)
from specblock_jax.training.trainer import append_jsonl, checkpoint_manager, save_checkpoint
from train import lm_data


# ------------------------------------------------------------------------------------- config

def parse_override(key: str, text: str, default: Any) -> Any:
    """`text` converted to the type of the YAML default (bool, int, float, str; else YAML)."""
    if isinstance(default, bool):
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"override {key}={text!r}: expected a boolean")
        return text.lower() in ("true", "1", "yes")
    try:
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        raise ValueError(f"override {key}={text!r}: expected {type(default).__name__}") from None
    if isinstance(default, str):
        return text
    return yaml.safe_load(text)


def load_config(path: str | Path, overrides: list[str] = ()) -> dict[str, Any]:
    """The YAML config dict with `key=value` overrides applied (unknown keys are refused)."""
    cfg = yaml.safe_load(Path(path).read_text())
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a mapping of settings")
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"override {item!r} is not key=value")
        if key not in cfg:
            raise ValueError(f"override {item!r}: unknown key {key!r} (known: {sorted(cfg)})")
        cfg[key] = parse_override(key, text, cfg[key])
    return cfg


def model_config(cfg: dict[str, Any]) -> ModelConfig:
    """The Qwen3 `ModelConfig` of a training config (tied embeddings, specials 0/1/2, fp32). The
    train step runs the layers fully unrolled: 4% faster per step than the rolled scan on v2
    (scripts/train_step_time.py, docs/compile_time.md), and its compile time is paid once."""
    return ModelConfig(
        family="qwen3", vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_layers"],
        num_heads=cfg["num_heads"], num_kv_heads=cfg["num_kv_heads"], head_dim=cfg["head_dim"],
        rope=RopeConfig(theta=float(cfg["rope_theta"])), tie_word_embeddings=True,
        max_position_embeddings=cfg["max_position_embeddings"], dtype="float32",
        bos_token_id=0, eos_token_ids=(1,), pad_token_id=2, scan_unroll=cfg["num_layers"],
    )


def run_dir(cfg: dict[str, Any]) -> Path:
    return Path(cfg["run_dir"] or f"runs/target/{cfg['name']}")


# -------------------------------------------------------------------------- step functions

def make_optimizer(cfg: dict[str, Any]) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW (decay on matrices only) after global-norm clipping; warmup + cosine over max_steps."""
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg["lr"], warmup_steps=cfg["warmup_steps"],
        decay_steps=max(cfg["max_steps"], cfg["warmup_steps"] + 1),
        end_value=cfg["lr"] * cfg["min_lr_ratio"])
    tx = optax.chain(
        optax.clip_by_global_norm(cfg["grad_clip"]),
        optax.adamw(schedule, b1=cfg["b1"], b2=cfg["b2"], weight_decay=cfg["weight_decay"],
                    mask=decay_mask))
    return tx, schedule


def decay_mask(params: dict) -> dict:
    """True for weight matrices (rank >= 2 per layer: the stacked layers' leading [L] axis does
    not count, so their norm weights [L, H] are not decayed)."""
    def one(path, x):
        stacked = bool(path) and getattr(path[0], "key", None) == "layers"
        return x.ndim - int(stacked) >= 2

    return jax.tree_util.tree_map_with_path(one, params)


def stack_legacy_layers(tree: Any) -> Any:
    """A checkpoint tree of the per-layer layout ({"layers": {0: {...}, 1: {...}}}, before the
    layers were stacked for `lax.scan`) -> the stacked layout; other subtrees unchanged."""
    if isinstance(tree, dict):
        out = {k: stack_legacy_layers(v) for k, v in tree.items()}
        layers = out.get("layers")
        if isinstance(layers, dict) and layers and all(str(k).isdigit() for k in layers):
            slices = [layers[k] for k in sorted(layers, key=int)]
            out["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *slices)
        return out
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(stack_legacy_layers(x) for x in tree))
    if isinstance(tree, (tuple, list)):
        return type(tree)(stack_legacy_layers(x) for x in tree)
    return tree


def restore_state(mngr: ocp.CheckpointManager, step: int, params: dict, opt_state: Any, tx) -> tuple:
    """(params, opt_state, meta) of checkpoint `step`; a checkpoint of the per-layer layout is
    read as such and stacked (exact: stacking copies values)."""
    def restore(p, o):
        return mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore({"params": p, "opt_state": o}), meta=ocp.args.JsonRestore()))

    try:
        restored = restore(params, opt_state)
    except ValueError:
        n = jax.tree.leaves(params["layers"])[0].shape[0]
        legacy = {**params, "layers": {i: jax.tree.map(lambda x: x[i], params["layers"]) for i in range(n)}}
        restored = restore(legacy, tx.init(legacy))
        print(f"checkpoint {step}: per-layer layout, stacked for the scanned model")
        state = stack_legacy_layers(restored.state)
        return state["params"], state["opt_state"], restored.meta
    return restored.state["params"], restored.state["opt_state"], restored.meta


def lm_loss(graphdef, params: dict, batch: jax.Array) -> jax.Array:
    """Mean next-token CE of windows batch [B, T + 1]: inputs batch[:, :-1], targets batch[:, 1:]."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    b, t = inputs.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    logits = apply(graphdef, params, inputs, positions, causal_mask(b, t)).logits
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def make_steps(graphdef, tx: optax.GradientTransformation):
    """(train_step, eval_step), both jitted pure functions; train_step donates params/opt_state."""

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(functools.partial(lm_loss, graphdef))(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    eval_step = jax.jit(functools.partial(lm_loss, graphdef))
    return train_step, eval_step


def evaluate(eval_step, params: dict, batches: list[np.ndarray]) -> float:
    """Mean loss over the fixed evaluation batches (all the same shape, so the mean is per token)."""
    return float(np.mean([float(eval_step(params, b)) for b in batches]))


# ------------------------------------------------------------------------------- run state

def _truncate_log(path: Path, step: int) -> None:
    """Drops records written after `step` by an interrupted run (they will be redone)."""
    if path.exists():
        keep = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in keep))


# ---------------------------------------------------------------------------------- training

def train(cfg: dict[str, Any], stop_after: int | None = None) -> dict[str, Any]:
    """Trains (resuming from the run's latest checkpoint), exports, and returns the summary.

    stop_after: stop once this many steps are done (checkpointing first) without exporting, as an
    interruption would; the LR schedule still spans max_steps. Returns {"step"} in that case.
    """
    out = run_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "metrics.jsonl"
    train_ids = lm_data.load_split_ids(cfg["corpus_dir"], "train", cfg["tokenizer_dir"],
                                       cfg["token_cache_dir"])
    val_ids = lm_data.load_split_ids(cfg["corpus_dir"], "validation", cfg["tokenizer_dir"],
                                     cfg["token_cache_dir"])
    windows = lm_data.pack(train_ids, cfg["seq_len"])
    val_windows = lm_data.pack(val_ids, cfg["seq_len"])
    val_batches = lm_data.eval_batches(val_windows, cfg["batch_size"], cfg["eval_batches"])

    mcfg = model_config(cfg)
    target = init_target(mcfg, seed=cfg["seed"])
    graphdef, params = target.graphdef, target.params
    tx, schedule = make_optimizer(cfg)
    opt_state = tx.init(params)
    train_step, eval_step = make_steps(graphdef, tx)

    mngr = checkpoint_manager(out / "checkpoints", keep=2)
    step, data_state, elapsed = 0, {"epoch": 0, "index": 0}, 0.0
    if mngr.latest_step() is not None:
        params, opt_state, meta = restore_state(mngr, mngr.latest_step(), params, opt_state, tx)
        if meta["seed"] != cfg["seed"]:
            raise ValueError(f"{out}: checkpoint was made with seed={meta['seed']}, config has "
                             f"seed={cfg['seed']}; use another run_dir")
        step, data_state, elapsed = meta["step"], meta["data"], meta["elapsed_s"]
        _truncate_log(log_path, step)
        print(f"resumed from step {step} (epoch {data_state['epoch']}, batch {data_state['index']})")
    else:
        log_path.unlink(missing_ok=True)
    batches = lm_data.BatchIterator(windows, cfg["batch_size"], cfg["seed"], **data_state)
    tokens_per_step = cfg["batch_size"] * cfg["seq_len"]
    print(f"model: {mcfg.num_params():,} parameters; {len(windows):,} train windows of "
          f"{cfg['seq_len']}, {batches.batches_per_epoch} steps per epoch")

    def meta_now() -> dict:
        return {"step": step, "data": batches.state(), "seed": cfg["seed"], "elapsed_s": elapsed}

    budget_s = cfg["time_budget_min"] * 60.0
    last_step, last_time = step, time.perf_counter()
    start = last_time - elapsed
    bar = tqdm(total=cfg["max_steps"], initial=step, desc="train", unit="step")
    while step < cfg["max_steps"] and elapsed < budget_s and (stop_after is None or step < stop_after):
        params, opt_state, metrics = train_step(params, opt_state, next(batches))
        step += 1
        bar.update(1)
        if step % cfg["log_every"] == 0 or step == cfg["max_steps"]:
            loss, grad_norm = float(metrics["loss"]), float(metrics["grad_norm"])
            now = time.perf_counter()
            elapsed = now - start
            record = {"step": step, "loss": loss, "lr": float(schedule(step - 1)),
                      "grad_norm": grad_norm, "tokens_seen": step * tokens_per_step,
                      "tokens_per_s": (step - last_step) * tokens_per_step / (now - last_time),
                      "elapsed_s": elapsed}
            append_jsonl(log_path, record)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
            last_step, last_time = step, now
        if step % cfg["eval_every"] == 0:
            val = evaluate(eval_step, params, val_batches)
            append_jsonl(log_path, {"step": step, "val_loss": val, "val_ppl": math.exp(val)})
            bar.write(f"step {step}: val loss {val:.4f} (ppl {math.exp(val):.2f})")
            last_time = time.perf_counter()  # keep evaluation out of tokens/s
        elapsed = time.perf_counter() - start
        if step % cfg["ckpt_every"] == 0:
            save_checkpoint(mngr, step, params, opt_state, meta_now())
    bar.close()
    if mngr.latest_step() != step:
        save_checkpoint(mngr, step, params, opt_state, meta_now())
    mngr.wait_until_finished()
    if stop_after is not None and step < cfg["max_steps"] and elapsed < budget_s:
        return {"step": step}
    return finish(cfg, Target(mcfg, graphdef, params), eval_step, val_windows, step, elapsed)


def finish(cfg: dict[str, Any], target: Target, eval_step, val_windows: np.ndarray, step: int,
           elapsed: float) -> dict[str, Any]:
    """Final validation, bf16 export with the tokenizer, validation of the export, greedy samples."""
    out = run_dir(cfg)
    final_batches = lm_data.eval_batches(val_windows, cfg["batch_size"], cfg["final_eval_batches"])
    val = evaluate(eval_step, target.params, final_batches)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_losses = [r["loss"] for r in records if "loss" in r][-10:]
    export_dir = save_target(target.replace(tokenizer=load_tokenizer(cfg["tokenizer_dir"])),
                             cfg["out_dir"], dtype="bfloat16")
    exported = load_target(export_dir, dtype="float32")
    val_export = evaluate(eval_step, exported.params, final_batches)
    summary = {
        "name": cfg["name"], "parameters": target.config.num_params(), "steps": step,
        "tokens_seen": step * cfg["batch_size"] * cfg["seq_len"], "train_time_s": elapsed,
        "train_loss_last10_logs": float(np.mean(train_losses)) if train_losses else None,
        "val_loss": val, "val_ppl": math.exp(val),
        "val_tokens": len(final_batches) * cfg["batch_size"] * cfg["seq_len"],
        "val_loss_bf16_export": val_export, "val_ppl_bf16_export": math.exp(val_export),
        "export_dir": str(export_dir), "config": cfg,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"validation loss {val:.4f}, perplexity {math.exp(val):.2f} "
          f"(bf16 export: {val_export:.4f}, {math.exp(val_export):.2f})")
    if cfg["num_samples"] > 0:
        prompts = [json.loads(line) for line in Path(cfg["prompts"]).read_text().splitlines()
                   if line.strip()][:cfg["num_samples"]]
        results = sbj.generate(exported, [p["prompt"] for p in prompts],
                               max_new_tokens=cfg["sample_tokens"])
        with open(out / "samples.jsonl", "w") as f:
            for p, r in zip(prompts, results):
                f.write(json.dumps({"id": p["id"], "prompt": p["prompt"], "completion": r.text}) + "\n")
                print(f"--- {p['id']} ---\n{p['prompt']}{r.text}")
    return summary


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
