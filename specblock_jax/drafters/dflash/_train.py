"""Training the DFlash-style drafter: online target features, random anchors, decayed block loss.

Per step (inside the jitted train step) the frozen target runs over the batch and gives the
features h(t) at `feature_layers` for every position. Per sequence, `num_anchors` anchors p are
drawn (without replacement, fresh every step) among positions whose next token is a response
token. Each anchor makes a block [x_p, MASK x (B - 1)] at positions p..p+B-1; all blocks of a
row go through the drafter at once, each block query seeing the context features of positions
strictly before p and its own block only (mask below). The label of block offset k >= 1 is
x_{p+k} (scored only where it is a real response token), with weight exp(-(k - 1) / gamma)
normalised by the summed weights (DFlash / SpecForge, gamma = 7).

Mask of the queries of one row, T = 4 context positions, two anchors p = 1 (block a) and p = 2
(block b), B = 2 ("a0" = offset 0 of block a):
            ctx 0 1 2 3 | a0 a1 b0 b1
    a0          1 0 0 0 |  1  1  0  0
    a1          1 0 0 0 |  1  1  0  0
    b0          1 1 0 0 |  0  0  1  1
    b1          1 1 0 0 |  0  0  1  1
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from specblock_jax.drafters.common import FeatureDrafterTask, target_head
from specblock_jax.drafters.dflash._model import DFlashConfig, DFlashDrafter, DFlashModel, head_logits, load_dflash
from specblock_jax.models.target import Target
from specblock_jax.models.transformer import positions_from_valid
from specblock_jax.training.task import frozen_target_outputs, parse_settings


def sample_anchors(key, loss_mask, num_anchors: int):
    """[B, T] loss mask -> (anchors [B, A] int32, ok [B, A] bool): distinct random positions p with
    loss_mask[p] = 1 (x_{p+1} is a response token); rows with fewer candidates get ok = False."""
    score = jnp.where(loss_mask.astype(bool), jax.random.uniform(key, loss_mask.shape), -1.0)
    top, anchors = jax.lax.top_k(score, num_anchors)
    return anchors.astype(jnp.int32), top >= 0


def training_mask(anchors, anchor_ok, valid, block: int):
    """anchors/anchor_ok [B, A], valid [B, T] -> [B, A*B, T + A*B] bool (the module docstring)."""
    b, a = anchors.shape
    t = valid.shape[1]
    ctx = (jnp.arange(t)[None, None, :] < anchors[:, :, None]) & valid.astype(bool)[:, None, :]
    ctx = ctx & anchor_ok[:, :, None]  # [B, A, T]
    ctx = jnp.repeat(ctx, block, axis=1)  # [B, A*B, T]
    owner = jnp.repeat(jnp.arange(a), block)  # block index of each block slot
    blk = jnp.broadcast_to(owner[:, None] == owner[None, :], (b, a * block, a * block))
    return jnp.concatenate([ctx, blk], axis=2)


def dflash_loss(model, embed, head, target_hidden, tokens, loss_mask, valid, key, num_anchors: int,
                block: int, mask_id: int, gamma: float = 7.0):
    """target_hidden [B, T, n, H]; tokens/loss_mask/valid [B, T]. Returns (loss, metrics):
    acc_1 (offset-1 top-1 accuracy), acc (all offsets), tau_est (1 + mean length of the correct
    prefix of each block: the greedy acceptance length if the target agrees with the labels)."""
    b, t = tokens.shape
    pos = positions_from_valid(valid)
    ctx_kv = model.context_cache(model.context(target_hidden), pos)
    anchors, ok = sample_anchors(key, loss_mask, num_anchors)
    k = jnp.arange(block)
    idx = anchors[:, :, None] + k  # [B, A, Bk] token index of each block slot
    inside = idx < t
    idx_c = jnp.minimum(idx, t - 1).reshape(b, -1)
    labels = jnp.take_along_axis(tokens, idx_c, axis=1).reshape(idx.shape)
    real = jnp.take_along_axis(loss_mask, jnp.maximum(idx_c - 1, 0), axis=1).reshape(idx.shape)
    lab_ok = inside & (real > 0) & (k > 0) & ok[:, :, None]
    blk_tokens = jnp.where(k == 0, labels, mask_id).reshape(b, -1)
    blk_pos = (jnp.take_along_axis(pos, anchors, axis=1)[:, :, None] + k).reshape(b, -1)
    emb = jnp.take(embed, blk_tokens, axis=0).astype(target_hidden.dtype)
    hidden = model.block(emb, blk_pos, ctx_kv, training_mask(anchors, ok, valid, block))
    logp = jax.nn.log_softmax(head_logits(hidden, head), axis=-1).reshape(idx.shape + (-1,))
    ce = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    w = jnp.where(k > 0, jnp.exp(-(k - 1) / gamma), 0.0) * lab_ok
    loss = jnp.sum(ce * w) / jnp.maximum(w.sum(), 1e-6)
    correct = (jnp.argmax(logp, -1) == labels) & lab_ok
    m = lab_ok.astype(jnp.float32)
    prefix = jnp.cumprod(jnp.where(k > 0, correct, True), axis=-1)[..., 1:].sum(-1)  # [B, A]
    metrics = {"acc_1": jnp.sum(correct[..., 1] * m[..., 1]) / jnp.maximum(m[..., 1].sum(), 1.0),
               "acc": jnp.sum(correct * m) / jnp.maximum(m.sum(), 1.0),
               "tau_est": 1.0 + jnp.sum(prefix * ok) / jnp.maximum(ok.sum(), 1)}
    return loss, metrics


@dataclasses.dataclass(frozen=True)
class DFlashTrainConfig:
    """The DFlash keys of a training config (configs/drafters/dflash.yaml)."""

    num_layers: int = 3  # drafter decoder layers
    feature_layers: tuple[int, ...] | None = None  # None = up to 5 layer outputs from 1 to the last
    block_size: int = 16  # training block size B
    num_anchors: int = 16  # anchors per sequence per step
    loss_gamma: float = 7.0  # loss weight exp(-(k - 1) / gamma) of block offset k
    mask_token_id: int = 3  # the tokenizer's MASK id
    decode_block_size: int = 0  # decoding: block size drafted with (0 = block_size)
    draft_mode: str = "auto"  # decoding: auto | greedy | sample


class DFlashTask(FeatureDrafterTask):
    """TrainTask for the DFlash-style drafter (see specblock_jax/training/task.py). The target's
    embedding and LM head are reused, frozen; the drafter has no head of its own."""

    Settings = DFlashTrainConfig
    init_head_from_target = False

    def __init__(self, settings: DFlashTrainConfig | dict[str, Any], target: Target):
        s = parse_settings(DFlashTrainConfig, settings, "dflash: ")
        config = DFlashConfig.for_target(target.config, s.num_layers, s.feature_layers, s.block_size,
                                         s.mask_token_id)
        self.setup(s, target, config, DFlashModel)
        self.head = target_head(target)

    def frozen(self):
        return {"target": self.target.params, "head": self.head}

    def extra_decoding_params(self) -> dict:
        return {"head": self.head}

    def loss_fn(self, params, frozen, batch, key):
        hidden, _ = frozen_target_outputs(self.target, frozen["target"], batch, self.config.feature_layers,
                                          logits=False)
        model = nnx.merge(self.graphdef, params)
        embed = jax.lax.stop_gradient(frozen["target"]["embed_tokens"])
        head = jax.lax.stop_gradient(frozen["head"])
        return dflash_loss(model, embed, head, hidden, batch["tokens"], batch["loss_mask"],
                           batch["attention_mask"], key, self.settings.num_anchors, self.config.block_size,
                           self.config.mask_token_id, self.settings.loss_gamma)

    def drafter(self) -> DFlashDrafter:
        s = self.settings
        return DFlashDrafter(self.config, self.graphdef, s.decode_block_size or self.config.block_size,
                             s.draft_mode)


def dflash_objective(drafter, params, hidden, tokens, loss_mask, valid, key, depth: int = 0):
    """Serving-time adaptation objective (see adaptation/objective.py): the offline block loss at
    16 random anchors in the generated text (`depth` is unused: one forward drafts a block); tau
    proxy = the loss's own estimate (`tau_est`)."""
    num_anchors = 16
    c = drafter.config
    model = nnx.merge(drafter.graphdef, params["draft"])
    loss, metrics = dflash_loss(model, params["embed"], params["head"], hidden, tokens, loss_mask,
                                valid, key, num_anchors, c.block_size, c.mask_token_id)
    return loss, metrics["tau_est"]


