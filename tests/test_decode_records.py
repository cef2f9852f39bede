"""`specblock-decode`'s records as a new user meets them (issue 64, the second trial): rows carry
their settings and a resume with others is refused; a non-UTF-8 byte is an error row; results and
errors told apart, ids keep their JSON type, output in input order; --strict; the API and the CLI
agree on empty and over-long prompts; `specblock-bench` names itself in its errors."""

from __future__ import annotations

import json
import re

import pytest

import specblock_jax as sbj
from helpers import run_cli
from specblock_jax_cli.infer import bench, decode

RESULT_FIELDS = {"text", "token_ids", "stats", "settings"}


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _rows(out):
    return [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]


def test_rows_carry_their_settings_and_a_resume_with_other_settings_exits_2(tiny_ckpt, tmp_path, capsys):
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out.jsonl"
    _write(prompts, [json.dumps({"id": "a", "prompt": "def f(x):"}),
                     json.dumps({"id": "b", "prompt": "import os", "temperature": 0.5, "max_new_tokens": 3})])
    args = ["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out", str(out), "--max-new-tokens", "4"]
    assert run_cli(decode.main, args, capsys)[0] == 0
    rows = _rows(out)
    assert rows[0]["settings"] == {"method": "ar", "target": str(tiny_ckpt), "top_k": 0, "top_p": 1.0, "seed": 0,
                                   "chat": None, "max_new_tokens": 4, "temperature": 0.0}
    assert rows[1]["settings"] | {"max_new_tokens": 4, "temperature": 0.0} == rows[0]["settings"]
    assert (rows[1]["settings"]["max_new_tokens"], rows[1]["settings"]["temperature"]) == (3, 0.5)
    before = out.read_text()
    for other in (["--max-new-tokens", "8"], ["--temperature", "1"], ["--method", "prompt_lookup"],
                  ["--seed", "3"], ["--top-k", "5"]):
        code, err = run_cli(decode.main, args + other, capsys)
        assert code == 2 and len(err.splitlines()) == 1, (other, err)
        assert err.startswith(f"specblock-decode: error: --out: {out} holds record 'a' decoded with other settings (")
        assert "--new-file" in err
        assert out.read_text() == before  # refused before anything was written
    code, err = run_cli(decode.main, args + ["--max-new-tokens", "8"], capsys)
    assert "max_new_tokens 4 there, 8 here" in err
    assert run_cli(decode.main, args, capsys)[0] == 0 and out.read_text() == before  # the same settings resume
    assert run_cli(decode.main, args + ["--max-new-tokens", "6", "--new-file"], capsys)[0] == 0
    assert [(r["id"], r["settings"]["max_new_tokens"]) for r in _rows(out)] == [("a", 6), ("b", 3)]
    # a file written without settings (an older specblock-decode) is not resumed either
    _write(out, [json.dumps({"id": "a", "text": "", "token_ids": [], "stats": {}})])
    code, err = run_cli(decode.main, args, capsys)
    assert code == 2 and "no settings recorded there" in err


def test_a_non_utf8_byte_becomes_an_error_row_naming_its_line(tiny_ckpt, tmp_path, capsys):
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out.jsonl"
    prompts.write_bytes(b'{"id": "a", "prompt": "def f(x):"}\n{"id": "b", "prompt": "caf\xe9"}\n'
                        b'{"id": "c", "prompt": "import os"}\n')
    code, err = run_cli(decode.main, ["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out", str(out),
                                   "--max-new-tokens", "3"], capsys)
    assert code == 0 and "1 of 3 records failed" in err
    rows = _rows(out)
    assert rows[1] == {"id": None, "line": 2, "error": "not UTF-8 text (byte 0xe9 at column 27)"}
    assert [r["id"] for r in rows] == ["a", None, "c"] and RESULT_FIELDS <= set(rows[2])


def test_results_and_errors_apart_ids_keep_their_type_and_the_output_is_in_input_order(tiny_ckpt, tmp_path, capsys):
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out.jsonl"
    _write(prompts, [json.dumps({"id": 7, "prompt": "def long_function_name(first, second, third):"}),
                     json.dumps({"id": "7", "prompt": "x"}),  # another id than 7
                     json.dumps({"id": 7, "prompt": "y"}),  # a duplicate of line 1
                     json.dumps({"id": "e", "prompt": ""}),
                     json.dumps({"id": [1, 2], "prompt": "import os"})])
    args = ["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out", str(out), "--max-new-tokens", "3",
            "--batch-size", "1"]
    assert run_cli(decode.main, args, capsys)[0] == 0
    rows = _rows(out)
    assert [r["id"] for r in rows] == [7, "7", 7, "e", [1, 2]]  # input order, each id its JSON type
    assert [r.get("error") for r in rows] == [None, None, "duplicate id", "empty prompt", None]
    for r in rows:  # an error row has no result fields, a result row no error field
        assert set(r) == ({"id", "line", "error"} if "error" in r else {"id"} | RESULT_FIELDS)
    target = sbj.load_target(tiny_ckpt)
    assert rows[0]["token_ids"] == sbj.generate(target, [json.loads(prompts.read_text().splitlines()[0])["prompt"]],
                                                max_new_tokens=3)[0].token_ids
    before = out.read_text()
    assert run_cli(decode.main, args, capsys)[0] == 0 and out.read_text() == before  # the duplicate reported once


def test_a_job_with_failed_records_exits_0_and_with_strict_1(tiny_ckpt, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    _write(prompts, [json.dumps({"id": "a", "prompt": "x"}), "{not json", json.dumps({"id": "b", "prompt": "y"})])
    args = ["--target", str(tiny_ckpt), "--prompts", str(prompts), "--max-new-tokens", "2"]
    code, err = run_cli(decode.main, args + ["--out", str(tmp_path / "o1.jsonl")], capsys)
    assert code == 0 and err.splitlines()[-1].startswith("specblock-decode: 1 of 3 records failed")
    code, err = run_cli(decode.main, args + ["--out", str(tmp_path / "o2.jsonl"), "--strict"], capsys)
    assert code == 1 and err.splitlines()[-1].startswith("specblock-decode: 1 of 3 records failed")
    code, err = run_cli(decode.main, args + ["--out", str(tmp_path / "o1.jsonl"), "--strict"], capsys)
    assert code == 1  # a resumed job counts the failures already in its file


def test_the_api_and_the_cli_agree_on_empty_and_over_long_prompts(tiny_ckpt, tmp_path, capsys):
    target = sbj.load_target(tiny_ckpt)
    limit = target.config.max_position_embeddings
    long = "x " * limit
    n_long = len(target.tokenizer(long)["input_ids"])
    over = f"{n_long} prompt tokens + max_new_tokens=4 exceed the cache limit of {limit} tokens"
    with pytest.raises(ValueError, match="^prompt 1: empty prompt$"):
        sbj.generate(target, ["def f():", ""], max_new_tokens=4)
    with pytest.raises(ValueError, match="^prompt 1: empty prompt$"):
        sbj.generate(target, [[5], []], max_new_tokens=4)
    with pytest.raises(ValueError, match=f"^prompt 2: {re.escape(over)}$"):
        sbj.generate(target, ["a", "b", long], max_new_tokens=4)
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out.jsonl"
    _write(prompts, [json.dumps({"id": "ok", "prompt": "def f():"}), json.dumps({"id": "empty", "prompt": ""}),
                     json.dumps({"id": "long", "prompt": long})])
    code, err = run_cli(decode.main, ["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out", str(out),
                                   "--max-new-tokens", "4"], capsys)
    assert code == 0
    assert [(r["id"], r.get("error")) for r in _rows(out)] == [("ok", None), ("empty", "empty prompt"), ("long", over)]


def test_bench_names_itself_in_its_method_errors(tiny_ckpt, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    _write(prompts, [json.dumps({"id": "a", "prompt": "x"})])
    code, err = run_cli(bench.main, ["--target", str(tiny_ckpt), "--prompts", str(prompts), "--methods",
                                  "prompt_lookup:bogus=1", "--out-dir", str(tmp_path / "b"), "--max-new-tokens", "2",
                                  "--rounds", "1", "--warmup-prompts", "0", "--no-compile-cache"], capsys)
    assert code == 2
    assert err.splitlines()[-1].startswith(
        "specblock-bench: error: --methods: method 'prompt_lookup:bogus=1': ")
