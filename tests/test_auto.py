"""Auto serving (serving/auto.py): target-only or speculation, whichever measures fastest; greedy
outputs identical to target-only, sampled outputs distributed as the target's while it switches,
and the choice rule (explore, exploit, re-check)."""

from __future__ import annotations

import numpy as np
import pytest

import specblock_jax as sbj
from specblock_jax.drafters.prompt_lookup import PromptLookup
from specblock_jax.serving import AutoServe
from spec_drafters import RandomTreeDrafter, skewed_draft_params
from helpers_sampling import V, chi_square_pvalue, exact_pair_distribution, sampled_pair_counts

PL = sbj.LoadedDrafter(PromptLookup(), ())  # prompt lookup with its (empty) weights


def _serve(auto, speed, chunks, regime="greedy", total=None):
    """Runs `chunks` choices with chunk speeds speed(option, chunk index), in a job of `total`
    chunks (None: unknown); returns (option, why)s."""
    picks = []
    for n in range(chunks):
        option, why = auto.choose(regime, remaining=None if total is None else total - n)
        picks.append((option, why))
        auto.record(regime, option, why, requests=4, tokens=int(speed(option, n)), seconds=1.0, compile_s=0.0)
    return picks


def test_the_choice_explores_every_option_then_serves_the_fastest_and_rechecks_less_and_less():
    auto = AutoServe(PL, budgets=(4,), recheck_every=3)
    assert auto.options == ["ar", 4, 8]  # prompt lookup's own budget (8 nodes) and 4
    picks = _serve(auto, lambda o, n: {"ar": 100.0, 4: 300.0, 8: 200.0}[o], 70)
    assert picks[:3] == [("ar", "explore"), (4, "explore"), (8, "explore")]
    rechecks = [(n, o) for n, (o, why) in enumerate(picks) if why == "recheck"]
    # ar, overtaken by 4 at chunk 1, is re-checked 3 chunks later; then each slower option (below
    # 0.8x the fastest) waits 4x longer after every measurement: 12, then 48 chunks
    assert rechecks == [(5, "ar"), (15, 8), (18, "ar"), (64, 8), (67, "ar")]
    assert all(o == 4 and why == "best" for n, (o, why) in enumerate(picks[3:], 3) if n not in dict(rechecks))
    assert auto.choose("sampled") == ("ar", "explore")  # regimes are measured apart
    assert auto.summary()["greedy"]["chunks"] == {"ar": 4, "4": 63, "8": 3}
    # an option within 0.8x of the fastest waits only twice as long each time: 6, 12, 24 chunks
    close = AutoServe(PL, budgets=(4,), recheck_every=3)
    picks = _serve(close, lambda o, n: {"ar": 100.0, 4: 300.0, 8: 250.0}[o], 50)
    assert [n for n, (o, why) in enumerate(picks) if o == 8 and why == "recheck"] == [9, 22, 47]
    with pytest.raises(ValueError, match="no tree budget"):
        AutoServe(sbj.LoadedDrafter(RandomTreeDrafter(6, V), ()), budgets=(4,))
    with pytest.raises(ValueError, match="slow"):
        AutoServe(PL, slow=0.0)


def test_the_choice_follows_a_speed_change_found_by_a_recheck_and_pools_recent_chunks():
    auto = AutoServe(PL, budgets=(4,), recheck_every=3, window=2)
    # target-only becomes the fastest from chunk 10 on: its re-check at chunk 18 finds it, and it
    # serves from then on; 4, overtaken, is re-checked 3 chunks later and loses again. Its first
    # chunk served as the fastest (900 tokens/s against its pooled 500) drifts: 8's re-check, due
    # at 64, comes at 23 (19 + 1 + 3) instead
    speed = lambda o, n: {"ar": 100.0 if n < 10 else 900.0, 4: 300.0, 8: 200.0}[o]  # noqa: E731
    picks = _serve(auto, speed, 30)
    assert picks[18] == ("ar", "recheck") and picks[19:22] == [("ar", "best")] * 3
    assert auto.events[19]["drift"] == 0.8 and picks[22:24] == [(4, "recheck"), (8, "recheck")]
    assert all(p == ("ar", "best") for p in picks[24:30])
    # the speed pools the last `window` chunks: tokens over seconds
    auto.record("greedy", 8, "recheck", 4, 100, 2.0, 0.0)
    auto.record("greedy", 8, "recheck", 4, 500, 3.0, 0.0)
    assert auto.speed("greedy", 8) == 600 / 5.0


def test_a_larger_budget_than_a_losing_one_waits_unexplored_and_no_recheck_comes_near_the_end():
    speed = lambda o, n: {"ar": 300.0, 4: 100.0, 8: 200.0}[o]  # noqa: E731
    auto = AutoServe(PL, budgets=(4,), recheck_every=3)
    picks = _serve(auto, speed, 20)
    # 4 ran below 0.8x target-only, so 8 is not explored: it waits 12 chunks (4 x recheck_every)
    # from chunk 2, as 4 does after its measurement at chunk 1; both are re-checked at 14 and 15
    assert picks[:3] == [("ar", "explore"), (4, "explore"), ("ar", "best")]
    assert [(n, o) for n, (o, why) in enumerate(picks) if why == "recheck"] == [(14, 4), (15, 8)]
    assert all(p == ("ar", "best") for n, p in enumerate(picks[2:], 2) if n not in (14, 15))
    # a job of 18 chunks: the re-check at 14 has 3 chunks after it, the one at 15 only 2 (skipped)
    picks = _serve(AutoServe(PL, budgets=(4,), recheck_every=3), speed, 18, total=18)
    assert [(n, o) for n, (o, why) in enumerate(picks) if why == "recheck"] == [(14, 4)]
    picks = _serve(AutoServe(PL, budgets=(4,), recheck_every=3), speed, 16, total=16)
    assert [o for o, why in picks] == ["ar", 4] + ["ar"] * 14


def test_auto_decides_from_the_requests_it_holds_not_from_later_calls(monkeypatch):
    """A server knows its queue, not what comes after it: a call's chunks are chosen the same
    whether or not another call follows, and near the call's end no re-check is made (too few
    queued chunks would gain from it) even when the next call then re-checks first thing."""
    import specblock_jax.serving.auto as auto_mod
    from specblock_jax.decoding.job import JobSettings, Request

    def fake_serve(target, requests, drafter, options):  # 10 tokens a request, target-only slower
        seconds = 10 / (100.0 if drafter is None else 300.0)
        stats = lambda j: sbj.GenerationStats(1, 10, 11, 1.0, "length", None, seconds, 0.0, 1, j)  # noqa: E731
        return [sbj.GenerationResult(None, [1] * 10, stats(j), j) for j in range(len(requests))]

    monkeypatch.setattr(auto_mod, "run_requests", fake_serve)
    call = [Request(i, [1, 2], 10, 0.0, i) for i in range(6)]

    def choices(auto, start=0):
        return [(e["option"], e["why"]) for e in auto.events[start:]]

    alone, followed = (AutoServe(PL, chunk=1, recheck_every=2) for _ in range(2))
    alone.serve(None, call, JobSettings(batch_size=1))
    followed.serve(None, call, JobSettings(batch_size=1))
    followed.serve(None, call, JobSettings(batch_size=1))
    # "ar", overtaken at chunk 1, is due again at chunk 4: 2 chunks queued there, too few
    assert choices(alone) == choices(followed)[:6] == [("ar", "explore"), (8, "explore")] + [(8, "best")] * 4
    assert choices(followed, 6)[0] == ("ar", "recheck")  # the next call holds 6 chunks


@pytest.mark.slow
def test_auto_greedy_output_is_target_only_and_every_chunk_is_logged(small_vocab_target):
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, V, rng.integers(2, 12)).tolist() for _ in range(18)]
    budgets = [4 + 5 * (i % 4) for i in range(18)]
    # slow=1e-3: no budget counts as losing, so each is explored (its skipping is tested above)
    auto = AutoServe(PL, budgets=(4,), chunk=4, recheck_every=2, slow=1e-3)
    temps = [0.0] * 12 + [1.0] * 6
    ar = sbj.generate(small_vocab_target, prompts[:12], max_new_tokens=budgets[:12],
                      options=sbj.DecodeOptions(batch_size=2))
    res = auto.generate(small_vocab_target, prompts, max_new_tokens=budgets,
                       sampling=sbj.Sampling(temps), options=sbj.DecodeOptions(batch_size=2))
    assert [r.token_ids for r in res[:12]] == [r.token_ids for r in ar]
    assert [r.index for r in res] == list(range(18)) and all(len(r.token_ids) == b for r, b in zip(res, budgets))
    greedy = [e for e in auto.events if e["regime"] == "greedy"]
    assert [e["option"] for e in greedy[:3]] == ["ar", 4, 8] and len(greedy) == 3  # 12 requests, chunks of 4
    assert [e["requests"] for e in auto.events if e["regime"] == "sampled"] == [4, 2]
    assert all(r.stats.auto["regime"] == ("greedy" if i < 12 else "sampled") for i, r in enumerate(res))
    assert sum(e["tokens"] for e in auto.events) == sum(budgets)


@pytest.mark.slow
def test_auto_measures_the_decode_loops_not_the_step_profiling(small_vocab_target):
    """A chunk's seconds are its decode loops' wall time (compilation excluded): with
    profile="all" (as specblock-bench runs) the phase timing outside the loops does not count."""
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, V, rng.integers(2, 12)).tolist() for _ in range(10)]
    auto = AutoServe(PL, budgets=(4,), chunk=2, slow=1e-3)
    res = auto.generate(small_vocab_target, prompts, max_new_tokens=8,
                       options=sbj.DecodeOptions(batch_size=2, profile="all"))
    assert len(auto.events) == 5
    for n, event in enumerate(auto.events):
        mine = [r for r in res if r.stats.auto is event]
        loops = sum({r.stats.batch: r.stats.total_time_s for r in mine}.values())
        assert event["decode_s"] == round(loops, 4) and event["requests"] == len(mine)
        # each option's step is profiled in its first chunk only (chunks 3 and 4 repeat an option)
        assert all((r.stats.step_profile is not None) == (n < 3) for r in mine)


@pytest.mark.slow
def test_auto_sampling_follows_the_target_distribution_while_switching(small_vocab_target):
    """6000 draws in chunks of 1000: target-only and speculation with a stochastic drafter far from
    the target both serve chunks; the pooled (t2, t3) pairs match the target's exact distribution."""
    prompt = [1, 2, 3]
    drafter = sbj.LoadedDrafter(RandomTreeDrafter(8, V, stochastic=True, max_children=4), skewed_draft_params(V))
    auto = AutoServe(drafter, chunk=1000, recheck_every=2)
    counts, res = sampled_pair_counts(small_vocab_target, auto, V, prompt, 6000, 1.0)
    served = {e["option"] for e in auto.events}
    assert served == {"ar", "spec"} and len(auto.events) == 6  # both options served chunks
    exact = exact_pair_distribution(small_vocab_target, prompt, 1.0)
    assert chi_square_pvalue(counts, exact) > 1e-3
    assert chi_square_pvalue(counts, exact_pair_distribution(small_vocab_target, prompt, 1.25)) < 1e-6


def test_auto_method_string_resolves_and_refuses_ar(tmp_path):
    target = sbj.init_target(sbj.models.config.tiny(vocab_size=16), seed=0)
    auto = sbj.serving.resolve_method("auto:prompt_lookup:num_nodes=6", target).auto
    assert isinstance(auto, AutoServe) and auto.options == ["ar", 3, 6]
    with pytest.raises(ValueError, match="needs a drafter method"):
        sbj.serving.resolve_method("auto:ar", target)
