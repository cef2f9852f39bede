"""Tests for the offline corpus, the shipped tokenizer and the shipped prompt sets (CPU, fast)."""

from __future__ import annotations

import ast
import functools
import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specblock_jax_cli.train.build_corpus import (SPLITS, bucket_of, build_corpus, is_test_path, read_split,
                                                  split_of, write_manifest_copy)
from specblock_jax.training.source_prompts import extract_prompts, finalize
from specblock_jax_cli.train.train_tokenizer import SPECIAL_TOKENS, to_transformers, train_bpe, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = ROOT / "assets" / "tokenizer"
PROMPTS_DIR = ROOT / "assets" / "prompts"
ROUND_TRIP_TEXTS = [
    "",
    "def f(x):\n    return x + 1\n",
    "trailing spaces   \nand tabs\t\t\n\tindented\n",
    "\n\n\n\nmany newlines\n\n\n",
    "  leading spaces and a final space ",
    "unicode: héllo wörld, 日本語, emoji 🎉🐍, combining e\u0301,",
    "zero width \u200b, nbsp\u00a0, bom \ufeff, rtl \u202e, private use \ue000.",
    "windows\r\nline\r\nends\r and a lone CR",
    "control \x00\x01\x1f\x7f chars",
    "punctuation , . ! ? and spaces before them .",
    "literal special-token text <|bos|><|eos|> <|pad|>\n<|mask|> is plain text",
]


# ----------------------------------------------------------------------------------------- corpus

def _name_in(split: str, template: str) -> str:
    """The first name from ``template.format(i)`` whose hash bucket alone says ``split``."""
    lo, hi = {"train": (0, 90), "validation": (90, 95), "heldout": (95, 100)}[split]
    names = (template.format(i) for i in range(10_000))
    return next(name for name in names if lo <= bucket_of(name) < hi)


def test_split_is_deterministic_and_pinned() -> None:
    paths = [f"pkg{i % 7}/mod_{i}.py" for i in range(5000)]
    first = [split_of(p) for p in paths]
    assert first == [split_of(p) for p in paths]
    counts = Counter(first)
    assert set(counts) == set(SPLITS)
    assert 0.87 < counts["train"] / len(paths) < 0.93
    assert 0.03 < counts["validation"] / len(paths) < 0.07
    assert 0.03 < counts["heldout"] / len(paths) < 0.07
    # The shipped assets depend on the rule: changing it would silently reshuffle them.
    assert split_of("pathlib.py") == "heldout"
    assert split_of("heapq.py") == "validation"
    assert split_of("os.py") == "train"


def test_test_files_never_heldout() -> None:
    assert is_test_path("test/test_os.py")
    assert is_test_path("unittest/test/test_case.py")
    assert is_test_path("lib2to3/tests/data/crlf.py")
    assert is_test_path("idlelib/idle_test/test_rpc.py")
    assert not is_test_path("test_foo.py")
    assert not is_test_path("contest/tests.py")
    test_paths = [f"{d}/t_{i}.py" for d in ("test", "a/tests", "idlelib/idle_test", "x/test/y")
                  for i in range(2000)]
    assert all(split_of(p) != "heldout" for p in test_paths)
    # The rule was exercised: some of these paths hash into the heldout buckets.
    moved = [p for p in test_paths if bucket_of(p) >= 95]
    assert moved and all(split_of(p) == "train" for p in moved)


def test_build_corpus_on_fake_tree(tmp_path: Path) -> None:
    root = tmp_path / "stdlib"
    good = {
        _name_in("train", "mod_{}.py"): "x = 1\n",
        _name_in("validation", "pkg/val_{}.py"): "def f():\n    return 'héllo'\n",
        _name_in("heldout", "held_{}.py"): "class A:\n    pass\n",
        _name_in("heldout", "test/test_{}.py"): "import unittest\n",  # a test file: goes to train
    }
    bad = {"bad_latin1.py": "x = 'caf\xe9'\n".encode("latin-1"), "empty.py": b"",
           "blank.py": b"  \n\n", "big.py": b"#" * 2000 + b"\n"}
    ignored = {"site-packages/pkg/mod.py": b"x = 2\n", "__pycache__/m.py": b"x = 3\n",
               "notes.txt": b"not python\n"}
    for rel, text in good.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    for rel, data in {**bad, **ignored}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)

    out = tmp_path / "corpus"
    manifest = build_corpus(out, root=root, max_bytes=1000, manifest_copy=tmp_path / "copy.json",
                            progress=False)

    for split in SPLITS:
        assert (out / f"{split}.jsonl").is_file()
    records = {s: read_split(out, s) for s in SPLITS}
    got = {r["path"]: (s, r["text"]) for s, recs in records.items() for r in recs}
    assert set(got) == set(good)
    for rel, text in good.items():
        expected_split = "train" if rel.startswith("test/") else split_of(rel)
        assert got[rel] == (expected_split, text)
    assert {s: len(r) for s, r in records.items()} == {"train": 2, "validation": 1, "heldout": 1}

    on_disk = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert on_disk == manifest
    assert json.loads((tmp_path / "copy.json").read_text(encoding="utf-8")) == manifest
    assert manifest["stdlib_root"] == str(root)
    assert manifest["files_seen"] == len(good) + len(bad)
    reasons = {s["path"]: s["reason"] for s in manifest["skipped"]}
    assert reasons == {"bad_latin1.py": "not_utf8", "empty.py": "empty", "blank.py": "empty",
                       "big.py": "too_large"}
    assert manifest["skipped_counts"] == {"empty": 2, "not_utf8": 1, "too_large": 1}
    for split in SPLITS:
        info = manifest["splits"][split]
        assert info["files"] == len(records[split])
        assert info["bytes"] == sum(len(r["text"].encode("utf-8")) for r in records[split])
        for entry in info["entries"]:
            data = good[entry["path"]].encode("utf-8")
            assert entry["sha256"] == hashlib.sha256(data).hexdigest()
            assert entry["bytes"] == len(data)

    small_path = tmp_path / "small.json"
    write_manifest_copy(manifest, small_path, max_bytes=10)
    small = json.loads(small_path.read_text(encoding="utf-8"))
    assert small["per_file_hashes_dropped"] is True
    for split in SPLITS:
        assert "entries" not in small["splits"][split]
        assert small["splits"][split]["paths"] == [e["path"] for e in
                                                   manifest["splits"][split]["entries"]]


def test_shipped_corpus_manifest() -> None:
    manifest = json.loads((ROOT / "assets" / "corpus_manifest.json").read_text(encoding="utf-8"))
    assert (ROOT / "assets" / "corpus_manifest.json").stat().st_size < 300_000
    for split in SPLITS:
        info = manifest["splits"][split]
        paths = [e["path"] for e in info["entries"]] if "entries" in info else info["paths"]
        assert info["files"] == len(paths) > 0
        assert all(split_of(p) == split or (split == "train" and is_test_path(p)) for p in paths)
    heldout = manifest["splits"]["heldout"]
    assert not any(is_test_path(e["path"]) for e in heldout.get("entries", []))


# -------------------------------------------------------------------------------------- tokenizer

@functools.lru_cache(maxsize=1)
def shipped_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR), local_files_only=True)


def _assert_round_trip(tok, text: str) -> None:
    ids = tok(text).input_ids
    assert ids[0] == tok.bos_token_id == 0
    assert ids.count(0) == 1 and tok.eos_token_id not in ids
    decoded = tok.decode(ids, skip_special_tokens=True)
    assert decoded.encode("utf-8") == text.encode("utf-8")
    plain = tok(text, add_special_tokens=False).input_ids
    assert plain == ids[1:]
    assert tok.decode(plain) == text


def test_shipped_tokenizer_specials_and_size() -> None:
    tok = shipped_tokenizer()
    assert len(tok) == 8192
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == list(SPECIAL_TOKENS)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.mask_token_id) == (0, 1, 2, 3)
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.mask_token) == SPECIAL_TOKENS
    # Nothing machine-specific is recorded in the folder.
    for path in TOKENIZER_DIR.iterdir():
        text = path.read_text(encoding="utf-8")
        for marker in ("/root/", "/home/", "/work/", "/tmp/", "site-packages"):
            assert marker not in text, f"{path.name} contains {marker!r}"
    assert sum(p.stat().st_size for p in TOKENIZER_DIR.iterdir()) < 2_000_000


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_shipped_tokenizer_round_trip(text: str) -> None:
    _assert_round_trip(shipped_tokenizer(), text)


def test_shipped_tokenizer_compresses_code() -> None:
    tok = shipped_tokenizer()
    source = (ROOT / "train" / "build_corpus.py").read_text(encoding="utf-8")
    n_tokens = len(tok(source, add_special_tokens=False).input_ids)
    assert len(source.encode("utf-8")) / n_tokens > 2.5
    assert len(tok("    return self\n", add_special_tokens=False).input_ids) <= 4


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=300))
def test_shipped_tokenizer_round_trip_property(text: str) -> None:
    _assert_round_trip(shipped_tokenizer(), text)


def test_train_tiny_tokenizer(tmp_path: Path) -> None:
    texts = ["def add(a, b):\n    return a + b\n", "class Point:\n    x: int = 0\n"] * 20
    tok = train_bpe(texts, vocab_size=300, min_frequency=2)
    assert [tok.id_to_token(i) for i in range(4)] == list(SPECIAL_TOKENS)
    assert 260 < tok.get_vocab_size() <= 300
    enc = tok.encode(texts[0])
    assert enc.ids[0] == 0
    assert len(enc.ids) - 1 < len(texts[0].encode("utf-8"))  # merges were learned
    hf = to_transformers(tok)
    hf.save_pretrained(str(tmp_path / "tok"))
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "tok"), local_files_only=True)
    for text in [*texts[:2], "ünseen ✓ text\t \n"]:
        _assert_round_trip(loaded, text)
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe(texts, vocab_size=100)


def test_train_tokenizer_from_corpus_dir(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split, n in (("train", 30), ("validation", 3), ("heldout", 0)):
        with open(corpus / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for i in range(n):
                text = f"def f_{i}(x):\n    return x * {i}\n"
                f.write(json.dumps({"path": f"m{i}.py", "text": text}) + "\n")
    report = train_tokenizer(corpus, tmp_path / "tok", vocab_size=280, progress=False)
    assert 260 < report["vocab_size"] <= 280
    assert report["train_files"] == 30
    assert report["validation"]["bytes_per_token"] > 1.0
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert "name_or_path" not in config
    assert json.loads((tmp_path / "tok" / "train_report.json").read_text()) == report


# ---------------------------------------------------------------------------------------- prompts

def _read_prompts(name: str) -> list[dict[str, str]]:
    lines = (PROMPTS_DIR / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("name,prefix,max_count", [("humaneval", "HumanEval/", 164),
                                                   ("heldout", "heldout/", 200),
                                                   ("train", "train/", 4000)])
def test_shipped_prompt_files(name: str, prefix: str, max_count: int) -> None:
    prompts = _read_prompts(name)
    assert 0 < len(prompts) <= max_count
    for p in prompts:
        assert set(p) == {"id", "prompt"}
        assert isinstance(p["id"], str) and isinstance(p["prompt"], str)
        assert p["id"].startswith(prefix)
        assert p["prompt"].strip()
    assert len({p["id"] for p in prompts}) == len(prompts)
    assert len({p["prompt"] for p in prompts}) == len(prompts)
    if name == "humaneval":
        assert len(prompts) == 164
        assert [p["id"] for p in prompts] == [f"HumanEval/{i}" for i in range(164)]
    else:
        for p in prompts:
            assert len(p["prompt"]) <= 2000
            ast.parse(p["prompt"] + "pass\n")
            last_line = p["prompt"].rsplit("\n", 1)[-1]
            assert last_line and not last_line.strip()  # ends with the body's indentation


def test_heldout_prompts_come_from_heldout_files() -> None:
    manifest = json.loads((ROOT / "assets" / "corpus_manifest.json").read_text(encoding="utf-8"))
    info = manifest["splits"]["heldout"]
    heldout_files = ({e["path"] for e in info["entries"]} if "entries" in info
                     else set(info["paths"]))
    for p in _read_prompts("heldout"):
        relpath = p["id"].removeprefix("heldout/").rsplit(":", 1)[0]
        assert relpath in heldout_files
    train_texts = {p["prompt"] for p in _read_prompts("train")}
    assert not train_texts & {p["prompt"] for p in _read_prompts("heldout")}


SOURCE = '''\
import functools


@functools.cache
def add(a: int,
        b: int = 2) -> int:
    """Add two numbers.

    Returns their sum.
    """
    return a + b


def no_doc():
    return 1


def one_line(): "Docstring on the def line."; return 2


class Box(
        object):  # a comment
    """A box."""

    size = 3

    async def fetch(self, key):
        """Fetch ``kéy`` ✓."""  # trailing comment
        return key

    def outer(self):
        def inner():
            \'\'\'Inner.\'\'\'
            return 0
        return inner
'''


def test_extract_prompts_from_source() -> None:
    found, skipped = extract_prompts(SOURCE)
    assert found == [
        (5, '@functools.cache\ndef add(a: int,\n        b: int = 2) -> int:\n'
            '    """Add two numbers.\n\n    Returns their sum.\n    """\n    '),
        (27, 'class Box(\n        object):\n    async def fetch(self, key):\n'
             '        """Fetch ``kéy`` ✓."""\n        '),
        (32, "def inner():\n    '''Inner.'''\n    "),
    ]
    assert skipped == Counter({"docstring_on_def_line": 1})
    assert extract_prompts("def broken(:\n") == ([], Counter({"syntax_error": 1}))


def test_finalize_dedups_filters_and_samples() -> None:
    raw = [{"id": f"x/{i}", "prompt": f"def f{i}():\n    "} for i in range(10)]
    raw += [{"id": "x/dup", "prompt": raw[0]["prompt"]}, {"id": "x/empty", "prompt": "  \n"},
            {"id": "x/long", "prompt": "#" * 50}]
    skipped: Counter[str] = Counter()
    kept = finalize(raw, skipped, max_chars=40)
    assert kept == raw[:10]
    assert skipped == Counter({"duplicate_prompt": 1, "empty": 1, "longer_than_40_chars": 1})
    sampled = finalize(raw, Counter(), max_chars=40, cap=4, seed=3)
    assert len(sampled) == 4
    assert sampled == finalize(raw, Counter(), max_chars=40, cap=4, seed=3)
    assert sampled == sorted(sampled, key=raw.index)
    with pytest.raises(ValueError, match="duplicate prompt id"):
        finalize([raw[0], {"id": raw[0]["id"], "prompt": "other"}], Counter(), max_chars=40)


def test_package_sources_follow_the_runtime_dependency_closure(tmp_path: Path) -> None:
    from specblock_jax_cli.train.build_corpus import TEST_ONLY_DISTRIBUTIONS, package_sources, runtime_distributions

    dists = runtime_distributions("specblock-jax")
    assert {"jax", "flax", "transformers", "numpy"} <= set(dists)
    assert not set(dists) & TEST_ONLY_DISTRIBUTIONS and "specblock-jax" not in dists  # never torch
    assert split_of(_name_in("validation", "packages/v_{}.py")) == "validation_packages"
    assert split_of(_name_in("heldout", "packages/h_{}.py")) == "heldout_packages"
    assert split_of(_name_in("train", "packages/t_{}.py")) == "train"
    full, half = package_sources(dists), package_sources(dists, share=50)
    assert set(half) < set(full) and 0.4 < len(half) / len(full) < 0.6  # a deterministic share

    root = tmp_path / "stdlib"
    root.mkdir()
    (root / "os.py").write_text("x = 1\n")
    manifest = build_corpus(tmp_path / "c", root=root, progress=False, packages_of="python-dateutil")
    assert set(manifest["distributions"]) == {"tzdata"}
    paths = {s: [r["path"] for r in read_split(tmp_path / "c", s)] for s in
             ("train", "validation", "heldout", "validation_packages", "heldout_packages")}
    assert "os.py" in paths["train"] and "packages/tzdata/__init__.py" in sum(paths.values(), [])
    assert not any(p.startswith("packages/") for s in ("validation", "heldout") for p in paths[s])
