"""Drafter training data: regeneration CLI (skips, resume, greedy parity), the specblock_regen TFDS
builder (build and read back without TensorFlow) and the resumable batch iterator."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import tensorflow_datasets as tfds

import specblock_jax as sbj
from specblock_jax.prompts import encode_prompts
from specblock_jax.training import BatchIterator, RegenDataset, build_tfds, pack_example
from specblock_jax.training.regen_dataset import is_validation
from specblock_jax_cli.train import regenerate

MAX_NEW = 8


def _lines(path):
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def test_regenerate_skips_bad_input_resumes_and_matches_generate(tiny_ckpt, tmp_path, caplog):
    good = {f"p{i}": f"def f{i}(x):\n    \"\"\"Return {i} times x.\"\"\"\n" for i in range(5)}
    rows = [json.dumps({"id": k, "prompt": v}) for k, v in good.items()]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(rows[:2] + [
        "{not json",
        json.dumps({"id": "empty", "prompt": ""}),
        json.dumps({"id": "p0", "prompt": "a duplicate id"}),
        json.dumps({"prompt": "no id"}),
        json.dumps({"id": "long", "prompt": "x " * 700}),  # > 512 - MAX_NEW positions
    ] + rows[2:]) + "\n", encoding="utf-8")
    out = tmp_path / "regen"
    args = ["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out", str(out),
            "--max-new-tokens", str(MAX_NEW), "--batch-size", "2", "--seed", "5"]

    assert regenerate.main(args + ["--limit", "2"]) == 0
    first = _lines(out / "greedy.jsonl")
    assert sorted(r["id"] for r in first) == ["p0", "p1"]
    assert sorted(r["id"] for r in _lines(out / "sampled.jsonl")) == ["p0", "p1"]
    # a kill while writing greedy.jsonl: one full line and a torn second one
    text = (out / "greedy.jsonl").read_text(encoding="utf-8").splitlines()
    (out / "greedy.jsonl").write_text(text[0] + "\n" + text[1][:25], encoding="utf-8")

    caplog.clear()
    caplog.set_level(logging.INFO)
    assert regenerate.main(args) == 0
    log = caplog.text
    assert "line 3: invalid JSON" in log
    assert "line 4 (id 'empty'): empty prompt" in log
    assert "line 5 (id 'p0'): duplicate id" in log
    assert "line 6: expected an object with 'id'" in log
    assert "line 7 (id 'long')" in log and "exceed the model's 512 positions" in log
    assert "removed a torn last line" in log
    assert "greedy: 4 prompts to generate, 1 already done" in log
    assert "sampled: 3 prompts to generate, 2 already done" in log

    target = sbj.load_target(tiny_ckpt)
    greedy = sbj.generate(target, list(good.values()), max_new_tokens=MAX_NEW)
    eos = target.config.eos_token_ids
    by_mode = {}
    for mode in ("greedy", "sampled"):
        recs = _lines(out / f"{mode}.jsonl")
        ids = [r["id"] for r in recs]
        assert sorted(ids) == sorted(good) and len(ids) == len(set(ids))  # no duplicates
        by_mode[mode] = {r["id"]: r for r in recs}
        for r in recs:
            assert r["mode"] == mode and r["prompt"] == good[r["id"]]
            assert r["prompt_ids"] == encode_prompts(target, [good[r["id"]]])[0]
            assert r["response"] == target.tokenizer.decode(r["response_ids"], skip_special_tokens=True)
            if r["finish_reason"] == "stop":
                assert r["response_ids"][-1] in eos and len(r["response_ids"]) <= MAX_NEW
            else:
                assert r["finish_reason"] == "length" and len(r["response_ids"]) == MAX_NEW
    for i, key in enumerate(good):  # greedy records equal a direct sbj.generate call
        assert by_mode["greedy"][key]["response_ids"] == greedy[i].token_ids
    assert any(by_mode["sampled"][k]["response_ids"] != by_mode["greedy"][k]["response_ids"] for k in good)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["valid_prompts"] == 5 and summary["skipped"] == 5
    for mode in ("greedy", "sampled"):
        s, recs = summary["modes"][mode], by_mode[mode].values()
        assert s["records"] == 5 and sum(s["finish_reasons"].values()) == 5
        assert s["mean_response_tokens"] == pytest.approx(np.mean([len(r["response_ids"]) for r in recs]))

    # a finished job only (re)builds the TFDS dataset of its records
    assert regenerate.main(args + ["--tfds-dir", str(tmp_path / "tfds")]) == 0
    built = tfds.data_source("specblock_regen", data_dir=str(tmp_path / "tfds"))
    assert sum(len(s) for s in built.values()) == 10

    with pytest.raises(SystemExit, match="other settings"):  # never mix settings in one folder
        regenerate.main(args[:-2] + ["--seed", "6"])


def _write_regen_folder(folder, n_ids: int = 150):
    """greedy.jsonl and sampled.jsonl by hand: example (i, mode) has distinctive token ids."""
    folder.mkdir()
    expected = {}
    for m, mode in enumerate(("greedy", "sampled")):
        lines = []
        for i in range(n_ids):
            rec = {"id": f"id{i}", "mode": mode, "prompt": "p", "response": "r",
                   "prompt_ids": [0, 10 + i % 50] * (1 + i % 3),
                   "response_ids": [100 + i, 4000 + m, 1][: 1 + i % 3],
                   "finish_reason": "stop"}
            expected[(rec["id"], mode)] = rec
            lines.append(json.dumps(rec))
        lines.append(lines[0])  # a repeated record is kept once
        text = "\n".join(lines) + "\n" + ('{"id": "torn", "mo' if mode == "sampled" else "")
        (folder / f"{mode}.jsonl").write_text(text, encoding="utf-8")
    return expected


def _examples(source):
    out = {}
    for ex in (source[i] for i in range(len(source))):
        key = (ex["id"].decode(), ex["mode"].decode())
        assert key not in out
        assert ex["prompt_ids"].dtype == np.int32 and ex["response_ids"].dtype == np.int32
        out[key] = (ex["prompt_ids"].tolist(), ex["response_ids"].tolist())
    return out


def test_tfds_builder_builds_and_reads_back(tmp_path):
    expected = _write_regen_folder(tmp_path / "regen")
    data_dir = tmp_path / "tfds"
    builder = RegenDataset(data_dir=str(data_dir), source_dir=tmp_path / "regen")
    builder.download_and_prepare()
    val_ids = {k for k in expected if is_validation(k[0])}
    assert 0 < len(val_ids) < len(expected) // 10  # ~2%, both modes of an id together
    assert {i for i, _ in val_ids} == {i for i, _ in expected if is_validation(i)}
    for source in (builder.as_data_source(), tfds.data_source("specblock_regen", data_dir=str(data_dir))):
        got_train, got_val = _examples(source["train"]), _examples(source["validation"])
        assert set(got_val) == val_ids and set(got_train) == set(expected) - val_ids
        for key, (prompt, response) in {**got_train, **got_val}.items():
            assert prompt == expected[key]["prompt_ids"] and response == expected[key]["response_ids"]
    assert builder.info.splits["train"].num_examples == len(expected) - len(val_ids)

    # the built dataset feeds the iterator: one padded epoch sees every training example once
    train = tfds.data_source("specblock_regen", data_dir=str(data_dir))["train"]
    seen = []
    for batch in BatchIterator(train, batch_size=32, max_len=12, num_epochs=1, drop_remainder=False):
        for row in range(32):
            if batch["attention_mask"][row].any():
                seen.append(tuple(batch["tokens"][row][batch["attention_mask"][row] == 1]))
    assert sorted(seen) == sorted(tuple((p + r)[:12]) for p, r in _examples(train).values())

    # more regenerated records: build_tfds rebuilds (download_and_prepare alone would reuse the old)
    with (tmp_path / "regen" / "greedy.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps({"id": "new", "mode": "greedy", "prompt_ids": [0, 3], "response_ids": [1]}) + "\n")
    rebuilt = build_tfds(tmp_path / "regen", data_dir).as_data_source()
    assert sum(len(s) for s in rebuilt.values()) == len(expected) + 1
    assert _examples(rebuilt["validation" if is_validation("new") else "train"])[("new", "greedy")] == ([0, 3], [1])


def test_pack_example_by_hand():
    tokens, loss, attn = pack_example([0, 5, 6], [7, 8, 1], max_len=8)
    assert tokens.tolist() == [0, 5, 6, 7, 8, 1, 2, 2]
    assert loss.tolist() == [0, 0, 1, 1, 1, 0, 0, 0]  # positions whose next token is a response token
    assert attn.tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    tokens, loss, attn = pack_example([0, 5, 6], [7, 8, 1], max_len=4)  # truncated
    assert tokens.tolist() == [0, 5, 6, 7] and loss.tolist() == [0, 0, 1, 0] and attn.tolist() == [1] * 4
    tokens, loss, attn = pack_example([0, 5, 6, 9], [7], max_len=3)  # no response left
    assert tokens.tolist() == [0, 5, 6] and loss.tolist() == [0, 0, 0] and attn.tolist() == [1, 1, 1]
    assert all(x.dtype == np.int32 for x in pack_example([0], [1], max_len=2))


def _toy_source(n: int):
    """Example i: prompt [0, 10 + i], response [500 + i, 1]; tokens[:, 2] identifies it."""
    return [{"prompt_ids": [0, 10 + i], "response_ids": [500 + i, 1]} for i in range(n)]


def _ids(batch):
    return [int(t) - 500 for t, a in zip(batch["tokens"][:, 2], batch["attention_mask"][:, 0]) if a]


def test_iterator_epochs_shuffle_padding_and_coverage():
    src = _toy_source(10)
    padded = list(BatchIterator(src, batch_size=4, max_len=6, seed=1, num_epochs=2, drop_remainder=False))
    assert len(padded) == 6  # ceil(10 / 4) per epoch
    for epoch in (padded[:3], padded[3:]):
        assert sorted(sum((_ids(b) for b in epoch), [])) == list(range(10))
    last = padded[2]
    assert last["tokens"].shape == (4, 6) and last["tokens"].dtype == np.int32
    assert (last["tokens"][2:] == 2).all()  # two padding rows: pad tokens, nothing attended or learned
    assert not last["attention_mask"][2:].any() and not last["loss_mask"][2:].any()
    assert sum((_ids(b) for b in padded[:3]), []) != sum((_ids(b) for b in padded[3:]), [])  # reshuffled

    dropped = list(BatchIterator(src, batch_size=4, max_len=6, seed=1, num_epochs=2))
    assert len(dropped) == 4
    ep0 = sum((_ids(b) for b in dropped[:2]), [])
    assert len(set(ep0)) == 8 and ep0 == sum((_ids(b) for b in padded[:2]), [])

    again = list(BatchIterator(src, batch_size=4, max_len=6, seed=1, num_epochs=2, drop_remainder=False))
    other = list(BatchIterator(src, batch_size=4, max_len=6, seed=2, num_epochs=2, drop_remainder=False))
    assert all(all((a[k] == b[k]).all() for k in a) for a, b in zip(padded, again))  # same seed, same batches
    assert [_ids(b) for b in other] != [_ids(b) for b in padded]
    ordered = list(BatchIterator(src, batch_size=5, max_len=6, shuffle=False, num_epochs=1))
    assert [_ids(b) for b in ordered] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    b = ordered[0]
    assert b["tokens"][0].tolist() == [0, 10, 500, 1, 2, 2]
    assert b["loss_mask"][0].tolist() == [0, 1, 1, 0, 0, 0]
    assert b["attention_mask"][0].tolist() == [1, 1, 1, 1, 0, 0]


def test_iterator_resumes_exactly_from_saved_state():
    src = _toy_source(11)
    ref = BatchIterator(src, batch_size=3, max_len=5, seed=7)  # infinite, 3 batches per epoch
    full = [next(ref) for _ in range(8)]
    it = BatchIterator(src, batch_size=3, max_len=5, seed=7)
    for _ in range(4):
        next(it)
    state = json.loads(json.dumps(it.get_state()))  # plain ints survive a checkpoint
    assert state == {"epoch": 1, "batch": 1}
    resumed = BatchIterator(src, batch_size=3, max_len=5, seed=7, state=state)
    for want in full[4:]:
        got = next(resumed)
        assert all((got[k] == want[k]).all() for k in want)
    with pytest.raises(ValueError, match="invalid iterator state"):
        BatchIterator(src, batch_size=3, max_len=5, state={"epoch": 0, "batch": 3})
