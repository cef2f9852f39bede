"""Training SpecBlock: valid-prefix curriculum, rank head, multi-block training-time test.

The frozen target runs inside the jitted step and gives, per position t, the features at
`feature_layers` and p_t, its distribution of x_{t+1}. Block 1 reads (features of t, x_{t+1}) at
every t; its slot k predicts x_{t+2+k}, scored against p_{t+1+k}. Block b >= 2 replays drafting
from a leaf: draw M_b ~ U{1..K}; its condition is block b-1's output hidden at slot M_b - 1 and
its token the ground truth M_b further on (offset o_b = M_2 + ... + M_b), so slot k predicts
x_{t+2+o_b+k}. Block b's queries see block 1's entries before t * K + M_2 (earlier positions, and the
first M_2 slots of their own), the first M_{c+1} slots of block c (1 < c < b) at their own position
and their own block's slots <= k: exactly what a level-b block of the decoding tree sees. The
training unroll computes only the visible part (`block_attention`): block 1's entries of earlier
positions in query chunks, and a K-wide band per later block at the query's own position.

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
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from specblock_jax.drafters import draft_vocab
from specblock_jax.drafters.common import FeatureDrafterTask, settings_fields, vocab_arrays
from specblock_jax.drafters.specblock._model import (SpecBlockConfig, SpecBlockDecoding, SpecBlockDrafter, SpecBlockModel,
                                              block_mask, load_specblock)
from specblock_jax.models.target import Target
from specblock_jax.drafters.specblock._rank_tree import rank_class
from specblock_jax.training.losses import chain_tau, draft_loss, label_logits, rank_loss, shift
from specblock_jax.training.task import frozen_target_outputs, parse_settings


def loss_rows(key, has_data: jax.Array, fraction: float) -> jax.Array:
    """[B, R] positions whose logits enter the loss: all T (fraction 1) or R = ceil(fraction * T)
    drawn at random, positions with data (has_data [B, T] > 0) before the others."""
    b, t = has_data.shape
    if fraction >= 1.0:
        return jnp.broadcast_to(jnp.arange(t), (b, t))
    rows = max(1, int(-(-fraction * t // 1)))
    noise = jax.random.uniform(key, (b, t)) + (has_data > 0)
    return jax.lax.top_k(noise, rows)[1]


QUERY_CHUNK = 32  # positions per query chunk of `block_attention`


def block_attention(q, first: tuple, see_first, local: list, see_local, k: int,
                    chunk: int = QUERY_CHUNK, remat: bool = False) -> jax.Array:
    """Attention of a block's queries q [B, n, N, D] (n = T*K entries, e = i*K + slot) over
    block 1's keys/values `first` (each [B, n, KV, D]) under see_first [B, n, n], where no query
    sees an entry of a later position, and the `local` (k, v) pairs (each [B, n, KV, D]) seen only
    at the query's own position, under see_local [B, T, K, J] (J = K * len(local); local may be
    empty). One softmax over both parts: the attention of the dense [n, n + len(local) * n] mask,
    without computing its hidden columns: queries go in chunks of `chunk` positions, each against
    the block-1 entries up to the chunk's end only. With `remat`, each chunk is recomputed in the
    backward pass (`jax.checkpoint`) instead of keeping its scores and probabilities: the
    attention's saved memory drops from the scores of every chunk, O(n^2) per layer and block, to
    its inputs and outputs, for one more attention forward. Returns [B, n, N, D]."""
    bsz, n, nh, d = q.shape
    kvh = first[0].shape[2]
    qg = q.reshape(bsz, n, kvh, nh // kvh, d)
    hide = jnp.finfo(jnp.float32).min
    if local:
        kl = jnp.concatenate([kk.reshape(bsz, n // k, k, kvh, d) for kk, _ in local], axis=2)  # [B, T, J, KV, D]
        vl = jnp.concatenate([vv.reshape(bsz, n // k, k, kvh, d) for _, vv in local], axis=2)

    def one_chunk(qc, fk, fv, see_f, kl_c, vl_c, see_l):
        """A query chunk qc [B, c*K, KV, G, D] against block 1's fk/fv [B, e, KV, D] under see_f
        [B, c*K, e] and, with local parts, kl_c/vl_c [B, c, J, KV, D] under see_l [B, c, K, J]."""
        s1 = jnp.einsum("bekgd,bskd->bkges", qc, fk, preferred_element_type=jnp.float32)
        parts = [jnp.where(see_f[:, None, None], s1 / math.sqrt(d), hide)]
        if local:
            sl = jnp.einsum("btqkgd,btjkd->bkgtqj", qc.reshape(bsz, -1, k, *qc.shape[2:]), kl_c,
                            preferred_element_type=jnp.float32)
            sl = jnp.where(see_l[:, None, None], sl / math.sqrt(d), hide)
            parts.append(sl.reshape(sl.shape[:3] + (qc.shape[1], -1)))
        probs = jax.nn.softmax(jnp.concatenate(parts, axis=-1), axis=-1).astype(fv.dtype)
        out = jnp.einsum("bkges,bskd->bekgd", probs[..., :fk.shape[1]], fv)
        if local:
            p_local = probs[..., fk.shape[1]:].reshape(sl.shape)
            out = out + jnp.einsum("bkgtqj,btjkd->btqkgd", p_local, vl_c).reshape(out.shape)
        return out

    run = jax.checkpoint(one_chunk) if remat else one_chunk
    outs, step = [], min(chunk, n // k) * k
    for start in range(0, n, step):
        end = min(start + step, n)
        pos = slice(start // k, end // k)
        outs.append(run(qg[:, start:end], first[0][:, :end], first[1][:, :end], see_first[:, start:end, :end],
                        *((kl[:, pos], vl[:, pos], see_local[:, pos]) if local else (None, None, None))))
    return jnp.concatenate(outs, axis=1).reshape(bsz, n, nh, d)


def block_masks(valid, k: int, ms: list, block: int) -> tuple[jax.Array, jax.Array | None]:
    """(see_first [B, n, n], see_local [B, T, K, J] or None) of block `block` (0-based; ms as in
    `run_blocks`, valid [B, T]): block 1's entry (i, k) sees e' <= i*K + k (`block_mask`); a later
    block's sees block 1's entries before i*K + M_2, the first M_{c+1} slots of block c
    (1 < c < b) at its own position, and its own slots <= k; only valid positions' entries."""
    b, t = valid.shape
    ok = valid.astype(bool)
    key_ok = jnp.repeat(ok, k, axis=1)[:, None, :]
    if block == 0:
        return block_mask(t, k)[None] & key_ok, None
    e = jnp.arange(t * k)
    see_first = (e[None, :] < (e // k * k + ms[0])[:, None])[None] & key_ok
    slot = jnp.arange(k)
    see_local = [jnp.broadcast_to(slot[None, :] < ms[c], (k, k)) for c in range(1, block)]
    see_local = jnp.concatenate(see_local + [slot[None, :] <= slot[:, None]], axis=1)  # [K, J]
    return see_first, see_local[None, None] & ok[:, :, None, None]


def run_blocks(model, embed, cond, tokens, valid, ms: list, remat: bool = False) -> list[jax.Array]:
    """Block 1 over conditions cond [B, T, H] and tokens x_{t+1}, then one block per M in `ms`
    (block b conditioned on block b-1's slot M_b - 1, tokens offset by M_2 + ... + M_b).
    Returns each block's hidden [B, T, K, H]. Attention: `block_masks`, `block_attention` (with
    `remat`, recomputed per query chunk in the backward pass)."""
    b, t = tokens.shape
    k = model.c.block_size
    n = t * k
    first, local = [], []  # block 1's (k, v) per layer; each later block's (k, v) per layer
    idx = jnp.arange(t)
    offset, hiddens = 0, []
    for blk in range(len(ms) + 1):
        if blk:
            cond = jnp.take(hiddens[-1], ms[blk - 1] - 1, axis=2)
            offset = offset + ms[blk - 1]
        see_first, see_local = block_masks(valid, k, ms, blk)
        x = model.block_input(cond, jnp.take(embed, shift(tokens, 1 + offset), axis=0))
        cos, sin = model.slot_rope(jnp.broadcast_to(idx + offset, (b, t)), x.dtype)
        kvs = []
        for li, layer in enumerate(model.layers):
            x = model.shift_slots(x, li).reshape(b, n, -1)
            q, kk, vv = layer.self_attn.project(layer.input_layernorm(x), cos, sin)
            kvs.append((kk, vv))
            keys = first[li] if blk else (kk, vv)
            seen = [blk_kv[li] for blk_kv in local] + [(kk, vv)] if blk else []
            att = block_attention(q, keys, see_first, seen, see_local, k, remat=remat)
            x = x + layer.self_attn.output(att)
            x = (x + layer.mlp(layer.post_attention_layernorm(x))).reshape(b, t, k, -1)
        if blk == 0:
            first = kvs
        else:
            local.append(kvs)
        hiddens.append(x)
    return hiddens


def loss_targets(target_logits, loss_mask, valid, vocab=None):
    """(p_target [B, T, V'] fp32, its argmax [B, T], data [B, T] fp32 positions scored) from the
    target's logits [B, T, V]; vocab: (d2t, t2d) restricts them to the draft vocabulary (positions
    whose target argmax is outside it unscored, as in EAGLE-3; drafters/draft_vocab.py)."""
    if vocab is not None:
        target_logits, inside_vocab = draft_vocab.restrict(target_logits, *vocab)
        loss_mask = loss_mask * inside_vocab.astype(loss_mask.dtype)
    p_target = jax.nn.softmax(target_logits.astype(jnp.float32), axis=-1)
    return p_target, jnp.argmax(target_logits, axis=-1), (loss_mask * valid).astype(jnp.float32)


def block_offsets(key, num_blocks: int, k: int) -> list:
    """M_2..M_B ~ U{1..K} (traced ints), one per later block."""
    return [jax.random.randint(jax.random.fold_in(key, blk), (), 1, k + 1) for blk in range(1, num_blocks)]


def blocks_loss(model, hiddens: list, ms: list, p_target, want, data, key, *, decay: float = 0.8,
                valid_prefix: bool = True, prefix_norm: str = "valid", rank_weight: float = 1.0,
                loss_fraction: float = 1.0):
    """The draft and rank losses of each block's hidden [B, T, K, H] (`run_blocks`), against
    p_target/want/data of `loss_targets`. Returns (loss, metrics)."""
    b, t = want.shape
    k = model.c.block_size
    total, metrics, offset = 0.0, {}, 0
    for blk, hidden in enumerate(hiddens):
        offset = offset + (ms[blk - 1] if blk else 0)
        # the loss rows: every position, or a random `loss_fraction` of them (data rows first)
        sel = loss_rows(jax.random.fold_in(key, 100 + blk), shift(data, 1 + offset), loss_fraction)
        # [B, R, K, H]; every row: no gather (its gradient would be a scatter-add)
        h_sel = hidden if loss_fraction >= 1.0 else jnp.take_along_axis(hidden, sel[:, :, None, None], axis=1)
        logits = model.logits(h_sel)
        logq = jax.nn.log_softmax(logits, axis=-1)
        ahead = sel[:, :, None] + 1 + offset + jnp.arange(k)  # [B, R, K] index of p predicting
        inside = ahead < t
        flat = jnp.clip(ahead, 0, t - 1).reshape(b, -1)
        rows = sel.shape[1]
        target_p = jnp.take_along_axis(p_target, flat[:, :, None], axis=1).reshape(b, rows, k, -1)
        want_k = jnp.take_along_axis(want, flat, axis=1).reshape(b, rows, k)
        mask_k = jnp.take_along_axis(data, flat, axis=1).reshape(b, rows, k) * inside
        loss, per_slot, acc = draft_loss(logq, target_p, want_k, mask_k, decay, valid_prefix, prefix_norm)
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


def specblock_loss(model, embed, target_hidden, target_logits, tokens, loss_mask, valid, key, *,
                   num_blocks: int = 3, decay: float = 0.8, valid_prefix: bool = True,
                   prefix_norm: str = "valid", rank_weight: float = 1.0, loss_fraction: float = 1.0,
                   vocab: tuple[jax.Array, jax.Array] | None = None, remat: bool = False):
    """target_hidden [B, T, n, H], target_logits [B, T, V], tokens/loss_mask/valid [B, T];
    vocab: (d2t, t2d) of a reduced draft vocabulary (`loss_targets`).
    Every block runs over all T positions (they are each other's keys); its loss is taken at all
    of them or, to bound the cost of the vocabulary-wide soft CE, at a random `loss_fraction` of
    them per block and step (an unbiased sample of the same loss). Returns (loss, metrics)."""
    p_target, want, data = loss_targets(target_logits, loss_mask, valid, vocab)
    ms = block_offsets(key, num_blocks, model.c.block_size)
    hiddens = run_blocks(model, embed, model.features(target_hidden), tokens, valid, ms, remat)
    return blocks_loss(model, hiddens, ms, p_target, want, data, key, decay=decay,
                       valid_prefix=valid_prefix, prefix_norm=prefix_norm, rank_weight=rank_weight,
                       loss_fraction=loss_fraction)


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
    # valid-prefix slot losses averaged over their valid positions ("valid", the reference) or
    # summed over every position ("all", the ablation that keeps late slots small while slot 0 learns)
    prefix_norm: str = "valid"
    rank_weight: float = 1.0  # weight of the rank-head loss
    loss_fraction: float = 0.34  # share of positions whose vocabulary-wide losses are computed
    # recompute the unroll's attention per query chunk in the backward pass instead of keeping its
    # scores (`block_attention`): the same loss and gradients, for long sequences on an accelerator
    remat_attention: bool = False


class SpecBlockTask(FeatureDrafterTask):
    """TrainTask for SpecBlock (see specblock_jax/training/task.py)."""

    Settings = SpecBlockTrainConfig
    DECODING = tuple(f.name for f in dataclasses.fields(SpecBlockDecoding))

    def __init__(self, settings: SpecBlockTrainConfig | dict[str, Any], target: Target):
        s = parse_settings(SpecBlockTrainConfig, settings, "specblock: ")
        if s.prefix_norm not in ("valid", "all"):  # refused here, before any data loads or step traces
            raise ValueError(f"specblock: prefix_norm must be 'valid' or 'all', not {s.prefix_norm!r}")
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
                              valid_prefix=s.valid_prefix, prefix_norm=s.prefix_norm,
                              rank_weight=s.rank_weight,
                              loss_fraction=s.loss_fraction, vocab=self.vocab_arrays(),
                              remat=s.remat_attention)

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


