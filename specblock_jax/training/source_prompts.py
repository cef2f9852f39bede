"""Prompts from Python sources: a function's signature and docstring (the model completes the
body), windows of whole lines, and the checks every prompt set passes (`finalize`). Prompts are
``{"id", "prompt"}`` dicts; `write_jsonl` writes a set.

Used by `specblock-*`'s prompt-set builder (train/build_prompts.py) and by study scripts that build
prompt sets from other sources (benchmarks/long_jobs/make_prompts.py).
"""

from __future__ import annotations

import ast
import io
import json
import random
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

DEFAULT_SEED = 0
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


def windows(records: Iterable[dict], count: int, chars: int = 400, seed: int = DEFAULT_SEED,
            where: str = "the records") -> list[Prompt]:
    """`count` windows of whole lines (at most `chars` characters, at least a quarter of that) from
    source files ({"path", "text"} records): a file drawn uniformly, then a start line uniformly
    within it. Ids are ``windows/<path>:<first line>``."""
    files = [r for r in records if len(r["text"]) > 2 * chars]
    if not files:
        raise ValueError(f"{where}: no file longer than {2 * chars} characters")
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
        raise ValueError(f"{where}: found only {len(out)} distinct windows of {count}")
    return out


def write_jsonl(path: str | Path, prompts: list[Prompt]) -> None:
    """Write prompts as JSONL (UTF-8, one ``{"id", "prompt"}`` object per line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for p in prompts:
            f.write(json.dumps({"id": p["id"], "prompt": p["prompt"]}, ensure_ascii=False) + "\n")
