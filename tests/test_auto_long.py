"""Auto serving for long jobs (issue 41, item 3; serving/auto.py): explorations and re-checks
cost a probe, not a chunk, and stay lossless; options are ranked on measurements in the chunk's
attention bucket; drift of the served option's speed brings re-checks forward."""

from __future__ import annotations

import numpy as np
import pytest

import specblock_jax as sbj
from specblock_jax.drafters.prompt_lookup import PromptLookup
from specblock_jax.serving import AutoServe
from specblock_jax.serving.auto import Probe
from spec_drafters import RandomTreeDrafter, skewed_draft_params
from helpers_sampling import V as SAMPLING_V
from helpers_sampling import chi_square_pvalue, exact_pair_distribution, sampled_pair_counts

V = 32  # the tiny peaked target's vocabulary (conftest `target`)

PL = sbj.LoadedDrafter(PromptLookup(), ())  # prompt lookup with its (empty) weights


def _spy(monkeypatch, auto):
    """Logs every run_requests call auto makes: (chunk index, option, each request's budget)."""
    import specblock_jax.serving.auto as auto_mod

    calls, real = [], auto_mod.run_requests

    def spy(target, requests, drafter, options):
        option = "ar" if drafter is None else drafter.drafter.num_nodes
        calls.append((len(auto.events), option, [r.budget for r in requests]))
        return real(target, requests, drafter, options)

    monkeypatch.setattr(auto_mod, "run_requests", spy)
    return calls


def test_a_probe_decodes_probe_tokens_of_the_explored_option_then_the_fastest_finishes_greedy_lossless(
        target, monkeypatch):
    """Chunks of 2 requests, 9 new tokens each, probe_tokens=3: chunk 0 explores target-only (a
    whole chunk: nothing to finish with yet); chunk 1 explores budget 4 for 3 tokens, then target-only
    (the bucket's fastest) decodes the paired 3 and finishes the rest; a request that stopped
    during the probe is not continued. Outputs equal target-only decoding token for token."""
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, V, int(rng.integers(3, 11))).tolist() for _ in range(6)]  # one bucket, + 6 too
    ref = sbj.generate(target, prompts, max_new_tokens=9, options=sbj.DecodeOptions(batch_size=2, refill=False))
    stop = ref[2].token_ids[1]  # request 2 (chunk 1) stops within the probe
    ref = sbj.generate(target, prompts, max_new_tokens=9,
                       options=sbj.DecodeOptions(batch_size=2, stop_tokens=[stop], refill=False))
    auto = AutoServe(PL, budgets=(4,), chunk=2, probe_tokens=3, slow=1e-3)
    calls = _spy(monkeypatch, auto)
    res = auto.generate(target, prompts, max_new_tokens=9,
                       options=sbj.DecodeOptions(batch_size=2, stop_tokens=[stop]))
    assert [r.token_ids for r in res] == [r.token_ids for r in ref]  # greedy: lossless across segments
    assert [(e["option"], e["why"]) for e in auto.events] == [("ar", "explore"), (4, "explore"), (8, "explore")]
    assert [c[1:] for c in calls if c[0] == 0] == [("ar", [9, 9])]  # the first exploration: a whole chunk
    left = [len(ref[i].token_ids) for i in (2, 3)]
    expected = [(4, [3, 3])]  # the probe; then each request neither stopped nor done continues
    if any(n > 3 for n in left):
        expected.append(("ar", [3 for n in left if n > 3]))  # the paired segment
    if any(n > 6 for n in left):
        expected.append(("ar", [3 for n in left if n > 6]))  # the rest of each budget
    assert left[0] <= 2 and [c[1:] for c in calls if c[0] == 1] == expected
    probe = auto.events[1]["probe"]
    assert probe["rest"] == "ar" and probe["tokens"] == sum(min(3, n) for n in left)
    for n, event in enumerate(auto.events):
        mine = [r for r in res if r.stats.auto is event]
        assert event["tokens"] == sum(len(r.token_ids) for r in mine)
        assert all(r.stats.new_tokens == len(r.token_ids) for r in mine)
        if event["probe"] is not None:  # the chunk's requests share one batch: its loop time
            assert all(c[2] and max(c[2]) <= 3 for c in calls if c[0] == n and c[1] == event["option"])
            assert len({r.stats.batch for r in mine}) == 1 and event["decode_s"] == round(mine[0].stats.total_time_s, 4)
    assert auto.events[2]["probe"] is not None  # budget 8 probed too


@pytest.mark.slow
@pytest.mark.parametrize("probed,rest", [("spec", "ar"), ("ar", "spec")])
def test_sampled_output_follows_the_target_across_a_probe_boundary(small_vocab_target, probed, rest):
    """6000 3-token draws in one chunk, probe_tokens=2, `rest` already measured (the fastest) and
    `probed` not: the chunk explores `probed` by a probe, so in every draw t2 comes from the
    probed option and t3 from `rest` (target-only, or a stochastic drafter far from the target,
    continuing from prompt + t1 t2): the (t2, t3) pairs follow the target's exact distribution."""
    prompt = [1, 2, 3]
    drafter = sbj.LoadedDrafter(RandomTreeDrafter(8, SAMPLING_V, stochastic=True, max_children=4),
                                skewed_draft_params(SAMPLING_V))
    auto = AutoServe(drafter, chunk=6000, probe_tokens=2)
    auto.record("sampled", rest, "explore", 1, 300, 1.0, 0.0, bucket=16)
    counts, res = sampled_pair_counts(small_vocab_target, auto, SAMPLING_V, prompt, 6000, 1.0)
    event = auto.events[-1]
    assert (event["option"], event["why"], event["probe"]["rest"]) == (probed, "explore", rest)
    assert event["probe"]["tokens"] == 2 * 6000 and all(len(r.token_ids) == 3 for r in res)
    assert chi_square_pvalue(counts, exact_pair_distribution(small_vocab_target, prompt, 1.0)) > 1e-3
    assert chi_square_pvalue(counts, exact_pair_distribution(small_vocab_target, prompt, 1.25)) < 1e-6


def test_a_probe_credits_the_explored_option_with_its_speed_relative_to_the_fastest_on_the_same_requests():
    """A short probe is slowed by its prefill: budget 4 ran its 32 probe tokens at 80 tokens/s raw,
    below target-only's pooled 100, but target-only's paired segment on the same requests ran at
    50: budget 4 is credited 1.6 x 100 and becomes the fastest."""
    auto = AutoServe(PL, budgets=(4,), recheck_every=3)
    auto.record("greedy", "ar", "explore", 4, 100, 1.0, 0.0, bucket=64)
    event = auto.record("greedy", 4, "explore", 4, 264, 3.04, 0.0, bucket=64,
                        probe=Probe(32, 0.4, "ar", 32, 0.64, 200, 2.0))
    assert auto.speed("greedy", "ar", 64) == pytest.approx(100.0)  # its chunk and the probe's rest
    assert event["probe"]["estimate"] == pytest.approx(160.0) and auto.speed("greedy", 4, 64) == pytest.approx(160.0)
    assert auto.fastest("greedy", 64) == 4 and auto.due[("greedy", "ar")] == 1 + 1 + 3  # overtaken


def test_options_are_ranked_on_measurements_in_the_chunks_attention_bucket(monkeypatch):
    """Budget 4 ran fast on short prompts (bucket 64) and, serving a chunk with a long prompt
    (bucket 512), slower than target-only's re-check there: pooled over all buckets 4 would win
    everywhere; per bucket target-only serves long-prompt chunks and 4 short ones, and the long
    chunk does not lower 4's speed on short prompts. A bucket with no measurement yet is served by
    the fastest over all buckets. serve keys each chunk by its longest prompt's bucket."""
    auto = AutoServe(PL, budgets=(4,), recheck_every=6)
    for option, tokens in (("ar", 100), (4, 300), (8, 180)):
        assert auto.choose("greedy", bucket=64) == (option, "explore")
        auto.record("greedy", option, "explore", 4, tokens, 1.0, 0.0, bucket=64)
    assert auto.choose("greedy", bucket=512) == (4, "best")  # no measurement in 512: the fastest overall
    auto.record("greedy", 4, "best", 4, 100, 1.0, 0.0, bucket=512)
    auto.record("greedy", "ar", "recheck", 4, 120, 1.0, 0.0, bucket=512)
    assert auto.fastest("greedy") == 4  # pooled over buckets: (300 + 100) / 2 against 110 and 180
    assert auto.choose("greedy", bucket=512) == ("ar", "best") and auto.choose("greedy", bucket=64) == (4, "best")
    assert auto.speed("greedy", 4, 64) == 300.0 and auto.summary()["greedy"]["by_bucket"]["512"]["4"] == 100.0
    assert auto.choose("greedy", bucket=256) == (4, "best")  # ar and 8 wait for their re-checks
    # an option measured elsewhere with no re-check pending is explored in a new bucket
    fresh = AutoServe(PL, budgets=(4,), recheck_every=3, slow=1e-3)
    fresh.record("greedy", "ar", "explore", 4, 300, 1.0, 0.0, bucket=64)
    fresh.record("greedy", 4, "best", 4, 100, 1.0, 0.0, bucket=512)  # ar the fastest overall, 4 in 512
    assert fresh.choose("greedy", bucket=512) == (8, "explore") and fresh.choose("greedy", bucket=64) == (4, "explore")

    import specblock_jax.serving.auto as auto_mod
    from specblock_jax.decoding.job import JobSettings, Request

    def fake_serve(target, requests, drafter, options):  # 10 tokens a request in 0.1 s
        stats = lambda j: sbj.GenerationStats(1, 10, 11, 1.0, "length", None, 0.1, 0.0, 1, j)  # noqa: E731
        return [sbj.GenerationResult(None, [1] * 10, stats(j), j) for j in range(len(requests))]

    monkeypatch.setattr(auto_mod, "run_requests", fake_serve)
    served = AutoServe(PL, chunk=2)
    lengths = [3, 20, 5, 5, 300, 7]  # chunks' longest prompts: 20, 5, 300
    served.serve(None, [Request(i, [1] * n, 10, 0.0, i) for i, n in enumerate(lengths)], JobSettings(batch_size=1))
    assert [e["bucket"] for e in served.events] == [32, 16, 512]


def test_drift_of_the_served_options_speed_brings_rechecks_forward():
    """Budget 4 serves at 300 tokens/s, then from chunk 20 at 150: its chunk at 20 runs 50% below
    its pooled speed, so the re-checks due at 64 (8) and 67 (target-only) come at 24 and 25
    (20 + 1 + recheck_every, target-only first); with a threshold never reached they stay
    far off, and 8 only takes over once 4's pooled speed has fallen below its old measurement."""
    def picks(drift):
        auto = AutoServe(PL, budgets=(4,), recheck_every=3, drift=drift)
        out = []
        for n in range(40):
            option, why = auto.choose("greedy")
            out.append((option, why))
            tokens = {"ar": 100, 4: 300 if n < 20 else 150, 8: 200}[option]
            auto.record("greedy", option, why, 4, tokens, 1.0, 0.0)
        return [(n, o) for n, (o, why) in enumerate(out) if why == "recheck"], auto.events

    rechecks, events = picks(0.2)
    assert events[20]["drift"] == -0.5 and all(e["drift"] in (None, 0.0) for e in events[:20])
    assert [r for r in rechecks if r[0] >= 20][:2] == [(24, "ar"), (25, 8)]
    slow, _ = picks(10.0)
    assert [r for r in slow if r[0] >= 20] == [(31, 4)]  # 8 served, unmeasured, from when 4's pool fell
    with pytest.raises(ValueError, match="drift"):
        AutoServe(PL, drift=0.0)
