"""A user's first hour at the front door: every input checked once, with one error style
("<source>: <field>: <what is wrong> (got <value>)"), no silent garbage, and the command-line
tools exit 2 with one line for a bad argument."""

from __future__ import annotations

import json
import math

import pytest

import specblock_jax as sbj
from helpers import run_cli
from specblock_jax_cli.infer import bench, decode


@pytest.fixture(scope="module")
def target(tiny_ckpt):
    return sbj.load_target(tiny_ckpt)


@pytest.mark.parametrize("temperature", [math.nan, math.inf, -1.0, -0.5])
def test_a_temperature_that_is_not_a_finite_number_at_least_0_is_refused(target, temperature):
    with pytest.raises(ValueError, match=rf"^sampling: temperature: must be a finite number >= 0 \(got {temperature!r}\)$"):
        sbj.Sampling(temperature)
    with pytest.raises(ValueError, match=r"^sampling: temperature\[1\]: must be a finite number >= 0"):
        sbj.Sampling((0.0, temperature))


@pytest.mark.parametrize("settings, message", [
    (dict(top_p=0.0), r"sampling: top_p: must be in \(0, 1\] \(got 0.0\)"),
    (dict(top_p=1.5), r"sampling: top_p: must be in \(0, 1\] \(got 1.5\)"),
    (dict(top_k=-1), r"sampling: top_k: must be an integer >= 0 \(got -1\)"),
])
def test_top_k_and_top_p_are_checked(settings, message):
    with pytest.raises(ValueError, match=message):
        sbj.Sampling(**settings)


def test_options_are_checked_when_built():
    with pytest.raises(ValueError, match=r"options: batch_size: must be an integer >= 1 \(got 0\)"):
        sbj.DecodeOptions(batch_size=0)
    with pytest.raises(ValueError, match=r"options: refill_rows: must be an integer >= 1 \(got 0\)"):
        sbj.DecodeOptions(refill_rows=0)


def test_max_new_tokens_below_1_is_refused_naming_the_prompt(target):
    with pytest.raises(ValueError, match=r"prompt 0: max_new_tokens: must be an integer >= 1 \(got 0\)"):
        sbj.generate(target, [[1, 2]], max_new_tokens=0)
    with pytest.raises(ValueError, match=r"prompt 1: max_new_tokens: must be an integer >= 1 \(got 2.5\)"):
        sbj.generate(target, [[1, 2], [3]], max_new_tokens=[4, 2.5])


def test_a_bare_string_is_one_prompt_and_an_empty_list_gives_no_results(target):
    one = sbj.generate(target, "def a():", max_new_tokens=3)
    assert len(one) == 1 and one[0].token_ids == sbj.generate(target, ["def a():"], max_new_tokens=3)[0].token_ids
    assert sbj.generate(target, [], max_new_tokens=3) == []
    with pytest.raises(TypeError, match="prompts: expected a string or a list"):
        sbj.generate(target, 42, max_new_tokens=3)


def test_generate_takes_a_loaded_drafter_or_none(target):
    with pytest.raises(TypeError, match=r"drafter: expected a LoadedDrafter or None \(got str\); sbj.load_drafter"):
        sbj.generate(target, "x", "prompt_lookup")
    lookup = sbj.load_drafter("prompt_lookup", target, num_nodes=4)
    assert lookup.drafter.num_nodes == 4 and lookup.params == ()
    plain = sbj.generate(target, ["def a(x):"], max_new_tokens=6)
    assert sbj.generate(target, ["def a(x):"], lookup, max_new_tokens=6)[0].token_ids == plain[0].token_ids


def test_a_missing_or_corrupted_drafter_folder_is_named(target, tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'nope'}: no such drafter folder"):
        sbj.load_drafter(tmp_path / "nope", target)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{kind: x")
    with pytest.raises(ValueError, match=f"{bad / 'config.json'}: not valid JSON"):
        sbj.load_drafter(bad, target)


@pytest.mark.parametrize("flag, value, message", [
    ("--temperature", "nan", "--temperature: must be a finite number >= 0 (got nan)"),
    ("--temperature", "-1", "--temperature: must be a finite number >= 0 (got -1.0)"),
    ("--max-new-tokens", "0", "--max-new-tokens: must be an integer >= 1 (got 0)"),
    ("--top-p", "2", "--top-p: must be in (0, 1] (got 2.0)"),
    ("--batch-size", "0", "--batch-size: must be an integer >= 1 (got 0)"),
])
def test_a_bad_decode_flag_exits_2_with_one_line(tmp_path, capsys, tiny_ckpt, flag, value, message):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "x"}) + "\n")
    code, err = run_cli(decode.main, ["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out",
                                   str(tmp_path / "o.jsonl"), flag, value], capsys)
    assert code == 2 and err.splitlines()[-1] == f"specblock-decode: error: {message}"
    assert not (tmp_path / "o.jsonl").exists()  # refused before anything ran


def test_missing_paths_exit_2_naming_the_path(tmp_path, capsys, tiny_ckpt):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "x"}) + "\n")
    out = ["--out", str(tmp_path / "o.jsonl")]
    code, err = run_cli(decode.main, ["--prompts", str(tmp_path / "none.jsonl"), *out], capsys)
    assert code == 2 and f"--prompts: {tmp_path / 'none.jsonl'}: no such prompt file" in err
    code, err = run_cli(decode.main, ["--target", str(tmp_path / "no_target"), "--prompts", str(prompts), *out], capsys)
    assert code == 2 and f"--target: {tmp_path / 'no_target'}: no such checkpoint folder" in err
    code, err = run_cli(decode.main, ["--target", str(tiny_ckpt), "--prompts", str(prompts), "--method",
                                   str(tmp_path / "no_drafter"), *out], capsys)
    assert code == 2 and f"{tmp_path / 'no_drafter'}: no such drafter folder" in err
    code, err = run_cli(bench.main, ["--prompts", str(prompts), "--temperatures", "0,nan", "--out-dir",
                                  str(tmp_path / "b")], capsys)
    assert code == 2 and err == "specblock-bench: error: --temperatures: must be a finite number >= 0 (got nan)"


def test_record_errors_name_the_field_and_a_job_whose_every_record_failed_exits_1(tmp_path, capsys, tiny_ckpt):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join([json.dumps({"id": "a", "prompt": "x", "temperature": -0.5}),
                                  json.dumps({"id": "b", "prompt": "y", "max_new_tokens": 0})]) + "\n")
    args = ["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out", str(tmp_path / "o.jsonl")]
    code, err = run_cli(decode.main, args, capsys)
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [r["error"] for r in rows] == ["temperature: must be a finite number >= 0 (got -0.5)",
                                          "max_new_tokens: must be an integer >= 1 (got 0)"]
    assert code == 1 and "every record failed (2 of 2)" in err
    prompts.write_text(prompts.read_text() + json.dumps({"id": "c", "prompt": "z"}) + "\n")
    code, err = run_cli(decode.main, args + ["--max-new-tokens", "2"], capsys)
    assert code == 0  # the job resumed: the good record decoded; the two failures were reported before
