"""A reduced draft vocabulary (EAGLE-3's d2t / t2d): the drafter's own LM head covers the K most
frequent target tokens of its training data; drafted ids are mapped to target ids inside the jit.

    d2t [K] int32: the target id of draft id i (most frequent first, ties to the lower id)
    t2d [V] int32: the draft id of target id j, or -1 when j is outside the draft vocabulary

EAGLE-3 stores d2t as offsets (target id - draft id) and t2d as a bool mask; ours holds the ids
themselves. A drafter folder keeps both in `draft_vocab.safetensors`; loading checks that they
are consistent with each other, with the target's vocabulary and with the drafter's head, since a
silently wrong map drafts the wrong tokens (acceptance collapses, outputs stay lossless).

Training with a reduced vocabulary (as EAGLE-3 does): the target distribution a drafter learns is
the target's softmax restricted to the draft vocabulary (its logits at d2t, renormalised), and
positions whose target argmax lies outside the draft vocabulary are left out of the loss.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

FILE = "draft_vocab.safetensors"


class DraftVocab(NamedTuple):
    d2t: np.ndarray  # [K] int32 target id of each draft id
    t2d: np.ndarray  # [V] int32 draft id of each target id, -1 outside


def count_tokens(sequences: Iterable[Iterable[int]], vocab_size: int) -> np.ndarray:
    """[V] int64 occurrences of every target id in `sequences` (ids outside [0, V) are an error)."""
    counts = np.zeros(vocab_size, np.int64)
    for seq in sequences:
        ids = np.asarray(list(seq), np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"token id outside [0, {vocab_size}) in the draft-vocabulary counts")
        counts += np.bincount(ids, minlength=vocab_size)
    return counts


def from_counts(counts: np.ndarray, size: int) -> DraftVocab:
    """The `size` most frequent target ids (ties to the lower id) as a DraftVocab."""
    v = counts.shape[0]
    if not 0 < size <= v:
        raise ValueError(f"draft vocabulary size must be in [1, {v}], got {size}")
    d2t = np.lexsort((np.arange(v), -counts))[:size].astype(np.int32)  # by count desc, then id
    return make(d2t, v)


def make(d2t: np.ndarray, vocab_size: int) -> DraftVocab:
    """A DraftVocab from d2t (checked: distinct ids in [0, V))."""
    d2t = np.asarray(d2t, np.int32)
    t2d = np.full(vocab_size, -1, np.int32)
    inside = (d2t >= 0) & (d2t < vocab_size)  # out-of-range ids are reported by `validate`
    t2d[d2t[inside]] = np.arange(d2t.shape[0], dtype=np.int32)[inside]
    vocab = DraftVocab(d2t, t2d)
    validate(vocab, vocab_size, d2t.shape[0], "draft vocabulary")
    return vocab


def validate(vocab: DraftVocab, vocab_size: int, head_size: int, where: str) -> None:
    """ValueError naming `where` unless d2t [head_size] holds distinct ids in [0, vocab_size) and
    t2d [vocab_size] is its exact inverse (-1 elsewhere)."""
    d2t, t2d = np.asarray(vocab.d2t), np.asarray(vocab.t2d)
    if d2t.shape != (head_size,):
        raise ValueError(f"{where}: d2t has shape {d2t.shape}, the drafter's head has {head_size} "
                         "outputs")
    if t2d.shape != (vocab_size,):
        raise ValueError(f"{where}: t2d has shape {t2d.shape}, the target vocabulary has {vocab_size} ids")
    if d2t.min(initial=0) < 0 or d2t.max(initial=0) >= vocab_size:
        raise ValueError(f"{where}: d2t holds ids outside the target vocabulary [0, {vocab_size})")
    if np.unique(d2t).shape[0] != head_size:
        raise ValueError(f"{where}: d2t maps two draft ids to the same target id")
    inverse = np.full(vocab_size, -1, np.int64)
    inverse[d2t] = np.arange(head_size)
    if not np.array_equal(inverse, t2d):
        raise ValueError(f"{where}: t2d is not the inverse of d2t (a stale or mismatched map)")


def released_vocab_tensors(vocab: DraftVocab, lm_head: np.ndarray) -> dict[str, np.ndarray]:
    """A draft vocabulary as released checkpoints store it (EAGLE-3's convention, which SpecBlock's
    release shares): "lm_head.weight" (the head's rows [K, H] reordered by ascending target id),
    "d2t" (target id minus draft index [K] int64) and "t2d" (in the draft vocabulary or not [V] bool)."""
    order = np.argsort(vocab.d2t, kind="stable")
    d2t = np.asarray(vocab.d2t, np.int64)[order]
    return {"lm_head.weight": lm_head[order], "d2t": d2t - np.arange(d2t.shape[0], dtype=np.int64),
            "t2d": np.asarray(vocab.t2d) >= 0}


def save(path: str | Path, vocab: DraftVocab) -> None:
    """Writes `draft_vocab.safetensors` into the drafter folder `path` (created if needed)."""
    Path(path).mkdir(parents=True, exist_ok=True)
    save_file({"d2t": np.asarray(vocab.d2t, np.int32), "t2d": np.asarray(vocab.t2d, np.int32)},
              str(Path(path) / FILE), metadata={"format": "specblock-jax draft vocabulary"})


def placeholder_settings(config, folder: str | Path) -> dict:
    """The training settings of a drafter config's reduced draft vocabulary, its map the first
    `draft_vocab_size` ids written to `folder` (ahead-of-time pricing: only the size sets shapes);
    {} for a full vocabulary."""
    size = getattr(config, "draft_vocab_size", 0)
    if not size:
        return {}
    save(folder, make(np.arange(size, dtype=np.int32), config.vocab_size))
    return {"draft_vocab_size": size, "draft_vocab": str(folder)}


def load(path: str | Path, vocab_size: int, head_size: int) -> DraftVocab:
    """The checked draft vocabulary of the drafter folder `path` (or of the file itself), with
    clear errors when it is missing or does not match the target's vocabulary or the drafter's
    head."""
    file = Path(path) / FILE if Path(path).is_dir() or not Path(path).suffix else Path(path)
    if not file.exists():
        raise ValueError(f"{path}: the drafter has a {head_size}-token draft vocabulary but no {FILE} "
                         "(the d2t/t2d map) is in its folder")
    arrays = load_file(str(file))
    if set(arrays) != {"d2t", "t2d"}:
        raise ValueError(f"{file}: expected tensors d2t and t2d, found {sorted(arrays)}")
    vocab = DraftVocab(arrays["d2t"].astype(np.int32), arrays["t2d"].astype(np.int32))
    validate(vocab, vocab_size, head_size, str(file))
    return vocab


def restrict(target_logits: jax.Array, d2t: jax.Array, t2d: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[..., V] target logits -> ([..., K] logits of the draft ids, [...] bool: the target's argmax
    is inside the draft vocabulary). The loss of a reduced-vocabulary drafter uses the first and
    masks positions where the second is False."""
    inside = jnp.take(t2d, jnp.argmax(target_logits, axis=-1)) >= 0
    return jnp.take(target_logits, d2t, axis=-1), inside
