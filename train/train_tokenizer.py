"""Train the project's byte-level BPE tokenizer on the corpus train split.

The tokenizer is a ``tokenizers`` BPE model with a ByteLevel pre-tokenizer and decoder
(``add_prefix_space=False``, ``trim_offsets=False``), no normalizer and no unknown token, so any
text round-trips byte-exactly. The vocabulary (``vocab_size`` in total) starts with four special
tokens at fixed ids::

    0 <|bos|>   1 <|eos|>   2 <|pad|>   3 <|mask|>   (mask: reserved for the diffusion drafter)

followed by the 256 byte symbols and the learned merges. A TemplateProcessing post-processor
prepends ``<|bos|>`` to every single sequence (``tokenizer(text).input_ids[0] == 0``) and to both
parts of a pair; EOS is never added automatically. Decoding with ``skip_special_tokens=True`` gives
the input text back exactly (``clean_up_tokenization_spaces`` is off).

The result is saved as a ``transformers`` fast tokenizer folder that
``AutoTokenizer.from_pretrained(out, local_files_only=True)`` loads offline, plus
``train_report.json`` (vocab size, corpus sizes, bytes per token on the validation split).

Usage::

    python -m train.train_tokenizer --corpus data/corpus --out assets/tokenizer --vocab-size 8192
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tqdm import tqdm

from .build_corpus import read_split

log = logging.getLogger(__name__)

BOS, EOS, PAD, MASK = "<|bos|>", "<|eos|>", "<|pad|>", "<|mask|>"
SPECIAL_TOKENS: tuple[str, ...] = (BOS, EOS, PAD, MASK)
DEFAULT_VOCAB_SIZE = 8192


def _texts(records: Iterable[dict[str, str]], progress: bool) -> Iterator[str]:
    for rec in tqdm(records, desc="tokenizer training", unit="file", disable=not progress):
        yield rec["text"]


def train_bpe(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE,
              min_frequency: int = 2, length: int | None = None) -> Tokenizer:
    """Train a raw ``tokenizers.Tokenizer`` (byte-level BPE, specials at ids 0..3) on ``texts``.

    ``vocab_size`` counts everything: special tokens, the 256 byte symbols and merges. A corpus
    too small to reach it yields a smaller vocabulary.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size {vocab_size} < {len(SPECIAL_TOKENS) + 256} "
                         "(4 special tokens + 256 byte symbols)")
    tok = Tokenizer(models.BPE())
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=length)
    for i, name in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(name) != i:
            raise RuntimeError(f"special token {name} got id {tok.token_to_id(name)}, expected {i}")
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS}:1 $B:1",
        special_tokens=[(BOS, bos)],
    )
    return tok


def to_transformers(tok: Tokenizer) -> Any:
    """Wrap a raw tokenizer as a ``transformers`` fast tokenizer with the special roles set."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS, eos_token=EOS, pad_token=PAD, mask_token=MASK,
        clean_up_tokenization_spaces=False,
        # special tokens are inserted by id only; their literal text in input is plain text,
        # so any string round-trips byte for byte (and user text cannot inject control tokens)
        split_special_tokens=True,
        padding_side="right",
        model_max_length=1 << 20,
    )


def bytes_per_token(tok: Tokenizer, texts: Iterable[str]) -> dict[str, float]:
    """UTF-8 bytes per token over ``texts`` (no special tokens counted)."""
    n_bytes = n_tokens = 0
    for text in texts:
        n_bytes += len(text.encode("utf-8"))
        n_tokens += len(tok.encode(text, add_special_tokens=False).ids)
    return {"bytes": n_bytes, "tokens": n_tokens,
            "bytes_per_token": n_bytes / n_tokens if n_tokens else 0.0}


def train_tokenizer(corpus_dir: str | Path, out_dir: str | Path,
                    vocab_size: int = DEFAULT_VOCAB_SIZE, min_frequency: int = 2,
                    progress: bool = True) -> dict[str, Any]:
    """Train on ``<corpus_dir>/train.jsonl``, save a transformers tokenizer folder to ``out_dir``.

    Returns the report also written to ``<out_dir>/train_report.json``.
    """
    train = read_split(corpus_dir, "train")
    if not train:
        raise ValueError(f"{corpus_dir}/train.jsonl has no records")
    tok = train_bpe(_texts(train, progress), vocab_size=vocab_size,
                    min_frequency=min_frequency, length=len(train))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf = to_transformers(tok)
    hf.save_pretrained(str(out))
    # Nothing machine-specific may be saved: drop a recorded source path if transformers wrote one.
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if config.pop("name_or_path", None) is not None:
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                               encoding="utf-8")
    report: dict[str, Any] = {
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "requested_vocab_size": vocab_size,
        "min_frequency": min_frequency,
        "special_tokens": {name: i for i, name in enumerate(SPECIAL_TOKENS)},
        "adds_bos": True,
        "adds_eos": False,
        "tokenizers_version": tokenizers.__version__,
        "trained_with_python": platform.python_version(),
        "train_files": len(train),
        "train": bytes_per_token(tok, (r["text"] for r in train)),
    }
    try:
        validation = read_split(corpus_dir, "validation")
        report["validation"] = bytes_per_token(tok, (r["text"] for r in validation))
    except FileNotFoundError:
        log.warning("no validation split in %s: bytes per token not measured", corpus_dir)
    (out / "train_report.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    log.info("tokenizer saved to %s: %s", out, json.dumps(report))
    return report


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="data/corpus", help="corpus dir (build_corpus output)")
    parser.add_argument("--out", default="assets/tokenizer", help="output tokenizer folder")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    parser.add_argument("--min-frequency", type=int, default=2)
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    train_tokenizer(args.corpus, args.out, vocab_size=args.vocab_size,
                    min_frequency=args.min_frequency, progress=not args.quiet)


if __name__ == "__main__":
    main()
