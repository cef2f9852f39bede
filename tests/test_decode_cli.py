"""`specblock-decode`: JSONL in/out, error records, per-record settings, methods, resume after kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import specblock_jax as sbj
from helpers import export_random_eagle3
from specblock_jax.serving import methods
from specblock_jax_cli.infer import decode


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _rows(out):
    return [json.loads(x) for x in out.read_text().splitlines()]


def test_decodes_writes_error_records_and_resumes(tiny_ckpt, tmp_path, caplog):
    prompts = tmp_path / "p.jsonl"
    good = [json.dumps({"id": f"p{i}", "prompt": f"def f{i}(x):\n    return"}) for i in range(5)]
    _write(prompts, good[:3] + [
        "{not json",
        json.dumps({"id": "e", "prompt": ""}),
        json.dumps({"id": "p0", "prompt": "dup"}),
        json.dumps({"prompt": "no id"}),
        json.dumps({"id": "long", "prompt": "x " * 700}),  # > 512 positions with the budget
        json.dumps({"id": "bad", "prompt": "x", "max_new_tokens": -3}),
    ] + good[3:] + [json.dumps({"id": "own", "prompt": "import os", "max_new_tokens": 3, "temperature": 0.5})])
    out = tmp_path / "out.jsonl"
    args = ["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out", str(out),
            "--max-new-tokens", "8", "--batch-size", "2"]
    # a job stopped after two records, with a torn partial line at the end
    assert decode.main(args + ["--limit", "2"]) == 0
    assert [r["id"] for r in _rows(out)] == ["p0", "p1"]
    out.write_text(out.read_text() + '{"id": "p2", "te')
    assert decode.main(args) == 0
    assert "removed a torn last line" in caplog.text
    rows = _rows(out)
    errors = {r["line"]: r["error"] for r in rows if "error" in r}
    assert errors == {
        4: "invalid JSON (Expecting property name enclosed in double quotes)",
        5: "empty prompt", 6: "duplicate id",
        7: "expected an object with 'id' and a string 'prompt' (or 'messages')",
        8: errors[8], 9: "max_new_tokens: must be an integer >= 1 (got -3)"}
    assert errors[8].endswith("prompt tokens + max_new_tokens=8 exceed the cache limit of 512 tokens")
    done = [r for r in rows if "error" not in r]
    assert sorted(r["id"] for r in done) == ["own", "p0", "p1", "p2", "p3", "p4"]  # each once
    target = sbj.load_target(tiny_ckpt)
    for r in done:
        assert len(r["token_ids"]) == r["stats"]["new_tokens"] <= (3 if r["id"] == "own" else 8)
        assert r["text"] == target.tokenizer.decode(r["token_ids"], skip_special_tokens=True)
        assert {"target_forwards", "tau", "draft_time_s", "total_time_s"} <= set(r["stats"])
    again = sbj.generate(target, ["def f3(x):\n    return"], max_new_tokens=8)[0]
    assert next(r for r in done if r["id"] == "p3")["token_ids"] == again.token_ids
    # a third run finds everything done and writes nothing
    before = out.read_text()
    assert decode.main(args) == 0
    assert out.read_text() == before


def test_prompt_lookup_method_gives_the_same_greedy_output(tiny_ckpt, tmp_path):
    prompts = tmp_path / "p.jsonl"
    _write(prompts, [json.dumps({"id": str(i), "prompt": "a = 1\nb = 2\n" * (i + 1)}) for i in range(4)])
    outs = {}
    for method in ("ar", "prompt_lookup"):
        outs[method] = tmp_path / f"{method}.jsonl"
        decode.main(["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out", str(outs[method]),
                     "--max-new-tokens", "12", "--method", method])
    ar = {r["id"]: r["token_ids"] for r in _rows(outs["ar"])}
    pl = {r["id"]: r["token_ids"] for r in _rows(outs["prompt_lookup"])}
    assert ar == pl


def test_bad_arguments_are_clear_errors(tmp_path, tiny_ckpt, capsys):
    with pytest.raises(SystemExit) as exit_:
        decode.main(["--target", str(tiny_ckpt), "--prompts", str(tmp_path / "none.jsonl"),
                     "--out", str(tmp_path / "o.jsonl")])
    assert exit_.value.code == 2 and "no such prompt file" in capsys.readouterr().err
    (tmp_path / "p.jsonl").write_text('{"id": 1, "prompt": "x"}\n')
    with pytest.raises(SystemExit) as exit_:
        decode.main(["--target", str(tiny_ckpt), "--prompts", str(tmp_path / "p.jsonl"),
                     "--out", str(tmp_path / "o.jsonl"), "--method", "medusa"])
    assert exit_.value.code == 2 and "expected one of" in capsys.readouterr().err


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_yields_every_record_exactly_once(tiny_ckpt, tmp_path):
    prompts = tmp_path / "p.jsonl"
    n = 24
    _write(prompts, [json.dumps({"id": f"r{i}", "prompt": f"def g{i}():\n"}) for i in range(n)])
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "specblock_jax_cli.infer.decode", "--target", str(tiny_ckpt),
           "--prompts", str(prompts), "--out", str(out), "--max-new-tokens", "64", "--batch-size", "4",
           "--method", "prompt_lookup"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 3):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = len(out.read_text().splitlines())
    assert 3 <= killed_at < n, "the job must be killed mid-run for this test to mean anything"
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ids = [r["id"] for r in _rows(out)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(n)) and len(ids) == n


@pytest.mark.slow
def test_refill_and_fixed_batches_write_the_same_records(tiny_ckpt, tmp_path):
    prompts = tmp_path / "p.jsonl"
    _write(prompts, [json.dumps({"id": f"r{i}", "prompt": "def f(x):\n" * (1 + i % 5),
                                 "max_new_tokens": 4 + 5 * (i % 4)}) for i in range(10)])
    rows = {}
    for flags in ([], ["--no-refill"]):
        out = tmp_path / f"out{len(rows)}.jsonl"
        assert decode.main(["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out", str(out),
                            "--batch-size", "4", "--method", "prompt_lookup", *flags]) == 0
        rows[len(rows)] = {r["id"]: r["token_ids"] for r in _rows(out)}
    assert rows[0] == rows[1] and len(rows[0]) == 10
    assert max(r["stats"]["batch"] for r in _rows(tmp_path / "out0.jsonl")) > 2  # refilled, not 3 batches


def test_a_drafter_folder_is_a_method(tiny_ckpt, tmp_path):
    export_random_eagle3(tiny_ckpt, tmp_path / "eagle3")
    prompts = tmp_path / "p.jsonl"
    _write(prompts, [json.dumps({"id": str(i), "prompt": f"def h{i}(a, b):\n"}) for i in range(3)])
    outs = {}
    for method in ("ar", str(tmp_path / "eagle3"), f"{tmp_path / 'eagle3'}:num_nodes=6:top_k=3"):
        outs[method] = tmp_path / f"{len(outs)}.jsonl"
        assert decode.main(["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out",
                            str(outs[method]), "--max-new-tokens", "10", "--method", method]) == 0
    a, *others = (_rows(p) for p in outs.values())
    for b in others:
        assert [r["token_ids"] for r in a] == [r["token_ids"] for r in b]


def test_method_overrides_parse_and_reach_the_drafter(tiny_ckpt, capsys):
    assert methods.parse_method("prompt_lookup:num_nodes=5:max_ngram=2") == (
        "prompt_lookup", {"num_nodes": 5, "max_ngram": 2})
    assert methods.parse_method("d:rank_tree=false:scale=0.5:name=x") == (
        "d", {"rank_tree": False, "scale": 0.5, "name": "x"})
    target = sbj.load_target(tiny_ckpt)
    assert methods.resolve_method("prompt_lookup:num_nodes=5", target).loaded.drafter.num_nodes == 5
    with pytest.raises(ValueError, match="not key=value"):
        methods.parse_method("prompt_lookup:num_nodes")
    with pytest.raises(ValueError, match="unexpected keyword"):
        methods.resolve_method("prompt_lookup:nodes=5", target)
    with pytest.raises(ValueError, match="ar takes no settings"):
        methods.check_method("ar:x=1")
    with pytest.raises(SystemExit) as exit_:
        decode.cli_method("ar:x=1")
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == "specblock-decode: error: --method: method 'ar:x=1': ar takes no settings"


@pytest.mark.slow
def test_adaptation_flags_keep_outputs_and_save_the_adapted_drafter(tiny_ckpt, tmp_path):
    target = export_random_eagle3(tiny_ckpt, tmp_path / "eagle3")
    prompts = tmp_path / "p.jsonl"
    _write(prompts, [json.dumps({"id": str(i), "prompt": f"def h{i}(a, b):\n"}) for i in range(4)])
    assert methods.split_adapt("d:num_nodes=6:adapt.cost_scale=0:adapt.subset=layer") == (
        "d:num_nodes=6", "cost_scale=0,subset=layer")
    assert methods.split_adapt("d:adapt=false") == ("d", None)
    common = ["--target", str(tiny_ckpt), "--prompts", str(prompts), "--max-new-tokens", "10",
              "--batch-size", "1"]
    assert decode.main(common + ["--out", str(tmp_path / "plain.jsonl"), "--method", str(tmp_path / "eagle3")]) == 0
    assert decode.main(common + ["--out", str(tmp_path / "adapt.jsonl"), "--method",
                                 f"{tmp_path / 'eagle3'}:adapt.cost_scale=0:adapt.min_rows=1:adapt.eval_rows=1:adapt.steps=1:adapt.window=32",
                                 "--adapt-save", str(tmp_path / "adapted")]) == 0
    plain, adapted = _rows(tmp_path / "plain.jsonl"), _rows(tmp_path / "adapt.jsonl")
    assert [r["token_ids"] for r in plain] == [r["token_ids"] for r in adapted]
    assert sum(r["stats"]["adapt"]["update"] for r in adapted) == 3  # every boundary with work left
    before = sbj.load_drafter(str(tmp_path / "eagle3"), target)[1]["draft"]["fc"]
    after = sbj.load_drafter(str(tmp_path / "adapted"), target)[1]["draft"]["fc"]
    state = json.loads((tmp_path / "adapt.jsonl.adapter" / "state.json").read_text())
    assert len(state["events"]) == 4  # the adapter's whole state is kept with the job
    # a resumed job loads the state and continues: half the job, then the rest
    method = f"{tmp_path / 'eagle3'}:adapt.cost_scale=0:adapt.min_rows=1:adapt.eval_rows=1:adapt.steps=1:adapt.window=32"
    assert decode.main(common + ["--out", str(tmp_path / "half.jsonl"), "--method", method, "--limit", "2"]) == 0
    assert len(json.loads((tmp_path / "half.jsonl.adapter" / "state.json").read_text())["events"]) == 2
    assert decode.main(common + ["--out", str(tmp_path / "half.jsonl"), "--method", method]) == 0
    resumed = json.loads((tmp_path / "half.jsonl.adapter" / "state.json").read_text())
    assert len(resumed["events"]) == 4 and [e["batch"] for e in resumed["events"]] == [0, 1, 2, 3]
    assert [r["token_ids"] for r in _rows(tmp_path / "half.jsonl")] == [r["token_ids"] for r in plain]
    assert not np.array_equal(np.asarray(before), np.asarray(after))
    with pytest.raises(SystemExit, match="no trainable drafter"):
        decode.main(common + ["--out", str(tmp_path / "x.jsonl"), "--method", "prompt_lookup", "--adapt"])
