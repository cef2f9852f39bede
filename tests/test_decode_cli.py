"""`specblock-decode`: JSONL in, JSONL out, bad records skipped with reasons, resume after a kill."""

from __future__ import annotations

import json

import pytest

import specblock_jax as sbj
from infer import decode


@pytest.fixture
def tiny_ckpt(tmp_path_factory):
    tok = sbj.models.load_tokenizer("assets/tokenizer")
    cfg = sbj.models.config.tiny(vocab_size=len(tok), bos_token_id=0, eos_token_ids=(1,))
    path = tmp_path_factory.mktemp("target")
    sbj.save_target(sbj.init_target(cfg, seed=2, tokenizer=tok), path)
    return path


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_decodes_skips_bad_records_and_resumes(tiny_ckpt, tmp_path, caplog):
    prompts = tmp_path / "p.jsonl"
    good = [json.dumps({"id": f"p{i}", "prompt": f"def f{i}(x):\n    return"}) for i in range(5)]
    _write(prompts, good[:3] + [
        "{not json",
        json.dumps({"id": "e", "prompt": ""}),
        json.dumps({"id": "p0", "prompt": "dup"}),
        json.dumps({"prompt": "no id"}),
        json.dumps({"id": "long", "prompt": "x " * 700}),
    ] + good[3:])
    out = tmp_path / "out.jsonl"
    args = ["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out", str(out),
            "--max-new-tokens", "8", "--batch-size", "2"]
    # simulate a job killed after the first batch: keep its lines plus a torn partial line
    assert decode.main(args + ["--limit", "2"]) == 0
    first = out.read_text().splitlines()
    assert [json.loads(x)["id"] for x in first] == ["p0", "p1"]
    out.write_text("\n".join(first) + '\n{"id": "p2", "compl')
    caplog.clear()
    # the model allows 512 positions, so the 400-word prompt + 8 new tokens does not fit
    sbj_cfg = sbj.load_target(tiny_ckpt).config
    assert sbj_cfg.max_position_embeddings == 512
    assert decode.main(args) == 0
    text = caplog.text
    assert "line 4: invalid JSON" in text
    assert "line 5 (id 'e'): empty prompt" in text
    assert "line 6 (id 'p0'): duplicate id" in text
    assert "line 7: expected an object with 'id'" in text
    assert "line 8 (id 'long')" in text and "exceed the model's 512 positions" in text
    assert "removed a torn last line" in text
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    ids = [r["id"] for r in rows]
    assert sorted(ids) == ["p0", "p1", "p2", "p3", "p4"] and len(ids) == 5  # nothing decoded twice
    target = sbj.load_target(tiny_ckpt)
    for r in rows:
        assert len(r["token_ids"]) == r["stats"]["new_tokens"] <= 8
        assert r["completion"] == target.tokenizer.decode(r["token_ids"], skip_special_tokens=True)
    # greedy output equals the library call for the same prompt
    again = sbj.generate(target, ["def f3(x):\n    return"], max_new_tokens=8)[0]
    assert next(r for r in rows if r["id"] == "p3")["token_ids"] == again.token_ids


def test_missing_prompt_file_is_a_clear_error(tmp_path, tiny_ckpt):
    with pytest.raises(SystemExit, match="prompt file not found"):
        decode.main(["--target", str(tiny_ckpt), "--prompts", str(tmp_path / "none.jsonl"),
                     "--out", str(tmp_path / "o.jsonl")])
