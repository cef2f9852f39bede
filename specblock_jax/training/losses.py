"""Loss building blocks shared by the drafters' offline training and serving-time adaptation.

Each drafter kind's own loss (EAGLE-3's training-time test, SpecBlock's blocks, DFlash's anchored
blocks) runs its model in its `drafters/<kind>/_train.py`; the pieces here are model-free:

    shift(x, s)                   x[:, t + s] at index t: the label s positions ahead
    label_logits(tokens, V)       committed tokens as one-hot "target logits" [B, T, V]
    draft_loss(logq, p, want, m)  per-slot soft CE [B, T, K, V], valid-prefix masked, slot decay
    rank_loss(logits, cls, m)     the rank head's ordinal-smoothed CE [B, T, K, C]
    chain_tau(acc)                acceptance length of a chain from per-step accuracies
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def shift(x: jax.Array, s, fill=0) -> jax.Array:
    """x[:, t + s] at index t along axis 1, `fill` past the end. s: a Python int (a slice) or a
    traced scalar (a gather)."""
    if isinstance(s, int):
        pad = jnp.full((x.shape[0], s) + x.shape[2:], fill, x.dtype)
        return jnp.concatenate([x[:, s:], pad], axis=1)
    t = x.shape[1]
    idx = jnp.arange(t) + s
    out = jnp.take(x, jnp.clip(idx, 0, t - 1), axis=1)
    return jnp.where((idx < t).reshape((1, t) + (1,) * (x.ndim - 2)), out, jnp.asarray(fill, x.dtype))


def label_logits(tokens: jax.Array, vocab_size: int) -> jax.Array:
    """[B, T] tokens -> [B, T, V] float32 logits of the one-hot distribution of the next token
    (position i puts all mass on tokens[i + 1]; the last position is arbitrary and must be masked).
    Lets the soft cross-entropy losses of offline training take the committed tokens as labels."""
    nxt = jnp.concatenate([tokens[:, 1:], tokens[:, -1:]], axis=1)
    return jnp.where(jax.nn.one_hot(nxt, vocab_size, dtype=bool), 0.0, -1e9).astype(jnp.float32)


def prefix_ok(correct: jax.Array) -> jax.Array:
    """[..., K] bool -> [..., K] bool: True at k when slots 0..k-1 are all correct."""
    ones = jnp.ones(correct.shape[:-1] + (1,), jnp.int32)
    return jnp.cumprod(jnp.concatenate([ones, correct[..., :-1].astype(jnp.int32)], -1), -1) > 0


def draft_loss(logq, target_p, want, mask, decay: float, valid_prefix: bool, prefix_norm: str = "valid"):
    """Soft cross-entropy per draft slot. logq/target_p [B, T, K, V], want [B, T, K] target argmax,
    mask [B, T, K] float; valid_prefix: slot k counts only where slots 0..k-1 were argmax-correct.
    prefix_norm: slot k's loss is the mean over its counted positions ("valid", the public
    reference) or their sum over every masked position ("all": a slot whose prefix is rarely right
    weighs in proportionally less). Returns (sum_k decay^k L_k, per-slot losses [K], per-slot top-1
    agreement [K])."""
    if prefix_norm not in ("valid", "all"):
        raise ValueError(f"prefix_norm must be 'valid' or 'all', not {prefix_norm!r}")
    ce = -jnp.sum(target_p * logq, axis=-1)
    correct = jnp.argmax(logq, axis=-1) == want
    m = mask * prefix_ok(correct) if valid_prefix else mask
    per_slot = jnp.sum(ce * m, (0, 1)) / jnp.maximum(jnp.sum(m if prefix_norm == "valid" else mask, (0, 1)), 1.0)
    acc = jnp.sum(correct * mask, (0, 1)) / jnp.maximum(jnp.sum(mask, (0, 1)), 1.0)
    weights = decay ** jnp.arange(logq.shape[2])
    return jnp.sum(weights * per_slot), per_slot, acc


def rank_loss(rank_logits, true_cls, mask):
    """rank_logits [B, T, K, C], true_cls [B, T, K] (class of the target token's rank), mask
    [B, T, K] float -> (loss, accuracy). Ordinal label smoothing 1/(1 + |c - t| + max(t - c, 0))^2,
    distance weight 1 + |t - p| + max(t - p, 0) (under-estimating the rank costs twice), class
    weights min(1, 10 / count) per slot, slots after the first mis-ranked one dropped."""
    classes = rank_logits.shape[-1]
    c = jnp.arange(classes)
    t = true_cls[..., None]
    kernel = 1.0 / (1.0 + jnp.abs(c - t) + jnp.maximum(t - c, 0)) ** 2
    soft = kernel / jnp.sum(kernel, axis=-1, keepdims=True)
    ce = -jnp.sum(soft * jax.nn.log_softmax(rank_logits, axis=-1), axis=-1)
    pred = jnp.argmax(rank_logits, axis=-1)
    dist = 1.0 + jnp.abs(true_cls - pred) + jnp.maximum(true_cls - pred, 0)
    hit = pred == true_cls
    m = mask * prefix_ok(hit)  # drop slots after the first mis-ranked one (keep that one)
    onehot = jax.nn.one_hot(true_cls, classes) * m[..., None]
    count = jnp.sum(onehot, axis=(0, 1))  # [K, C]
    class_w = jnp.minimum(1.0, 10.0 / jnp.maximum(count, 1.0))
    w = jnp.sum(onehot * class_w, axis=-1)  # [B, T, K]
    loss = jnp.sum(w * dist * ce) / jnp.maximum(jnp.sum(w), 1.0)
    acc = jnp.sum(hit * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss, acc


def chain_tau(accuracies: jax.Array) -> jax.Array:
    """Acceptance length of a chain whose step-j conditional accuracy is accuracies[j]:
    1 + sum_j prod_{i <= j} acc_i (the bonus token included)."""
    return 1.0 + jnp.sum(jnp.cumprod(accuracies))
