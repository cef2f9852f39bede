"""Step profile (decoding/step_profile.py), the draft time `generate` derives from it, and the
bench's derived numbers (ideal speedup, step-weighted phase times)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import specblock_jax as sbj
from specblock_jax.decoding import step_profile as sp
from specblock_jax.decoding.compiled import cached_count, compilation_count
from specblock_jax.models.kv_cache import cache_length
from specblock_jax.decoding.loop import make_loop
from specblock_jax.drafters.eagle3._train import Eagle3Task
from specblock_jax.drafters.prompt_lookup._model import PromptLookup
from specblock_jax_cli.infer import bench

V = 8
PHASE_KEYS = {f"{ph}_ms" for ph in sp.PHASES}


@pytest.fixture(scope="module")
def eagle3(target):
    task = Eagle3Task({"num_nodes": 4, "top_k": 2, "depth": 2}, target)
    return task.decoding_drafter(task.init_params(jax.random.key(0)))


def _batch():
    tokens = jnp.zeros((2, 16), jnp.int32).at[0, :5].set(jnp.arange(1, 6)).at[1, :3].set(jnp.asarray([4, 5, 6]))
    return tokens, jnp.asarray([5, 3], jnp.int32)


def _spec(target, drafter, max_new, greedy=True):
    """The loop `generate` runs for a batch of prompt bucket 16."""
    n = 0 if drafter is None else drafter.num_nodes
    return make_loop(graphdef=target.graphdef, cfg=target.config, drafter=drafter,
                     cache_len=cache_length(16, max_new, n), max_new=max_new, greedy=greedy)


def test_every_phase_is_timed_and_a_second_call_compiles_nothing(target, eagle3):
    tokens, lengths = _batch()
    max_new = 12
    inputs = sp.default_inputs(tokens, lengths, max_new=max_new)
    ar = sp.step_profile(_spec(target, None, max_new), target.params, (), inputs)
    assert {k for k in ar if k.endswith("_ms")} == {"forward_1_ms"} and ar["forward_1_ms"] > 0
    assert (ar["batch"], ar["prompt_len"], ar["num_nodes"], ar["length"]) == (2, 16, 0, max_new // 2)
    for drafter, params in ((PromptLookup(num_nodes=4), ()), eagle3):
        cache_len = cache_length(16, max_new, drafter.num_nodes)
        for greedy in ((False, True) if isinstance(drafter, PromptLookup) else (True,)):
            prof = sp.step_profile(_spec(target, drafter, max_new, greedy), target.params, params,
                                   sp.default_inputs(tokens, lengths, max_new=max_new, greedy=greedy))
            assert {k for k in prof if k.endswith("_ms")} == PHASE_KEYS
            assert all(prof[k] > 0 for k in PHASE_KEYS), prof
            assert prof["num_nodes"] == drafter.num_nodes and prof["cache_len"] == cache_len
    before = compilation_count()
    again = sp.step_profile(_spec(target, eagle3.drafter, max_new), target.params, eagle3.params, inputs)
    assert compilation_count() == before and again == prof  # the greedy profile, cached
    sp._MEASURED.clear()  # timed again from scratch: the executables were released once timed
    held = cached_count()
    fresh = sp.step_profile(_spec(target, eagle3.drafter, max_new), target.params, eagle3.params, inputs)
    assert compilation_count() > before and all(fresh[k] > 0 for k in PHASE_KEYS)
    assert cached_count() == held  # nothing of the profile stays cached
    with pytest.raises(ValueError, match="unknown phases"):
        sp.step_profile(_spec(target, eagle3.drafter, max_new), target.params, eagle3.params, inputs,
                        phases=("draft",))


def test_the_drafter_state_is_advanced_to_mid_decode(target, eagle3):
    """The state the phases run on: caches, history and the drafter's `length` moved by max_new // 2."""
    drafter, params = eagle3
    tokens, lengths = _batch()
    args = (target.params, params, sp.default_inputs(tokens, lengths, max_new=12))
    s = sp._compiled(sp.mid_decode_state, (_spec(target, drafter, 12),), *args)(*args)
    assert s.cache.lengths.tolist() == [11, 9] and s.drafter_state.length.tolist() == [11, 9]
    assert s.hist_len.tolist() == [12, 10] and sp._context(s).cache_len.tolist() == [11, 9]
    assert s.history[0, :6].tolist() == [1, 2, 3, 4, 5, int(s.root[0])]  # prompt, then the first token
    assert not bool(jnp.any(s.done))


def test_ideal_speedup_arithmetic():
    # tau 3 x 1.5 ms per target-only token / (2 ms tree forward + 0.5 ms verification) = 1.8
    assert sp.ideal_speedup(3.0, 1.5, 2.0, 0.5) == pytest.approx(1.8)
    assert sp.ideal_speedup(1.0, 1.0, 1.0, 0.0) == 1.0  # one node, free verification: no gain
    assert sp.draft_seconds_per_step({"propose_ms": 2.0, "update_ms": 0.5}) == pytest.approx(0.0025)
    assert sp.draft_seconds_per_step({"forward_1_ms": 1.0}) == 0.0


def test_bench_weights_each_shape_by_its_decoding_steps():
    short = {"forward_1_ms": 1.0, "tree_forward_ms": 4.0, "verify_ms": 1.0, "prompt_len": 16}
    long = {"forward_1_ms": 4.0, "tree_forward_ms": 10.0, "verify_ms": 2.0, "prompt_len": 32}
    out = bench.profile_summary([_row(0, 3, short), _row(1, 2, short), _row(2, 5, long)])
    # batch steps 3, 2 (shape 16) and 5 (shape 32): weights 5 and 5
    assert out["forward_1_ms"] == pytest.approx(2.5) and out["tree_forward_ms"] == pytest.approx(7.0)
    assert out["propose_ms"] is None
    assert sorted((e["prompt_len"], e["steps"], e["batches"]) for e in out["step_profiles"]) == [(16, 5, 2), (32, 5, 1)]


def test_bench_step_figures_without_tree_phases():
    # an auto: run at batch 4 whose profiled chunks all went to target-only: only forward_1 timed
    ar_only = bench.profile_summary([_row(0, 5, {"forward_1_ms": 2.0, "prompt_len": 16})])
    assert bench.step_figures(ar_only, 1.0, is_ar=False) == (None, None, None)  # unknown, not free
    full = {"forward_1_ms": 1.5, "tree_forward_ms": 2.0, "verify_ms": 0.5, "propose_ms": 1.0, "update_ms": None}
    assert bench.step_figures(full, 3.0, is_ar=False) == pytest.approx((1.0, 2.5, 1.8))
    assert bench.step_figures(ar_only, 1.0, is_ar=True) == (None, None, 1.0)


def _row(batch, forwards, prof):
    stats = sbj.decoding.GenerationStats(3, 4, forwards + 1, 1.0, "length", 0.0, 1.0, 0.0, 1, batch,
                                         step_profile=prof)
    return sbj.decoding.GenerationResult(None, [1], stats)


def test_generate_charges_propose_and_update_per_step(target):
    pl = sbj.LoadedDrafter(PromptLookup(num_nodes=4), ())
    prompts = [[1, 2, 3, 4, 5], [4, 5, 6]]  # the shapes profiled above: nothing new to time there
    res = sbj.generate(target, prompts, drafter=pl, max_new_tokens=12,
                       options=sbj.DecodeOptions(batch_size=2, profile="all"))
    for r in res:
        prof = r.stats.step_profile
        assert {k for k in prof if k.endswith("_ms")} == PHASE_KEYS
        steps = r.stats.target_forwards - 1
        assert steps > 0 and r.stats.draft_time_s == pytest.approx(
            steps * (prof["propose_ms"] + prof["update_ms"]) / 1000)
        assert r.stats.to_dict()["step_profile"] == prof
    before = compilation_count()
    plain = sbj.generate(target, prompts, drafter=pl, max_new_tokens=12,
                         options=sbj.DecodeOptions(batch_size=2, profile="draft"))
    assert compilation_count() == before  # the loop and every phase are warm
    assert plain[0].stats.step_profile is None and "step_profile" not in plain[0].stats.to_dict()
    assert plain[0].stats.draft_time_s == res[0].stats.draft_time_s  # the same cached measurement
    off = sbj.generate(target, prompts, drafter=pl, max_new_tokens=12, options=sbj.DecodeOptions(batch_size=2))  # default: off
    assert off[0].stats.draft_time_s is None and off[0].token_ids == res[0].token_ids
    with pytest.raises(ValueError, match=r"options: profile: must be one of \('off', 'draft', 'all'\) \(got True\)"):
        sbj.generate(target, prompts, max_new_tokens=2, options=sbj.DecodeOptions(profile=True))
