"""Training BlockPilot's policy: the MLP that picks a request's block size from its prefill features.

    data = PolicyData(prefill_features(target, prompts, "topk", 32), labels, tau)
    task = BlockPilotTask(settings, target, data, heldout)
    summary = trainer.train(task, cfg, task.batches, task.evaluate)

A `TrainTask` of the one trainer (trainer/trainer.py), full-batch: every step sees all the
training prompts. Inputs: features x [n, F] of the target's next-token distribution after each
prompt (`blockpilot.features`), standardised by the training set's mean and std (frozen, stored
with the policy); labels y [n], the index in `sizes` of each prompt's oracle block size; tau
[n, C], each prompt's measured acceptance length at each size. Loss `ce`: cross-entropy on y (as
BlockPilot); `regret`: the expected tau lost to the oracle, sum_s policy(s) * (max tau - tau_s),
which weighs each mistake by what it costs (ties cost nothing). Dropout on the hidden layers.
Optimizer (the task's own): AdamW at a constant LR, on every parameter, no clipping. Evaluation:
accuracy against the oracle labels and the mean tau of the chosen sizes, on the held-out prompts.
Export: the BlockPilot drafter folder (`save_blockpilot`), driving the DFlash folder
`dflash_dir` and recording the DFlash drafter its labels came from (`labels_dflash`), and the full `policy_metrics` of train and held-out prompts for the summary.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from specblock_jax.prompts import encode_prompts
from specblock_jax.models.kv_cache import length_bucket
from specblock_jax.drafters.blockpilot._model import (PolicyConfig, features, init_policy, load_blockpilot,
                                               save_blockpilot)
from specblock_jax.models.target import Target, forward
from specblock_jax.training.task import parse_settings

LOSSES = ("ce", "regret")


@dataclasses.dataclass(frozen=True)
class BlockPilotTrainConfig:
    """The policy's settings (`specblock-train blockpilot train` flags)."""

    sizes: tuple[int, ...]  # candidate block sizes, class i -> sizes[i]
    features: str = "topk"  # "topk" | "full" (blockpilot.features)
    top_k: int = 32
    width: int = 256  # MLP width
    loss: str = "ce"  # "ce" | "regret" (module docstring)
    dropout: float = 0.2
    dflash_dir: str = "../dflash"  # the DFlash folder the exported drafter drives (relative to it)
    labels_dflash: str = ""  # the DFlash folder the labels were measured with ("": unrecorded)


@dataclasses.dataclass(frozen=True)
class PolicyData:
    """Prompts of one label set: features [n, F] float32, oracle labels [n] int32 (index into
    the sizes), tau [n, C] float64 measured at each size."""

    features: np.ndarray
    labels: np.ndarray
    tau: np.ndarray

    def __post_init__(self):
        n = len(self.features)
        if self.features.ndim != 2 or self.labels.shape != (n,) or self.tau.ndim != 2 or len(self.tau) != n:
            raise ValueError(f"PolicyData: features {self.features.shape}, labels {self.labels.shape}, "
                             f"tau {self.tau.shape} do not describe the same prompts")


def prefill_features(target: Target, prompts: list, kind: str, top_k: int) -> np.ndarray:
    """[len(prompts), F] features of the target's next-token distribution after each prompt (text
    or token ids), 32 prompts a forward."""
    toks = encode_prompts(target, prompts)
    out = []
    for start in range(0, len(toks), 32):
        part = toks[start:start + 32]
        width = length_bucket(max(len(t) for t in part))
        arr = np.zeros((len(part), width), np.int32)
        mask = np.zeros_like(arr)
        for r, t in enumerate(part):
            arr[r, :len(t)], mask[r, :len(t)] = t, 1
        logits = forward(target, arr, mask)
        last = jnp.asarray([len(t) - 1 for t in part])
        out.append(np.asarray(features(logits[jnp.arange(len(part)), last], kind, top_k)))
    return np.concatenate(out)


def policy_metrics(graphdef, params: dict, data: PolicyData) -> dict[str, Any]:
    """How the policy (params with mean/std) does on `data`: accuracy against the oracle labels,
    the mean tau of its chosen sizes, of the oracle's and of each fixed size, the majority class's
    accuracy, and how often it picks each size."""
    pred = np.asarray(jnp.argmax(nnx.merge(graphdef, params)(jnp.asarray(data.features)), -1))
    labels, tau = np.asarray(data.labels), data.tau
    return {"accuracy": float(np.mean(pred == labels)),
            "mean_tau_chosen": float(tau[np.arange(len(pred)), pred].mean()),
            "mean_tau_oracle": float(tau.max(1).mean()),
            "mean_tau_fixed": [float(v) for v in tau.mean(0)],
            "majority_accuracy": float(np.mean(labels == np.bincount(labels).argmax())),
            "predicted_counts": np.bincount(pred, minlength=tau.shape[1]).tolist()}


class FullBatch:
    """The trainer's data iterator of a full-batch run: the same batch every step, forever."""

    def __init__(self, batch: dict[str, np.ndarray], state: dict[str, int] | None = None):
        self.batch, self.steps = batch, (state or {}).get("steps", 0)

    def __next__(self) -> dict[str, np.ndarray]:
        self.steps += 1
        return self.batch

    def get_state(self) -> dict[str, int]:
        return {"steps": self.steps}


class BlockPilotTask:
    """TrainTask of BlockPilot's policy (module docstring). `batches` is the run's data iterator
    factory, `evaluate` its evaluation (on `heldout`, else on the training prompts)."""

    Settings = BlockPilotTrainConfig

    def __init__(self, settings: BlockPilotTrainConfig | Mapping[str, Any], target: Target,
                 data: PolicyData, heldout: PolicyData | None = None):
        s = self.settings = parse_settings(BlockPilotTrainConfig, settings, "blockpilot: ")
        if s.loss not in LOSSES:
            raise ValueError(f"blockpilot: loss must be one of {LOSSES}, got {s.loss!r}")
        self.config = PolicyConfig(s.sizes, s.features, s.top_k, target.config.vocab_size, s.width)
        for name, d in (("train", data), ("heldout", heldout)):
            if d is not None and (d.features.shape[1] != self.config.in_dim or d.tau.shape[1] != len(s.sizes)):
                raise ValueError(f"blockpilot: {name} data has {d.features.shape[1]} features and "
                                 f"{d.tau.shape[1]} sizes; the policy takes {self.config.in_dim} and "
                                 f"{len(s.sizes)}")
        self.data, self.heldout = data, heldout
        self.graphdef = init_policy(self.config)[0]
        self.stats = {"mean": jnp.asarray(data.features.mean(0)),
                      "std": jnp.asarray(data.features.std(0) + 1e-6)}

    def batches(self, state: dict[str, int] | None) -> FullBatch:
        gap = self.data.tau.max(1, keepdims=True) - self.data.tau
        return FullBatch({"features": np.asarray(self.data.features, np.float32),
                          "labels": np.asarray(self.data.labels, np.int32),
                          "gap": np.asarray(gap, np.float32)}, state)

    def init_params(self, key: jax.Array) -> dict:
        params = init_policy(self.config, key)[1]  # nnx.Rngs(key(seed)) == nnx.Rngs(seed)
        return {k: v for k, v in params.items() if k not in self.stats}

    def frozen(self) -> dict:
        return self.stats

    def optimizer(self, cfg: Mapping[str, Any]) -> tuple[optax.GradientTransformation, optax.Schedule]:
        return (optax.adamw(cfg["lr"], b1=cfg["b1"], b2=cfg["b2"], weight_decay=cfg["weight_decay"]),
                optax.constant_schedule(cfg["lr"]))

    def loss_fn(self, params, frozen, batch, key):
        logits = nnx.merge(self.graphdef, {**params, **frozen})(batch["features"], self.settings.dropout, key)
        if self.settings.loss == "regret":
            return jnp.sum(jax.nn.softmax(logits, -1) * batch["gap"], -1).mean(), {}
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean(), {}

    def evaluate(self, params) -> dict[str, float]:
        data = self.heldout if self.heldout is not None else self.data
        m = policy_metrics(self.graphdef, {**params, **self.stats}, data)
        return {"eval_accuracy": m["accuracy"], "eval_mean_tau_chosen": m["mean_tau_chosen"]}

    def export(self, params, out_dir: str) -> dict[str, Any]:
        full = {**params, **self.stats}
        save_blockpilot(out_dir, self.config, full, self.settings.dflash_dir,
                        labels_dflash=self.settings.labels_dflash or None)
        report = {"policy": dataclasses.asdict(self.config),
                  "train": policy_metrics(self.graphdef, full, self.data)}
        if self.heldout is not None:
            report["heldout"] = policy_metrics(self.graphdef, full, self.heldout)
        return report


