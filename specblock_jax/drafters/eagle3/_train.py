"""Training the EAGLE-3-style drafter: online target features and the training-time test (TTT).

The frozen target runs inside the jitted step (under stop_gradient) and gives, for every position
t, the features h(t) at `feature_layers` and its next-token distribution p_t. TTT step j = 0..S-1
replays drafting j tokens ahead: at index t the drafter reads
    feature: f_t = fc(h(t)) for j = 0, else its own step-(j-1) output hidden at index t,
    token:   x_{t+j+1}, at RoPE position t + j,
and predicts x_{t+j+2}, scored by soft cross-entropy against p_{t+j+1}, weighted 0.8^j. Attention
of (t, j) sees step-0 entries t' <= t (real features) and its own chain (t, 1..j), exactly what a
depth-j tree node sees when decoding.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from specblock_jax.drafters import draft_vocab
from specblock_jax.drafters.common import FeatureDrafterTask, settings_fields, vocab_arrays
from specblock_jax.drafters.eagle3._model import Eagle3Config, Eagle3Drafter, Eagle3Model, load_eagle3
from specblock_jax.models.attention import attend
from specblock_jax.models.layers import rope_cos_sin
from specblock_jax.models.target import Target
from specblock_jax.training.losses import chain_tau, label_logits, shift
from specblock_jax.training.task import frozen_target_outputs, parse_settings


def ttt_loss(model, embed, target_hidden, target_logits, tokens, loss_mask, valid, steps: int = 7,
             decay: float = 0.8, vocab: tuple[jax.Array, jax.Array] | None = None):
    """target_hidden [B, T, n, H], target_logits [B, T, V], tokens/loss_mask/valid [B, T];
    vocab: (d2t [K], t2d [V]) of a reduced draft vocabulary, or None. With one, the target
    distribution is its softmax over the draft ids and positions whose target argmax is outside
    the draft vocabulary are not scored (EAGLE-3's rule; drafters/draft_vocab.py).

    Returns (loss, {"acc_j": top-1 agreement with the target at step j, "loss_j"}).
    """
    b, t = tokens.shape
    c = model.c
    if vocab is not None:
        target_logits, inside = draft_vocab.restrict(target_logits, *vocab)
        loss_mask = loss_mask * inside.astype(loss_mask.dtype)
    p_target = jax.nn.softmax(target_logits.astype(jnp.float32), axis=-1)
    want = jnp.argmax(target_logits, axis=-1)
    idx = jnp.arange(t)
    keys, values = [], []
    feat = model.fuse(target_hidden)
    total, metrics = 0.0, {}
    for j in range(steps):
        tok = shift(tokens, j + 1)
        pos = jnp.broadcast_to(idx + j, (b, t))
        cos, sin = rope_cos_sin(pos, c.rope, c.head_dim, feat.dtype)
        q, k, v = model.layer.project(jnp.take(embed, tok, axis=0), feat, cos, sin)
        keys.append(k)
        values.append(v)
        blocks = [idx[:, None] >= idx[None, :]] + [jnp.eye(t, dtype=bool)] * j  # [T, T] each
        mask = jnp.broadcast_to(jnp.concatenate(blocks, axis=1), (b, t, t * (j + 1)))
        out = attend(q, jnp.concatenate(keys, axis=1), jnp.concatenate(values, axis=1), mask)
        feat = model.layer.finish(feat, out)
        logq = jax.nn.log_softmax(model.logits(feat), axis=-1)
        m = (shift(loss_mask, j + 1) * shift(valid, j + 1)).astype(jnp.float32)
        ce = -jnp.sum(shift(p_target, j + 1) * logq, axis=-1)
        denom = jnp.maximum(m.sum(), 1.0)
        step_loss = jnp.sum(ce * m) / denom
        total = total + decay**j * step_loss
        metrics[f"acc_{j}"] = jnp.sum((jnp.argmax(logq, -1) == shift(want, j + 1)) * m) / denom
        metrics[f"loss_{j}"] = step_loss
    return total, metrics


@dataclasses.dataclass(frozen=True)
class Eagle3TrainConfig:
    """The EAGLE-3 keys of a training config (configs/drafters/eagle3.yaml)."""

    feature_layers: tuple[int, ...] | None = None  # HF hidden_states indices; None = the default rule
    draft_vocab_size: int = 0  # reduced draft vocabulary (d2t/t2d); 0 = the target's whole vocabulary
    draft_vocab: str = ""  # its map (a draft_vocab.safetensors); "" = counted from the training data
    ttt_steps: int = 4  # training-time-test steps (EAGLE-3 uses 7; 4 is what a 2-core CPU affords)
    ttt_decay: float = 0.8  # weight of step j: decay^j
    num_nodes: int = 16  # decoding: tree node budget incl. the root
    top_k: int = 4  # decoding: candidates per expansion
    depth: int = 5  # decoding: expansion depth


class Eagle3Task(FeatureDrafterTask):
    """TrainTask for the EAGLE-3-style drafter (see specblock_jax/training/task.py)."""

    Settings = Eagle3TrainConfig

    def __init__(self, settings: Eagle3TrainConfig | dict[str, Any], target: Target):
        s = parse_settings(Eagle3TrainConfig, settings, "eagle3: ")
        config = Eagle3Config.for_target(target.config, s.feature_layers, draft_vocab_size=s.draft_vocab_size)
        self.setup(s, target, config, Eagle3Model)

    def loss_fn(self, params, frozen, batch, key):
        hidden, logits = frozen_target_outputs(self.target, frozen, batch, self.config.feature_layers)
        model = nnx.merge(self.graphdef, params)
        embed = jax.lax.stop_gradient(frozen["embed_tokens"])
        return ttt_loss(model, embed, hidden, logits, batch["tokens"], batch["loss_mask"],
                        batch["attention_mask"], self.settings.ttt_steps, self.settings.ttt_decay,
                        self.vocab_arrays())

    def drafter(self) -> Eagle3Drafter:
        return Eagle3Drafter(self.config, self.graphdef,
                             **settings_fields(self.settings, ("num_nodes", "top_k", "depth")))


def eagle3_objective(drafter, params, hidden, tokens, loss_mask, valid, key, depth: int = 0):
    """Serving-time adaptation objective (see adaptation/objective.py): the TTT loss over `depth`
    steps (0 = 4) with the committed tokens as labels; tau proxy from the per-step top-1
    accuracies."""
    steps = depth or 4
    model = nnx.merge(drafter.graphdef, params["draft"])
    logits = label_logits(tokens, drafter.config.vocab_size)
    loss, metrics = ttt_loss(model, params["embed"], hidden, logits, tokens, loss_mask, valid, steps,
                             vocab=vocab_arrays(params))
    return loss, chain_tau(jnp.stack([metrics[f"acc_{j}"] for j in range(steps)]))


