"""Regenerated drafter training data as a TFDS dataset, and a resumable numpy batch iterator.

`train/regenerate.py` writes `<mode>.jsonl` files of the target's own responses. `RegenDataset`
turns such a folder into a TFDS dataset (array_record files, no TensorFlow needed); `BatchIterator`
reads it back as fixed-shape training batches.

    builder = RegenDataset(data_dir="data/tfds/train", source_dir="data/regen/train")
    builder.download_and_prepare()                  # or build_tfds(source_dir, data_dir)
    source = builder.as_data_source()["train"]      # later, without source_dir:
    # source = tfds.data_source("specblock_regen", data_dir="data/tfds/train")["train"]
    it = BatchIterator(source, batch_size=8, max_len=512, seed=0)
    batch = next(it)                                # {"tokens", "loss_mask", "attention_mask"}: [8, 512]
    state = it.get_state()                          # {"epoch": 0, "batch": 1}: store in a checkpoint
    it = BatchIterator(source, batch_size=8, max_len=512, seed=0, state=state)   # continues exactly

Never use `tfds.load` / `as_dataset`: they need TensorFlow.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from specblock_jax.jsonl import Torn, complete_lines, parse_rows

log = logging.getLogger(__name__)

MODES = ("greedy", "sampled")
PAD_ID = 2
VALIDATION_PER_MILLE = 20  # ~2% of ids go to the validation split
RECORD_KEYS = ("id", "mode", "prompt_ids", "response_ids")


def read_records(path: Path, torn: Torn = "ignore") -> list[dict[str, Any]]:
    """The records of one regenerate `<mode>.jsonl` file ([] if it does not exist).

    A torn last line (no trailing newline: a kill mid-write) is ignored (torn="cut": cut off the
    file, as a resuming writer does; `specblock_jax.jsonl.complete_lines`); any other line that is
    not a record with id, mode, prompt_ids and response_ids is skipped with a warning.
    """
    out = []
    for n, rec, bad in parse_rows(complete_lines(path, torn).splitlines()):
        if bad is not None:
            log.warning("%s line %d: skipped, %s", path, n, bad)
            continue
        if not isinstance(rec, dict) or any(k not in rec for k in RECORD_KEYS):
            log.warning("%s line %d: skipped, a record needs the keys %s", path, n, RECORD_KEYS)
            continue
        out.append(rec)
    return out


def is_validation(example_id: str) -> bool:
    """Deterministic ~2% split by a hash of the id (both modes of a prompt share a split)."""
    h = int.from_bytes(hashlib.sha256(example_id.encode("utf-8")).digest()[:4], "little")
    return h % 1000 < VALIDATION_PER_MILLE


class RegenDataset(tfds.core.GeneratorBasedBuilder):
    """TFDS builder `specblock_regen` over a `train/regenerate.py` output folder.

    Constructor: `RegenDataset(data_dir=..., source_dir=...)`; `source_dir` (the regenerate `--out`
    folder) is needed only to build, not to read. One dataset per `data_dir`: build each regenerate
    run into its own `data_dir`. download_and_prepare() reuses a built version; `build_tfds` rebuilds.

    Features per example: `id`, `mode` (text, read back as bytes), `prompt_ids`, `response_ids`,
    `assistant_mask` (int32 [n], variable length; the mask covers prompt + response, see
    `record_mask`). Splits: `train` and `validation` (`is_validation(id)`, ~2%); a split
    that would be empty (a tiny source) is left out.
    Examples are keyed by "<mode>/<id>"; a repeated (id, mode) keeps its first record.
    """

    name = "specblock_regen"
    # TFDS finds a packaged builder's source through importlib_resources, which it does not install
    # on Python >= 3.9; giving the path directly avoids that import (no checksums file is used).
    code_path = epath.Path(__file__)
    VERSION = tfds.core.Version("1.1.0")
    RELEASE_NOTES = {"1.0.0": "prompt_ids, response_ids, id, mode; train and hash-based validation",
                     "1.1.0": "assistant_mask: the tokens a drafter learns (conversations: every assistant turn)"}

    def __init__(self, *, source_dir: str | Path | None = None, **kwargs: Any):
        self._source_dir = Path(source_dir) if source_dir is not None else None
        kwargs.setdefault("file_format", "array_record")
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="Target-regenerated responses to training prompts, for drafter training.",
            features=tfds.features.FeaturesDict({
                "id": tfds.features.Text(),
                "mode": tfds.features.Text(),
                "prompt_ids": tfds.features.Tensor(shape=(None,), dtype=np.int32),
                "response_ids": tfds.features.Tensor(shape=(None,), dtype=np.int32),
                "assistant_mask": tfds.features.Tensor(shape=(None,), dtype=np.int32),
            }),
        )

    def _split_generators(self, dl_manager: Any) -> dict[str, Iterator]:
        if self._source_dir is None or not self._source_dir.is_dir():
            raise ValueError(f"building needs source_dir= a regenerate output folder, got {self._source_dir}")
        files = [self._source_dir / f"{m}.jsonl" for m in MODES if (self._source_dir / f"{m}.jsonl").exists()]
        if not files:
            raise ValueError(f"{self._source_dir}: no {[m + '.jsonl' for m in MODES]} files")
        splits: dict[str, list[tuple[str, dict]]] = {"train": [], "validation": []}
        seen = set()
        for path in files:
            for rec in read_records(path):
                key = f"{rec['mode']}/{rec['id']}"
                if key in seen:
                    log.warning("%s: skipped a repeated record %s", path, key)
                    continue
                seen.add(key)
                splits["validation" if is_validation(str(rec["id"])) else "train"].append((key, rec))
        return {name: self._generate_examples(recs) for name, recs in splits.items() if recs}

    def _generate_examples(self, records: list[tuple[str, dict]]) -> Iterator[tuple[str, dict]]:
        for key, rec in records:
            yield key, {"id": str(rec["id"]), "mode": rec["mode"],
                        "prompt_ids": np.asarray(rec["prompt_ids"], np.int32),
                        "response_ids": np.asarray(rec["response_ids"], np.int32),
                        "assistant_mask": record_mask(rec)}


def record_mask(rec: Mapping[str, Any]) -> np.ndarray:
    """int32 [n_prompt + n_response] tokens a drafter learns to predict: the record's
    "assistant_mask" (a conversation's assistant turns, `train/regenerate.py --conversations`),
    else the response tokens."""
    p, r = len(rec["prompt_ids"]), len(rec["response_ids"])
    if "assistant_mask" in rec:
        mask = np.asarray(rec["assistant_mask"], np.int32)
        if mask.shape != (p + r,):
            raise ValueError(f"record {rec.get('id')!r}: assistant_mask has {mask.shape[0]} entries for "
                             f"{p + r} tokens")
        return mask
    return np.concatenate([np.zeros(p, np.int32), np.ones(r, np.int32)])


def build_tfds(source_dir: str | Path, data_dir: str | Path) -> RegenDataset:
    """Builds (or rebuilds, if the source grew) the dataset of `source_dir` into `data_dir`."""
    builder = RegenDataset(data_dir=str(data_dir), source_dir=source_dir)
    mode = tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS  # regenerate the splits, never download
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(download_mode=mode))
    return builder


def built_splits(builder: RegenDataset) -> str:
    """One line naming a built dataset's split sizes and where it is."""
    splits = {k: v.num_examples for k, v in builder.info.splits.items()}
    return f"TFDS specblock_regen {splits} -> {builder.data_dir}"


def pack_example(prompt_ids: Sequence[int], response_ids: Sequence[int], max_len: int,
                 pad_id: int = PAD_ID, assistant_mask: Sequence[int] | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, loss_mask, attention_mask), each int32 [max_len], for one example.

    tokens = (prompt_ids + response_ids)[:max_len], right-padded with `pad_id`.
    attention_mask[i] = 1 where tokens[i] is a real token.
    loss_mask[i] = 1 where the NEXT token tokens[i + 1] is a real response token, i.e. the
    position whose logits predict a response token (so loss = CE(logits[i], tokens[i + 1]) * loss_mask[i]).
    Example: prompt [0, 5, 6], response [7, 8, 1], max_len 8:
        tokens         [0, 5, 6, 7, 8, 1, 2, 2]
        loss_mask      [0, 0, 1, 1, 1, 0, 0, 0]     (6->7, 7->8, 8->1 (EOS))
        attention_mask [1, 1, 1, 1, 1, 1, 0, 0]
    A prompt of max_len or more tokens leaves an all-zero loss_mask.
    With `assistant_mask` ([n_prompt + n_response], 1 at the tokens to learn: a conversation's
    assistant turns) loss_mask[i] = assistant_mask[i + 1] instead.
    """
    p = len(prompt_ids)
    n = min(p + len(response_ids), max_len)
    tokens = np.full((max_len,), pad_id, np.int32)
    tokens[:n] = np.concatenate([np.asarray(prompt_ids, np.int32), np.asarray(response_ids, np.int32)])[:n]
    attention = (np.arange(max_len) < n).astype(np.int32)
    nxt = np.arange(1, max_len + 1)  # position of the next token
    if assistant_mask is None:
        learn = nxt >= p
    else:
        learn = np.zeros(max_len, bool)
        learn[:n - 1] = np.asarray(assistant_mask, np.int32)[1:n] > 0
    loss = (learn & (nxt < n)).astype(np.int32)
    return tokens, loss, attention


class BatchIterator:
    """Fixed-shape numpy batches over a random-access source (a TFDS data source or a list).

    Each `next()` returns {"tokens", "loss_mask", "attention_mask"}: int32 [batch_size, max_len]
    (see `pack_example`). Epoch e visits the examples in `np.random.default_rng([seed, e])`
    permutation order (or in source order with shuffle=False), each exactly once.
    drop_remainder=True drops the last len % batch_size examples of the epoch's order (different
    ones each epoch); False pads the last batch with rows of pad tokens and all-zero masks.
    num_epochs=None iterates forever; otherwise StopIteration after that many epochs.
    State: `get_state()` -> {"epoch": int, "batch": int} (the next batch to produce); pass it as
    `state=` (or to `set_state`) with the same source and settings to continue exactly.
    """

    def __init__(self, source: Sequence[Mapping[str, Any]], *, batch_size: int, max_len: int,
                 seed: int = 0, shuffle: bool = True, num_epochs: int | None = None,
                 drop_remainder: bool = True, pad_id: int = PAD_ID,
                 state: Mapping[str, int] | None = None):
        self.source, self.n = source, len(source)
        if batch_size < 1 or max_len < 2:
            raise ValueError(f"need batch_size >= 1 and max_len >= 2, got {batch_size}, {max_len}")
        if self.n == 0 or (drop_remainder and self.n < batch_size):
            raise ValueError(f"{self.n} examples cannot fill a batch of {batch_size} (drop_remainder)")
        self.batch_size, self.max_len, self.seed, self.shuffle = batch_size, max_len, seed, shuffle
        self.num_epochs, self.drop_remainder, self.pad_id = num_epochs, drop_remainder, pad_id
        self.batches_per_epoch = self.n // batch_size if drop_remainder else -(-self.n // batch_size)
        self.epoch, self.batch = 0, 0
        self._order_epoch, self._order = -1, np.arange(self.n)
        if state is not None:
            self.set_state(state)

    def get_state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch": self.batch}

    def set_state(self, state: Mapping[str, int]) -> None:
        epoch, batch = int(state["epoch"]), int(state["batch"])
        if epoch < 0 or not 0 <= batch < self.batches_per_epoch:
            raise ValueError(f"invalid iterator state {dict(state)} ({self.batches_per_epoch} batches/epoch)")
        self.epoch, self.batch = epoch, batch

    def _epoch_order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:
            self._order_epoch = self.epoch
            self._order = (np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
                           if self.shuffle else np.arange(self.n))
        return self._order

    def __iter__(self) -> "BatchIterator":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.num_epochs is not None and self.epoch >= self.num_epochs:
            raise StopIteration
        idx = self._epoch_order()[self.batch * self.batch_size:(self.batch + 1) * self.batch_size]
        getitems = getattr(self.source, "__getitems__", None)
        examples = getitems(idx.tolist()) if getitems else [self.source[int(i)] for i in idx]
        shape = (self.batch_size, self.max_len)
        out = {"tokens": np.full(shape, self.pad_id, np.int32),
               "loss_mask": np.zeros(shape, np.int32), "attention_mask": np.zeros(shape, np.int32)}
        for row, ex in enumerate(examples):
            packed = pack_example(ex["prompt_ids"], ex["response_ids"], self.max_len, self.pad_id,
                                  ex.get("assistant_mask"))
            out["tokens"][row], out["loss_mask"][row], out["attention_mask"][row] = packed
        self.batch += 1
        if self.batch == self.batches_per_epoch:
            self.epoch, self.batch = self.epoch + 1, 0
        return out
