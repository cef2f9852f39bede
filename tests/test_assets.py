"""The embedded default: the shipped target loads in both stacks with the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import specblock_jax as sbj

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "assets" / "target"


def test_assets_stay_under_40_mb():
    size = sum(f.stat().st_size for f in (ROOT / "assets").rglob("*") if f.is_file())
    assert size < 40 * 2**20, f"assets/ holds {size / 2**20:.1f} MB"


def test_shipped_target_matches_transformers_and_generates():
    from transformers import AutoModelForCausalLM

    target = sbj.load_target(TARGET)
    assert target.config.family == "qwen3" and target.tokenizer is not None
    assert json.loads((TARGET / "config.json").read_text())["dtype"] == "bfloat16"
    prompt = json.loads((ROOT / "assets/prompts/humaneval.jsonl").read_text().splitlines()[0])["prompt"]
    ids = np.asarray([target.tokenizer(prompt)["input_ids"][:64]])
    ours = np.asarray(sbj.forward(target, ids))
    model = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(torch.tensor(ids)).logits.numpy()
    assert np.abs(ours - ref).max() <= 1e-4
    res = sbj.generate(target, [prompt], max_new_tokens=24)[0]
    assert len(res.token_ids) >= 1 and res.text == target.tokenizer.decode(res.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize("kind", ["eagle3", "specblock"])
def test_shipped_drafters_are_lossless_on_the_shipped_target(kind):
    """(SpecBlock's folder predates the public branching rule: its legacy tree keys convert.)"""
    target = sbj.load_target(TARGET)
    drafter = sbj.load_drafter(ROOT / "assets" / "drafters" / kind, target)
    prompts = [json.loads(x)["prompt"] for x in (ROOT / "assets/prompts/heldout.jsonl").read_text().splitlines()[:6]]
    ar = sbj.generate(target, prompts, max_new_tokens=48, batch_size=3)
    spec = sbj.generate(target, prompts, drafter=drafter, max_new_tokens=48, batch_size=3)
    assert [s.token_ids for s in spec] == [a.token_ids for a in ar]
    assert sum(s.stats.tau for s in spec) / len(spec) > 1.5  # it is a trained drafter
