"""BlockPilot with labels priced for v5p (its provenance/, from the retired blockpilot_priced study: docs/findings.md): the priced labels
reproduce from the committed tau table and costs file, the shipped blockpilot-v5p policy gives a
request the same size alone and in a batch of 8, and its greedy output is the target's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import specblock_jax as sbj
from specblock_jax.drafters.blockpilot._labels import oracle_labels, read_labels

ROOT = Path(__file__).resolve().parents[1]
DRAFTER = ROOT / "assets" / "drafters" / "blockpilot-v5p"
# what the drafter was trained from, committed beside it (the retired benchmarks/blockpilot_priced
# study's tau table, priced costs and results, last at 52329e8; docs/findings.md summarises it)
STUDY = DRAFTER / "provenance"


def _read(name: str) -> dict:
    return json.loads((STUDY / name).read_text())


def test_priced_labels_reproduce_from_the_committed_tau_table_and_costs(tmp_path):
    """Each split's labels recomputed (tau / priced step ms, ties to the training size 8) match the
    counts and per-request sizes results.json reports, through the library's label reader given
    the costs file; the costs are those results.json was made with, and priced ones change labels."""
    table, costs, results = _read("tau.json"), _read("costs_v5p.json"), _read("results.json")
    sizes = table["sizes"]
    assert sizes == [4, 5, 6, 7, 8] and results["costs"] == costs
    assert sorted(costs["step_ms"], key=int) == [str(s) for s in sizes]
    assert all(key.startswith("phases|v5p:2x2x1|1|2048|") for key in costs["source"]["rows"].values())
    step = np.asarray([costs["step_ms"][str(s)] for s in sizes])
    for split, sp in table["splits"].items():
        tau = np.asarray(sp["tau"], np.float64)
        # tau is the committed counts' ratio: (new tokens - 1) / decoding forwards
        np.testing.assert_allclose(tau, (np.asarray(sp["new_tokens"])[:, None] - 1)
                                   / (np.asarray(sp["forwards"]) - 1), rtol=1e-12)
        labels = oracle_labels(tau / step, sizes, prefer=8)
        reported = results["splits"][split]
        assert [sizes[k] for k in labels] == reported["oracle_size"]
        assert np.bincount(labels, minlength=len(sizes)).tolist() == \
            reported["methods"]["oracle (priced labels)"]["counts"]
        # the same labels from a label folder (as `specblock-train blockpilot train --costs` reads it)
        folder = tmp_path / split
        folder.mkdir()
        for k, size in enumerate(sizes):
            (folder / f"size_{size}.jsonl").write_text("".join(
                json.dumps({"id": i, "tau": t[k]}) + "\n" for i, t in zip(sp["ids"], sp["tau"])))
        ids, got_sizes, _, got = read_labels(folder, "speed", 8, costs=STUDY / "costs_v5p.json")
        assert (ids, got_sizes, got) == (sp["ids"], sizes, labels)
    report = json.loads((DRAFTER / "report.json").read_text())
    assert report["metric"] == "speed" and report["costs"].endswith("costs_v5p.json")
    assert report["train"]["predicted_counts"] == results["splits"]["train"]["methods"]["BlockPilot-v5p"]["counts"]


@pytest.fixture(scope="module")
def shipped():
    target = sbj.load_target(ROOT / "assets" / "target")
    return target, sbj.load_drafter(DRAFTER, target)


def test_the_policy_picks_the_same_size_alone_and_in_a_batch_of_8(shipped):
    """generate's serving (one prefill per batch, the policy on its logits: stats.block_size)
    gives each of 8 HumanEval prompts the same size one at a time as in one batch of 8 (padded to
    one width), and the size compare.py reported for it."""
    from specblock_jax.prompts import encode_prompts

    target, (drafter, params) = shipped
    assert drafter.policy.sizes == (4, 5, 6, 7, 8)
    lines = (ROOT / "assets/prompts/humaneval.jsonl").read_text().splitlines()[:8]
    ids = encode_prompts(target, [json.loads(x)["prompt"] for x in lines])
    loaded = sbj.LoadedDrafter(drafter, params)
    alone = [r.stats.block_size for r in sbj.generate(target, ids, loaded, max_new_tokens=1,
                                                        options=sbj.DecodeOptions(batch_size=1))]
    batch = [r.stats.block_size for r in sbj.generate(target, ids, loaded, max_new_tokens=1,
                                                        options=sbj.DecodeOptions(batch_size=8))]
    assert alone == batch
    assert alone == _read("results.json")["splits"]["humaneval"]["policy_size"][:8]


def test_the_shipped_blockpilot_v5p_drafter_is_lossless(shipped):
    target, loaded = shipped
    lines = (ROOT / "assets/prompts/heldout.jsonl").read_text().splitlines()[:3]
    prompts = [json.loads(x)["prompt"] for x in lines]
    ar = sbj.generate(target, prompts, max_new_tokens=12, options=sbj.DecodeOptions(batch_size=4))
    spec = sbj.generate(target, prompts, sbj.LoadedDrafter(*loaded), max_new_tokens=12,
                        options=sbj.DecodeOptions(batch_size=4))
    assert [s.token_ids for s in spec] == [a.token_ids for a in ar]
    assert all(s.stats.block_size in (4, 5, 6, 7, 8) for s in spec)


def test_the_v5p_config_trains_on_the_committed_priced_costs():
    from specblock_jax.drafters.blockpilot import apply_config, parsers
    p, subparsers = parsers("x")
    apply_config(ROOT / "configs" / "drafters" / "blockpilot-v5p.yaml", subparsers)
    args = p.parse_args(["train"])
    assert (ROOT / args.costs).resolve() == STUDY / "costs_v5p.json" and args.metric == "speed"
    assert args.out == "assets/drafters/blockpilot-v5p" and args.dflash_dir == "../dflash"
    labels = p.parse_args(["labels"])
    assert labels.sizes == "4,5,6,7,8" and labels.cost_prompts == 0
