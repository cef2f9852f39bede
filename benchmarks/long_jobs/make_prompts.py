"""Builds the two long jobs' prompt files from local files only (issue 41, item 1):

- `assets/prompts/shift_sympy.jsonl`: the domain-shift job. 1,024 windows of whole lines (about 400
  characters, cut anywhere in a file: the rule of `specblock_jax.training.source_prompts.windows`) from the
  non-test sources of the installed `sympy` package, a distribution that is not in the corpus
  (`assets/corpus_manifest_v2.json` lists the 79 that are; the script checks it is not one of them).
  Symbolic mathematics is a domain the target and its drafters never trained on, and the windows
  are a prompt format they never trained on either. Ids `sympy/<relpath>:<first line>`. Built
  from sympy 1.14.0 (another version cuts other windows; the script prints what it wrote).
- `assets/prompts/indomain.jsonl`: the in-domain job. Every signature + docstring prompt
  (`source_prompts.extract_prompts`, at most 2,000 characters, deduplicated by text) of the
  corpus's held-out standard-library files (the paths `corpus_manifest_v2.json` lists under
  `splits.heldout`, read from the installed standard library it names), minus any prompt whose
  text is in `assets/prompts/train.jsonl`. Ids `heldout/<relpath>:<def line>` (the ids of
  `heldout.jsonl`, whose 200 prompts are a sample of these).

New tokens, as `specblock-bench --max-new-tokens 128` runs them (the budget every study here uses;
greedy decoding by the v2 target never stops early on these prompt kinds): shift 1,024 x 128 =
131,072; in-domain 524 x 128 = 67,072 (the counts the run prints; `tests/test_long_jobs.py` checks
the shipped files against these floors: 100k and 50k).

    .venv/bin/python benchmarks/long_jobs/make_prompts.py      # writes both files (a few seconds)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
from collections import Counter
from pathlib import Path

from specblock_jax.training import source_prompts

ROOT = Path(__file__).resolve().parents[2]

MANIFEST = ROOT / "assets" / "corpus_manifest_v2.json"
SHIFT_PACKAGE = "sympy"
SHIFT_COUNT = 1024
MAX_NEW_TOKENS = 128
MIN_SHIFT_TOKENS, MIN_INDOMAIN_TOKENS = 100_000, 50_000
MAX_CHARS = 2000


def package_sources(dist: str) -> list[dict[str, str]]:
    """{"path", "text"} of every non-test .py file of an installed distribution, path order."""
    files = importlib.metadata.distribution(dist).files or []
    out = []
    for f in sorted(files, key=str):
        parts = Path(str(f)).parts
        if f.suffix != ".py" or {"tests", "test", "testing"} & set(parts):
            continue
        text = Path(f.locate()).read_text(encoding="utf-8", errors="strict")
        if text.strip():
            out.append({"path": str(f), "text": text})
    return out


def shift_prompts(manifest: dict, count: int = SHIFT_COUNT) -> list[dict[str, str]]:
    """`count` windows of the shift package's sources (window_prompts' rule and seed)."""
    if SHIFT_PACKAGE in {d.lower() for d in manifest["distributions"]}:
        raise SystemExit(f"{SHIFT_PACKAGE} is in the corpus ({MANIFEST}): not a domain shift")
    records = package_sources(SHIFT_PACKAGE)
    found = source_prompts.windows(records, count, where=SHIFT_PACKAGE)
    return [{"id": SHIFT_PACKAGE + "/" + p["id"].removeprefix("windows/"), "prompt": p["prompt"]} for p in found]


def indomain_prompts(manifest: dict, train_path: Path) -> list[dict[str, str]]:
    """Every signature + docstring prompt of the held-out standard-library files not in train."""
    root = Path(manifest["stdlib_root"])
    train = {json.loads(line)["prompt"] for line in open(train_path, encoding="utf-8")}
    skipped: Counter[str] = Counter()
    raw = []
    for rel in manifest["splits"]["heldout"]["paths"]:
        found, why = source_prompts.extract_prompts((root / rel).read_text(encoding="utf-8"))
        skipped.update(why)
        raw.extend({"id": f"heldout/{rel}:{n}", "prompt": p} for n, p in found)
    kept = [p for p in source_prompts.finalize(raw, skipped, MAX_CHARS) if p["prompt"] not in train]
    print(f"in-domain: {len(kept)} prompts of {len(raw)} found; skipped {dict(skipped)}")
    return kept


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "assets" / "prompts"))
    args = p.parse_args(argv)
    manifest = json.loads(MANIFEST.read_text())
    shift = shift_prompts(manifest)
    indomain = indomain_prompts(manifest, ROOT / "assets" / "prompts" / "train.jsonl")
    for name, prompts, floor in (("shift_sympy", shift, MIN_SHIFT_TOKENS),
                                 ("indomain", indomain, MIN_INDOMAIN_TOKENS)):
        tokens = len(prompts) * MAX_NEW_TOKENS
        if tokens < floor:
            raise SystemExit(f"{name}: {len(prompts)} prompts x {MAX_NEW_TOKENS} = {tokens} new tokens < {floor}")
        path = Path(args.out) / f"{name}.jsonl"
        source_prompts.write_jsonl(path, prompts)
        print(f"{path}: {len(prompts)} prompts, {tokens:,} new tokens at max_new_tokens={MAX_NEW_TOKENS}, "
              f"{path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
