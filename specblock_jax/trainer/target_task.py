"""Training a target model (Qwen3 architecture) from scratch: a `TrainTask` of the one trainer.

    task = TargetTask(target_settings(cfg), run_dir, seed)
    summary = trainer.train(task, cfg, task.batches, task.evaluate)

Data: a corpus's train/validation splits tokenised and packed into windows (`lm_data`); batches
{"tokens", "labels"} [B, seq_len] walk the train windows in a seeded per-epoch order, resumable.
Loss: mean next-token cross-entropy (`lm_loss`). Optimizer (`make_optimizer`, the task's own):
global-norm clipping, then AdamW with weight decay on matrices only (`decay_mask`) and a linear
warmup from 0 then cosine decay to `lr * min_lr_ratio` at `max_steps` (optax's
`warmup_cosine_decay_schedule`). Evaluation (`evaluate`): {"val_loss", "val_ppl"}, the mean loss
over the first `eval_batches` validation batches. Export (`export`, at the end of the run): the
final validation over `final_eval_batches`, the bf16 HF folder with the tokenizer
(`save_target`), the export's own validation, greedy samples of the first `num_samples` prompts
(<run_dir>/samples.jsonl); their figures go into the run's summary.json.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specblock_jax.decoding import generate
from specblock_jax.models import (ModelConfig, RopeConfig, Target, abstract_target, apply, causal_mask,
                                  init_target, load_target, load_tokenizer, save_target)
from specblock_jax.training import lm_data
from specblock_jax.training.task import parse_settings
from specblock_jax.trainer.trainer import TRAINER_DEFAULTS


@dataclasses.dataclass(frozen=True)
class TargetTrainConfig:
    """The target's keys of a training config (configs/target/*.yaml); the trainer reads the rest
    (`trainer.TRAINER_DEFAULTS`). Every key is required: a target config documents them all."""

    name: str  # names the default run_dir, runs/target/<name>
    corpus_dir: str  # <corpus_dir>/{train,validation}.jsonl (train/build_corpus.py)
    tokenizer_dir: str
    token_cache_dir: str  # tokenised splits cached as .npy
    prompts: str  # prompt JSONL ({"id", "prompt"}) of the final greedy samples
    # model (Qwen3, tied embeddings)
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    max_position_embeddings: int
    # data
    seq_len: int  # tokens per window (inputs), B x seq_len tokens per step
    batch_size: int
    eval_batches: int  # validation batches of each periodic evaluation
    final_eval_batches: int  # validation batches of the final evaluation
    # samples at the end
    num_samples: int
    sample_tokens: int


def target_settings(cfg: Mapping[str, Any]) -> TargetTrainConfig:
    """The target's settings of a flat training config: its keys that are not the trainer's
    (an unknown or missing key is a ValueError naming it)."""
    own = {k: v for k, v in cfg.items() if k not in TRAINER_DEFAULTS}
    return parse_settings(TargetTrainConfig, own, "target: ")


def model_config(s: TargetTrainConfig) -> ModelConfig:
    """The Qwen3 `ModelConfig` of the settings (tied embeddings, specials 0/1/2, fp32). The train
    step runs the layers fully unrolled: 4% faster per step than the rolled scan on v2
    (docs/findings.md, scan_layers), and its compile time is paid once; forwards with a KV cache
    (decoding) keep the rolled scan (`cache_scan_unroll` 1)."""
    return ModelConfig(
        family="qwen3", vocab_size=s.vocab_size, hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size, num_layers=s.num_layers, num_heads=s.num_heads,
        num_kv_heads=s.num_kv_heads, head_dim=s.head_dim, rope=RopeConfig(theta=float(s.rope_theta)),
        tie_word_embeddings=True, max_position_embeddings=s.max_position_embeddings, dtype="float32",
        bos_token_id=0, eos_token_ids=(1,), pad_token_id=2, scan_unroll=s.num_layers,
    )


def decay_mask(params: dict) -> dict:
    """True for weight matrices (rank >= 2 per layer: the stacked layers' leading [L] axis does
    not count, so their norm weights [L, H] are not decayed)."""
    def one(path, x):
        stacked = bool(path) and getattr(path[0], "key", None) == "layers"
        return x.ndim - int(stacked) >= 2

    return jax.tree_util.tree_map_with_path(one, params)


def make_optimizer(cfg: Mapping[str, Any]) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(global-norm clipping then AdamW masked by `decay_mask`, the schedule: warmup from 0 over
    warmup_steps, cosine to lr * min_lr_ratio at max_steps)."""
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg["lr"], warmup_steps=cfg["warmup_steps"],
        decay_steps=max(cfg["max_steps"], cfg["warmup_steps"] + 1),
        end_value=cfg["lr"] * cfg["min_lr_ratio"])
    tx = optax.chain(
        optax.clip_by_global_norm(cfg["grad_clip"]),
        optax.adamw(schedule, b1=cfg["b1"], b2=cfg["b2"], weight_decay=cfg["weight_decay"],
                    mask=decay_mask))
    return tx, schedule


def lm_loss(graphdef, params: dict, batch: Mapping[str, jax.Array]) -> jax.Array:
    """Mean next-token CE of batch {"tokens": inputs [B, T], "labels": targets [B, T]}."""
    inputs = batch["tokens"]
    b, t = inputs.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    logits = apply(graphdef, params, inputs, positions, causal_mask(b, t)).logits
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()


@functools.partial(jax.jit, static_argnums=0)
def _eval_loss(graphdef, params, batch):
    return lm_loss(graphdef, params, batch)


def mean_loss(graphdef, params: dict, batches: list[dict[str, np.ndarray]]) -> float:
    """Mean `lm_loss` over batches of one shape (so the mean is per token)."""
    return float(np.mean([float(_eval_loss(graphdef, params, b)) for b in batches]))


class TargetTask:
    """TrainTask of a target trained from scratch (module docstring). Loads and packs the corpus
    splits when built; `batches` is the run's data iterator factory (its order drawn from `seed`,
    the run's), `evaluate` its evaluation; samples go to `run_dir`."""

    Settings = TargetTrainConfig

    def __init__(self, settings: TargetTrainConfig | Mapping[str, Any], run_dir: str | Path, seed: int):
        self.settings = s = parse_settings(TargetTrainConfig, settings, "target: ")
        self.run_dir, self.seed = Path(run_dir), seed
        self.config = model_config(s)
        self.graphdef = abstract_target(self.config)[0]
        split = functools.partial(lm_data.load_split_ids, s.corpus_dir, tokenizer_dir=s.tokenizer_dir,
                                  cache_dir=s.token_cache_dir)
        self.train_windows = lm_data.pack(split("train"), s.seq_len)
        self.val_windows = lm_data.pack(split("validation"), s.seq_len)
        self.val_batches = lm_data.eval_batches(self.val_windows, s.batch_size, s.eval_batches)

    def batches(self, state: dict[str, int] | None) -> lm_data.BatchIterator:
        return lm_data.BatchIterator(self.train_windows, self.settings.batch_size, self.seed, **(state or {}))

    def init_params(self, key: jax.Array) -> dict:
        return init_target(self.config, seed=key).params  # nnx.Rngs(key(seed)) == nnx.Rngs(seed)

    def frozen(self) -> dict:
        return {}

    def optimizer(self, cfg: Mapping[str, Any]) -> tuple[optax.GradientTransformation, optax.Schedule]:
        return make_optimizer(cfg)

    def loss_fn(self, params, frozen, batch, key):
        return lm_loss(self.graphdef, params, batch), {}

    def evaluate(self, params) -> dict[str, float]:
        val = mean_loss(self.graphdef, params, self.val_batches)
        return {"val_loss": val, "val_ppl": math.exp(val)}

    def export(self, params, out_dir: str) -> dict[str, Any]:
        """Final validation, bf16 export with the tokenizer, validation of the export, greedy
        samples; the summary's fields of them."""
        s = self.settings
        final = lm_data.eval_batches(self.val_windows, s.batch_size, s.final_eval_batches)
        val = mean_loss(self.graphdef, params, final)
        target = Target(self.config, self.graphdef, params, load_tokenizer(s.tokenizer_dir))
        export_dir = save_target(target, out_dir, dtype="bfloat16")
        exported = load_target(export_dir, dtype="float32")
        val_export = mean_loss(self.graphdef, exported.params, final)
        print(f"validation loss {val:.4f}, perplexity {math.exp(val):.2f} "
              f"(bf16 export: {val_export:.4f}, {math.exp(val_export):.2f})")
        if s.num_samples > 0:
            self.write_samples(exported)
        return {"name": s.name, "parameters": self.config.num_params(),
                "val_loss": val, "val_ppl": math.exp(val), "val_tokens": len(final) * s.batch_size * s.seq_len,
                "val_loss_bf16_export": val_export, "val_ppl_bf16_export": math.exp(val_export),
                "export_dir": str(export_dir)}

    def write_samples(self, target: Target) -> None:
        """Greedy completions of the first num_samples prompts -> <run_dir>/samples.jsonl."""
        s = self.settings
        prompts = [json.loads(line) for line in Path(s.prompts).read_text().splitlines()
                   if line.strip()][:s.num_samples]
        results = generate(target, [p["prompt"] for p in prompts], max_new_tokens=s.sample_tokens)
        with open(self.run_dir / "samples.jsonl", "w") as f:
            for p, r in zip(prompts, results):
                f.write(json.dumps({"id": p["id"], "prompt": p["prompt"], "completion": r.text}) + "\n")
                print(f"--- {p['id']} ---\n{p['prompt']}{r.text}")
