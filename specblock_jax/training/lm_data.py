"""Language-model data: tokenise a corpus split, cache the ids, pack them into fixed-length windows.

A corpus split is `<corpus_dir>/<split>.jsonl`, one `{"path", "text"}` record per line. Each record
becomes BOS + tokens + EOS (the tokenizer prepends BOS; we append EOS) and the records are
concatenated in file order into one flat id stream, cached as `<cache_dir>/<split>-<tokhash>.npy`
(uint16; keyed by split and a hash of the tokenizer files so a new tokenizer never reads stale ids).

Packing: window i is `ids[i*seq_len : i*seq_len + seq_len + 1]` (seq_len + 1 ids, consecutive windows
share one id), so inputs = window[:-1] and next-token targets = window[1:] cover every id once.

A batch is {"tokens": inputs [B, seq_len], "labels": next-token targets [B, seq_len]} int32.
`BatchIterator` walks the windows in a per-epoch permutation drawn from (seed, epoch); its whole
state is the two ints (epoch, index), which a checkpoint stores to resume exactly (it is a data
iterator of `training.trainer.train`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from tqdm import tqdm

from specblock_jax.jsonl import parse_lines

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def tokenizer_hash(tokenizer_dir: str | Path) -> str:
    """First 12 hex digits of the sha256 over the tokenizer's files (names and bytes)."""
    h = hashlib.sha256()
    found = False
    for name in _TOKENIZER_FILES:
        f = Path(tokenizer_dir) / name
        if f.exists():
            h.update(name.encode() + b"\0" + f.read_bytes())
            found = True
    if not found:
        raise FileNotFoundError(f"{tokenizer_dir}: no tokenizer files ({', '.join(_TOKENIZER_FILES)})")
    return h.hexdigest()[:12]


def read_texts(path: Path) -> list[str]:
    """The `text` field of every record of a JSONL file, with errors naming the bad line."""
    texts = []
    with open(path, encoding="utf-8") as f:
        for n, rec, bad_json in parse_lines(f):
            if bad_json is not None:
                raise ValueError(f"{path}:{n}: not valid JSON ({bad_json})")
            if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                raise ValueError(f"{path}:{n}: record has no string field 'text'")
            texts.append(rec["text"])
    if not texts:
        raise ValueError(f"{path}: no records")
    return texts


def tokenize_texts(texts: list[str], tokenizer, chunk: int = 64, desc: str = "tokenise") -> np.ndarray:
    """Flat uint16 ids [N]: for each text BOS + ids + EOS, concatenated in order."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    if bos is None or eos is None:
        raise ValueError("the tokenizer must define bos_token_id and eos_token_id")
    if len(tokenizer) > np.iinfo(np.uint16).max + 1:
        raise ValueError(f"vocabulary of {len(tokenizer)} ids does not fit uint16")
    parts: list[np.ndarray] = []
    with tqdm(total=len(texts), desc=desc, unit="file") as bar:
        for start in range(0, len(texts), chunk):
            batch = texts[start:start + chunk]
            for ids in tokenizer(batch, add_special_tokens=True)["input_ids"]:
                if not ids or ids[0] != bos:
                    ids = [bos] + list(ids)
                parts.append(np.asarray(list(ids) + [eos], np.uint16))
            bar.update(len(batch))
    return np.concatenate(parts)


def load_split_ids(
    corpus_dir: str | Path,
    split: str,
    tokenizer_dir: str | Path,
    cache_dir: str | Path = "data/tokens",
) -> np.ndarray:
    """The split's flat id stream [N] uint16, from the .npy cache or tokenised (and cached) now."""
    cache = Path(cache_dir) / f"{split}-{tokenizer_hash(tokenizer_dir)}.npy"
    if cache.exists():
        return np.load(cache)
    source = Path(corpus_dir) / f"{split}.jsonl"
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist (build it with train/build_corpus.py)")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    ids = tokenize_texts(read_texts(source), tokenizer, desc=f"tokenise {split}")
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp.npy")
    np.save(tmp, ids)
    tmp.replace(cache)
    return ids


def pack(ids: np.ndarray, seq_len: int) -> np.ndarray:
    """Windows [W, seq_len + 1] (a strided view, no copy); window i starts at i * seq_len."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    n = (len(ids) - 1) // seq_len
    if n < 1:
        raise ValueError(f"{len(ids)} ids are too few for one window of {seq_len + 1}")
    s = ids.strides[0]
    return np.lib.stride_tricks.as_strided(ids, (n, seq_len + 1), (seq_len * s, s), writeable=False)


def as_batch(windows: np.ndarray) -> dict[str, np.ndarray]:
    """Windows [B, seq_len + 1] -> {"tokens": [B, seq_len], "labels": [B, seq_len]} int32."""
    w = np.asarray(windows, np.int32)
    return {"tokens": w[:, :-1], "labels": w[:, 1:]}


class BatchIterator:
    """Deterministic, resumable batches (`as_batch`) over packed windows.

    Epoch e visits windows in `default_rng((seed, e)).permutation(W)`, in batches of `batch_size`
    (the last partial batch of an epoch is dropped). `get_state()` -> {"epoch", "index"} where index
    is the next batch within the epoch; `BatchIterator(..., **state)` continues exactly from there.
    """

    def __init__(self, windows: np.ndarray, batch_size: int, seed: int, epoch: int = 0, index: int = 0):
        if batch_size < 1 or batch_size > len(windows):
            raise ValueError(f"batch_size={batch_size} must lie in [1, {len(windows)} windows]")
        self.windows, self.batch_size, self.seed = windows, batch_size, seed
        self.batches_per_epoch = len(windows) // batch_size
        if not (epoch >= 0 and 0 <= index <= self.batches_per_epoch):
            raise ValueError(f"bad iterator state epoch={epoch} index={index} "
                             f"({self.batches_per_epoch} batches per epoch)")
        self.epoch, self.index = epoch, index
        self._order = self._permutation(epoch)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng((self.seed, epoch)).permutation(len(self.windows))

    def get_state(self) -> dict[str, int]:
        return {"epoch": int(self.epoch), "index": int(self.index)}

    def __iter__(self) -> "BatchIterator":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.index >= self.batches_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
            self._order = self._permutation(self.epoch)
        rows = self._order[self.index * self.batch_size:(self.index + 1) * self.batch_size]
        self.index += 1
        return as_batch(self.windows[rows])


def eval_batches(windows: np.ndarray, batch_size: int, num_batches: int) -> list[dict[str, np.ndarray]]:
    """The first num_batches batches (`as_batch`) in file order (a fixed evaluation set); fewer if
    the split is smaller."""
    n = min(num_batches, len(windows) // batch_size)
    if n < 1:
        raise ValueError(f"{len(windows)} windows are too few for one batch of {batch_size}")
    return [as_batch(windows[i * batch_size:(i + 1) * batch_size]) for i in range(n)]
