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

import jax
import jax.numpy as jnp
from flax import nnx

from specblock_jax.adaptation.objective import register_objective
from specblock_jax.drafters.dflash import DFlashConfig, DFlashDrafter, head_logits, init_dflash, target_head
from specblock_jax.drafters.io import save_drafter
from specblock_jax.models.target import Target
from specblock_jax.models.transformer import positions_from_valid
from specblock_jax.training.task import frozen_target_outputs, register_task


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
    ctx_kv = model.context_kv(model.context(target_hidden), pos)
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


class DFlashTask:
    """TrainTask for the DFlash-style drafter (see specblock_jax/training/task.py)."""

    def __init__(self, cfg: dict, target: Target):
        self.cfg, self.target = cfg, target
        layers = cfg.get("feature_layers")
        self.config = DFlashConfig.for_target(
            target.config, int(cfg.get("num_layers", 3)), tuple(layers) if layers else None,
            int(cfg.get("block_size", 16)), int(cfg.get("mask_token_id", 3)))
        self.graphdef, _ = init_dflash(self.config)
        self.num_anchors = int(cfg.get("num_anchors", 16))
        self.gamma = float(cfg.get("loss_gamma", 7.0))
        self.head = target_head(target)

    def init_params(self, key):
        return init_dflash(self.config, int(jax.random.randint(key, (), 0, 2**31 - 1)))[1]

    def frozen(self):
        return {"target": self.target.params, "head": self.head}

    def loss_fn(self, params, frozen, batch, key):
        hidden, _ = frozen_target_outputs(self.target, frozen["target"], batch, self.config.feature_layers,
                                          logits=False)
        model = nnx.merge(self.graphdef, params)
        embed = jax.lax.stop_gradient(frozen["target"]["embed_tokens"])
        head = jax.lax.stop_gradient(frozen["head"])
        return dflash_loss(model, embed, head, hidden, batch["tokens"], batch["loss_mask"],
                           batch["attention_mask"], key,
                           self.num_anchors, self.config.block_size, self.config.mask_token_id, self.gamma)

    def drafter(self) -> DFlashDrafter:
        return DFlashDrafter(self.config, self.graphdef, int(self.cfg.get("decode_block_size", 0))
                             or self.config.block_size, str(self.cfg.get("draft_mode", "auto")))

    def decoding_drafter(self, params):
        return self.drafter(), {"draft": params, "embed": self.target.params["embed_tokens"],
                                "head": self.head}

    def export(self, params, out_dir: str) -> None:
        save_drafter(self.drafter(), params, out_dir)


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


register_task("dflash", DFlashTask)
register_objective("DFlashDrafter", dflash_objective)
