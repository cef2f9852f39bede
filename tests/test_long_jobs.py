"""The long jobs of issue 41 (benchmarks/long_jobs/): the shipped prompt files parse, have unique
ids, reach their sizes in new tokens and fit the target's cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "assets" / "prompts"
MAX_NEW_TOKENS = 128  # the budget the long-job runs use (benchmarks/long_jobs/make_prompts.py)
# (file, id prefix, least new tokens at MAX_NEW_TOKENS)
JOBS = [("shift_sympy.jsonl", "sympy/", 100_000), ("indomain.jsonl", "heldout/", 50_000)]


def _records(name: str) -> list[dict]:
    with open(PROMPTS / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("name,prefix,least", JOBS)
def test_a_long_job_file_parses_has_unique_ids_and_reaches_its_size(name, prefix, least):
    records = _records(name)
    assert (PROMPTS / name).stat().st_size <= 2 * 1024 * 1024
    assert all(set(r) == {"id", "prompt"} and r["id"].startswith(prefix) and r["prompt"].strip()
               for r in records)
    assert len({r["id"] for r in records}) == len(records)
    assert len({r["prompt"] for r in records}) == len(records)
    assert len(records) * MAX_NEW_TOKENS >= least
    train = {r["prompt"] for r in _records("train.jsonl")}
    assert not train & {r["prompt"] for r in records}  # never a training prompt


def test_every_long_job_prompt_fits_the_target_with_its_budget():
    import specblock_jax as sbj

    tok = sbj.models.load_tokenizer(str(ROOT / "assets" / "tokenizer"))
    limit = json.loads((ROOT / "assets" / "target" / "config.json").read_text())["max_position_embeddings"]
    for name, _, _ in JOBS:
        lengths = [len(tok(r["prompt"])["input_ids"]) for r in _records(name)]
        assert max(lengths) + MAX_NEW_TOKENS <= limit, name
