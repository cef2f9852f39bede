"""Training SpecBlock: valid-prefix curriculum, rank head, multi-block training-time test.

The frozen target runs inside the jitted step and gives, per position t, the features at
`feature_layers` and p_t, its distribution of x_{t+1}. Block 1 reads (features of t, x_{t+1}) at
every t; its slot k predicts x_{t+2+k}, scored against p_{t+1+k}. Block b >= 2 replays drafting
from a leaf: draw M_b ~ U{1..K}; its condition is block b-1's output hidden at slot M_b - 1 and
its token the ground truth M_b further on (offset o_b = M_2 + ... + M_b), so slot k predicts
x_{t+2+o_b+k}. Block b's queries see block 1's entries before t * K + M_2 (earlier positions, and the
first M_2 slots of their own), the first M_{c+1} slots of block c (1 < c < b) at their own position
and their own block's slots <= k: exactly what a level-b block of the decoding tree sees.

Losses per block (summed over blocks, no filtering between them):
  draft: soft CE against the target distribution, slot weights decay^k; with `valid_prefix` the
         slot-k term counts only positions whose slots 0..k-1 were argmax-correct (vs the target's
         argmax);
  rank:  the rank head's class of the target token's rank in the slot's draft distribution, with
         asymmetric ordinal label smoothing 1/(1 + |c - t| + max(t - c, 0))^2, a distance weight
         1 + |t - p| + max(t - p, 0) (under-estimating the rank costs twice), class weights
         min(1, 10 / count) per slot, and the slots after the first mis-ranked one dropped.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from specblock_jax.drafters import draft_vocab
from specblock_jax.drafters.common import FeatureDrafterTask, settings_fields, vocab_arrays
from specblock_jax.drafters.registry import DrafterKind, register
from specblock_jax.drafters.specblock import (SpecBlockConfig, SpecBlockDecoding, SpecBlockDrafter, SpecBlockModel,
                                              block_mask, load_specblock)
from specblock_jax.models.target import Target
from specblock_jax.trees.rank_tree import rank_class
from specblock_jax.training.losses import chain_tau, draft_loss, label_logits, rank_loss, shift
from specblock_jax.training.task import frozen_target_outputs, parse_settings


def later_block_mask(t: int, k: int, block: int, ms: list) -> jax.Array:
    """[T*K, (block + 1) * T*K] mask of block `block` (0-based, >= 1) over all blocks' entries;
    ms[c] = M of block c + 1 (traced ints)."""
    e = jnp.arange(t * k)
    qi, qk = (e // k)[:, None], (e % k)[:, None]
    ki, kk = (e // k)[None, :], (e % k)[None, :]
    parts = [e[None, :] < qi * k + ms[0]]
    parts += [(ki == qi) & (kk < ms[c]) for c in range(1, block)]
    parts.append((ki == qi) & (kk <= qk))
    return jnp.concatenate(parts, axis=1)


def loss_rows(key, has_data: jax.Array, fraction: float) -> jax.Array:
    """[B, R] positions whose logits enter the loss: all T (fraction 1) or R = ceil(fraction * T)
    drawn at random, positions with data (has_data [B, T] > 0) before the others."""
    b, t = has_data.shape
    if fraction >= 1.0:
        return jnp.broadcast_to(jnp.arange(t), (b, t))
    rows = max(1, int(-(-fraction * t // 1)))
    noise = jax.random.uniform(key, (b, t)) + (has_data > 0)
    return jax.lax.top_k(noise, rows)[1]


def run_blocks(model, embed, cond, tokens, valid, ms: list) -> list[jax.Array]:
    """Block 1 over conditions cond [B, T, H] and tokens x_{t+1}, then one block per M in `ms`
    (block b conditioned on block b-1's slot M_b - 1, tokens offset by M_2 + ... + M_b).
    Returns each block's hidden [B, T, K, H]."""
    b, t = tokens.shape
    c = model.c
    k = c.block_size
    key_ok = jnp.repeat(valid.astype(bool), k, axis=1)[:, None, :]  # [B, 1, T*K]
    zeros = jnp.zeros((b, c.num_kv_heads, t * k, c.head_dim), jnp.dtype(c.dtype))  # caches [B, K, S, D]
    idx = jnp.arange(t)
    offset, kvs, hiddens = 0, [], []
    for blk in range(len(ms) + 1):
        if blk == 0:
            mask = block_mask(t, k)[None] & key_ok
        else:
            cond = jnp.take(hiddens[-1], ms[blk - 1] - 1, axis=2)
            offset = offset + ms[blk - 1]
            mask = later_block_mask(t, k, blk, ms)[None] & jnp.concatenate([key_ok] * (blk + 1), axis=2)
        caches = tuple((jnp.concatenate([kv[layer][0] for kv in kvs] + [zeros], axis=2),
                        jnp.concatenate([kv[layer][1] for kv in kvs] + [zeros], axis=2))
                       for layer in range(c.num_layers))
        tok = shift(tokens, 1 + offset)
        pos = jnp.broadcast_to(idx + offset, (b, t))
        hidden, caches = model.block(cond, jnp.take(embed, tok, axis=0), pos, mask, caches,
                                     jnp.full((b,), blk * t * k, jnp.int32))
        kvs.append(tuple((ck[:, :, blk * t * k:], cv[:, :, blk * t * k:]) for ck, cv in caches))
        hiddens.append(hidden)
    return hiddens


def specblock_loss(model, embed, target_hidden, target_logits, tokens, loss_mask, valid, key, *,
                   num_blocks: int = 3, decay: float = 0.8, valid_prefix: bool = True,
                   rank_weight: float = 1.0, loss_fraction: float = 1.0,
                   vocab: tuple[jax.Array, jax.Array] | None = None):
    """target_hidden [B, T, n, H], target_logits [B, T, V], tokens/loss_mask/valid [B, T];
    vocab: (d2t, t2d) of a reduced draft vocabulary (the target distribution restricted to it,
    positions whose target argmax is outside it unscored, as in EAGLE-3; drafters/draft_vocab.py).
    Every block runs over all T positions (they are each other's keys); its loss is taken at all
    of them or, to bound the cost of the vocabulary-wide soft CE, at a random `loss_fraction` of
    them per block and step (an unbiased sample of the same loss). Returns (loss, metrics)."""
    b, t = tokens.shape
    k = model.c.block_size
    if vocab is not None:
        target_logits, inside_vocab = draft_vocab.restrict(target_logits, *vocab)
        loss_mask = loss_mask * inside_vocab.astype(loss_mask.dtype)
    p_target = jax.nn.softmax(target_logits.astype(jnp.float32), axis=-1)
    want = jnp.argmax(target_logits, axis=-1)
    data = (loss_mask * valid).astype(jnp.float32)
    ms = [jax.random.randint(jax.random.fold_in(key, blk), (), 1, k + 1) for blk in range(1, num_blocks)]
    hiddens = run_blocks(model, embed, model.features(target_hidden), tokens, valid, ms)
    total, metrics, offset = 0.0, {}, 0
    for blk, hidden in enumerate(hiddens):
        offset = offset + (ms[blk - 1] if blk else 0)
        # the loss rows: every position, or a random `loss_fraction` of them (data rows first)
        sel = loss_rows(jax.random.fold_in(key, 100 + blk), shift(data, 1 + offset), loss_fraction)
        h_sel = jnp.take_along_axis(hidden, sel[:, :, None, None], axis=1)  # [B, R, K, H]
        logits = model.logits(h_sel)
        logq = jax.nn.log_softmax(logits, axis=-1)
        ahead = sel[:, :, None] + 1 + offset + jnp.arange(k)  # [B, R, K] index of p predicting
        inside = ahead < t
        flat = jnp.clip(ahead, 0, t - 1).reshape(b, -1)
        rows = sel.shape[1]
        target_p = jnp.take_along_axis(p_target, flat[:, :, None], axis=1).reshape(b, rows, k, -1)
        want_k = jnp.take_along_axis(want, flat, axis=1).reshape(b, rows, k)
        mask_k = jnp.take_along_axis(data, flat, axis=1).reshape(b, rows, k) * inside
        loss, per_slot, acc = draft_loss(logq, target_p, want_k, mask_k, decay, valid_prefix)
        rank = jnp.sum(logq > jnp.take_along_axis(logq, want_k[..., None], axis=-1), axis=-1)
        r_loss, r_acc = rank_loss(model.rank_logits(h_sel, logits), rank_class(rank), mask_k)
        total = total + loss + rank_weight * r_loss
        name = f"b{blk + 1}"
        metrics[f"{name}_loss"] = loss
        metrics[f"{name}_rank_loss"] = r_loss
        metrics[f"{name}_rank_acc"] = r_acc
        for j in range(k):
            metrics[f"{name}_acc_{j}"] = acc[j]
    return total, metrics


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpecBlockTrainConfig(SpecBlockDecoding):
    """The SpecBlock keys of a training config (configs/drafters/specblock.yaml): the drafter's
    shape, its training, and the decoding settings it is exported with."""

    feature_layers: tuple[int, ...] | None = None  # HF hidden_states indices; None = the default rule
    draft_vocab_size: int = 0  # reduced draft vocabulary (d2t/t2d); 0 = the target's whole vocabulary
    draft_vocab: str = ""  # its map (a draft_vocab.safetensors); "" = counted from the training data
    drafter_layers: int = 2  # decoder layers
    block_size: int = 4  # K slots per block
    layer_shift: bool = True  # false = ablation
    rank_hidden: int = 256  # the rank head's hidden width
    num_blocks: int = 2  # blocks of the multi-block training-time test (the paper uses 3)
    slot_decay: float = 0.8  # slot weights decay^k
    valid_prefix: bool = True  # false = ablation
    rank_weight: float = 1.0  # weight of the rank-head loss
    loss_fraction: float = 0.34  # share of positions whose vocabulary-wide losses are computed


class SpecBlockTask(FeatureDrafterTask):
    """TrainTask for SpecBlock (see specblock_jax/training/task.py)."""

    Settings = SpecBlockTrainConfig
    DECODING = tuple(f.name for f in dataclasses.fields(SpecBlockDecoding))

    def __init__(self, settings: SpecBlockTrainConfig | dict[str, Any], target: Target):
        s = parse_settings(SpecBlockTrainConfig, settings, "specblock: ")
        config = SpecBlockConfig.for_target(target.config, s.feature_layers, num_layers=s.drafter_layers,
                                            block_size=s.block_size, layer_shift=s.layer_shift,
                                            rank_hidden=s.rank_hidden, draft_vocab_size=s.draft_vocab_size)
        self.setup(s, target, config, SpecBlockModel)

    def loss_fn(self, params, frozen, batch, key):
        hidden, logits = frozen_target_outputs(self.target, frozen, batch, self.config.feature_layers)
        model = nnx.merge(self.graphdef, params)
        embed = jax.lax.stop_gradient(frozen["embed_tokens"])
        s = self.settings
        return specblock_loss(model, embed, hidden, logits, batch["tokens"], batch["loss_mask"],
                              batch["attention_mask"], key, num_blocks=s.num_blocks, decay=s.slot_decay,
                              valid_prefix=s.valid_prefix, rank_weight=s.rank_weight,
                              loss_fraction=s.loss_fraction, vocab=self.vocab_arrays())

    def drafter(self) -> SpecBlockDrafter:
        return SpecBlockDrafter(self.config, self.graphdef, **settings_fields(self.settings, self.DECODING))


def specblock_objective(drafter, params, hidden, tokens, loss_mask, valid, key, depth: int = 0):
    """Serving-time adaptation objective (see adaptation/objective.py): the offline loss over
    `depth` blocks (0 = the drafter's `max_blocks`) with the committed tokens as labels; tau proxy
    from the blocks' slot accuracies in order (a chain)."""
    model = nnx.merge(drafter.graphdef, params["draft"])
    logits = label_logits(tokens, drafter.config.vocab_size)
    blocks = depth or max(drafter.max_blocks, 1)
    loss, metrics = specblock_loss(model, params["embed"], hidden, logits, tokens, loss_mask, valid,
                                   key, num_blocks=blocks, vocab=vocab_arrays(params))
    acc = [metrics[f"b{b + 1}_acc_{j}"] for b in range(blocks) for j in range(drafter.config.block_size)]
    return loss, chain_tau(jnp.stack(acc))


register(DrafterKind("specblock", load=load_specblock, task=SpecBlockTask, objective=specblock_objective))
