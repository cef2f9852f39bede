"""The long jobs of issue 41 (benchmarks/long_jobs/): the shipped prompt files parse, have unique
ids, reach their sizes in new tokens and fit the target's cache."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
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


# --- no look-ahead: the adapter and auto decide from the requests a server holds (generate's queue)

V = 32  # the tiny peaked target's vocabulary (conftest `target`; shared with test_adaptation.py)


@pytest.fixture(scope="module")
def eagle3(target):
    import jax

    from specblock_jax.drafters.eagle3._train import Eagle3Task

    task = Eagle3Task({"num_nodes": 10, "top_k": 3, "depth": 3}, target)
    return task.decoding_drafter(task.init_params(jax.random.key(1)))


class _FirstBatch(Exception):
    """Ends a `generate` call after its first batch (raised by on_batch)."""


def _held_from(events, rows_in_flight: int, queue: int, job: int) -> int:
    """Index of the first event at which a server holding `queue` waiting requests would know
    the job's end: fewer than in-flight + queue requests of the `job` left unserved."""
    served = 0
    for i, e in enumerate(events):
        served += e["rows"]
        if job - served < rows_in_flight + queue:
            return i
    return len(events)


@pytest.mark.parametrize("refill", [False, True])
def test_the_adapter_decides_the_same_whatever_the_job_holds_beyond_its_queue(target, eagle3, refill):
    """The same 12-request job decoded alone and with 6 more requests after it, as one call each,
    a server holding 2 waiting requests (queue=2): every decision (update or not, rolled back or
    not, the predicted gain, the work the controller is told is queued) is the same until the
    job's end enters the window; without the window (queue=0) the first decision already sees
    the call's size. Greedy outputs stay those of target-only decoding."""
    import specblock_jax as sbj
    from specblock_jax.adaptation import AdaptConfig, Adapter

    rng = np.random.default_rng(5)
    job = [rng.integers(0, V, 9).tolist() for _ in range(12)]  # one length: served in the given order
    more = job + [rng.integers(0, V, 9).tolist() for _ in range(6)]
    settings = AdaptConfig(min_rows=2, window=40, capacity=8, batch_rows=2, eval_rows=2, cost_scale=0.0)

    def run(prompts, queue, first=False):
        """(the adapter's decisions, the outputs); first: only the first batch's decision."""
        ad = Adapter(eagle3, settings)

        def stop(_):
            raise _FirstBatch

        try:
            res = sbj.generate(target, prompts, drafter=eagle3, max_new_tokens=16, adapter=ad,
                               on_batch=stop if first else None,
                               options=sbj.DecodeOptions(batch_size=2, refill=refill, queue=queue))
        except _FirstBatch:
            res = []
        keep = ("rows", "update", "rolled_back", "predicted_gain", "remaining_tokens")
        return [{k: e.get(k) for k in keep} for e in ad.events], [r.token_ids for r in res]

    alone, out = run(job, 2)
    followed, out_more = run(more, 2)
    cut = _held_from(alone, 2 if refill else 0, 2, len(job))
    assert 3 <= cut < len(alone) and alone[:cut] == followed[:cut]
    assert sum(e["update"] for e in alone[:cut]) >= 2  # decisions were made, not all skipped
    # at `cut` the job's end is in the window: the job alone holds less work than the longer call
    assert alone[cut]["remaining_tokens"] < followed[cut]["remaining_tokens"]
    # the whole call as the queue: the first decision already counts the 6 extra requests
    assert run(job, 0, first=True)[0][0]["remaining_tokens"] < run(more, 0, first=True)[0][0]["remaining_tokens"]
    ar = sbj.generate(target, job, max_new_tokens=16, options=sbj.DecodeOptions(batch_size=2))
    assert out == out_more[:len(job)] == [r.token_ids for r in ar]


def test_auto_decides_the_same_whatever_the_job_holds_beyond_its_queue(monkeypatch):
    """auto over a 24-request job alone and followed by 6 more in the same call, one request a
    chunk, a server holding 4 waiting requests: the same options, explorations and re-checks
    until the job's end enters the window."""
    import specblock_jax as sbj
    import specblock_jax.serving.auto as auto_mod
    from specblock_jax.decoding.job import JobSettings, Request
    from specblock_jax.drafters.prompt_lookup import PromptLookup
    from specblock_jax.serving import AutoServe

    pl = sbj.LoadedDrafter(PromptLookup(), ())

    speed = {"ar": 100.0, 4: 300.0, 8: 200.0}

    def fake_serve(target, requests, drafter, options):  # 10 tokens a request at the option's speed
        seconds = 10 / speed["ar" if drafter is None else drafter.drafter.num_nodes]
        stats = lambda j: sbj.GenerationStats(1, 10, 11, 1.0, "length", None, seconds, 0.0, 1, j)  # noqa: E731
        return [sbj.GenerationResult(None, [1] * 10, stats(j), j) for j in range(len(requests))]

    monkeypatch.setattr(auto_mod, "run_requests", fake_serve)

    def choices(n):
        auto = AutoServe(pl, budgets=(4,), chunk=1, recheck_every=3)
        auto.serve(None, [Request(i, [1, 2], 10, 0.0, i) for i in range(n)], JobSettings(batch_size=1, queue=4))
        return [(e["option"], e["why"]) for e in auto.events]

    alone, followed = choices(24), choices(30)
    cut = 24 - 4  # chunk n's window (itself and 4 waiting) lies inside the job for n < 20
    assert alone[:cut] == followed[:cut]
    assert {"explore", "best", "recheck"} <= {why for _, why in alone[:cut]}


# --- adaptation for long jobs: the controller's horizon counts on as much again as it has served


def _updates(expect: float, gain: float, batches: int, backoff: float = 1.0, clear: bool | None = None) -> list[int]:
    """Batches at which a controller updates over a job of `batches` batches of 512 tokens at
    2 ms/token, each decision seeing 512 tokens queued (a server's window), an update costing
    1 s and realising `gain` (judged clearly positive or not by `clear`)."""
    from specblock_jax.adaptation import CostAwareController

    c = CostAwareController(cost_scale=1.0, prior_gain=0.1, expect=expect, backoff=backoff)
    c.observe_cost(1.0)
    made = []
    for n in range(batches):
        c.observe_decoding(512, 1.024)
        d = c.decide(remaining_tokens=512)
        assert d.remaining_tokens == max(512, expect * 512 * (n + 1))  # the horizon
        if d.update:
            made.append(n)
            c.observe_gain(gain, clear)
    return made


def test_with_expect_updates_continue_through_a_long_job_spaced_by_their_measured_gain():
    from specblock_jax.adaptation import CostAwareController

    # counting only the queue, no update ever pays (saving 1.02 s x 0.09 < 1 s)
    assert _updates(0.0, 0.02, 200) == []
    helping, useless = _updates(1.0, 0.02, 200), _updates(1.0, 0.0, 200)
    # the first once ~5.6k tokens are served (saving = served x 2 ms x 0.1 / 1.1 > 1 s), then on
    # through the job; updates that realise nothing come further apart than ones that help
    assert helping[0] == useless[0] == 10
    assert len(helping) > len(useless) >= 4 and helping[-1] >= 100 and useless[-1] >= 100
    assert all(b - a >= d - c for (a, b), (c, d) in zip(zip(useless, useless[1:]), zip(helping, helping[1:])))
    # the job's size is unknown to it: a shorter job's decisions are the longer one's prefix
    assert _updates(1.0, 0.02, 120) == [n for n in helping if n < 120]
    with pytest.raises(ValueError, match="expect"):
        CostAwareController(expect=-1.0)


def test_with_backoff_rounds_that_realise_nothing_stop_the_updates_and_clear_gains_keep_them():
    from specblock_jax.adaptation import AdaptConfig, CostAwareController

    # without backoff, updates judged useless go on to the end of a 200-batch job (the
    # 1 / (1 + updates) decay is outrun by the growing horizon); halving the exploration per
    # round in a row without a clear gain spaces them geometrically: each gap at least doubles
    endless, backed_off = _updates(1.0, 0.0, 200, 1.0, False), _updates(1.0, 0.0, 200, 0.5, False)
    assert len(endless) >= 16 and endless[-1] >= 190
    assert backed_off[0] == endless[0] and 2 <= len(backed_off) <= 4
    gaps = [b - a for a, b in zip([0] + backed_off, backed_off)]
    assert all(later >= 2 * earlier for earlier, later in zip(gaps, gaps[1:]))
    # rounds that clear the threshold reset the streak: the schedule is the one without backoff
    assert _updates(1.0, 0.02, 200, 0.5, True) == _updates(1.0, 0.02, 200, 1.0, True)
    # and the decisions still do not depend on the job's size
    assert _updates(1.0, 0.0, 120, 0.5, False) == [n for n in backed_off if n < 120]
    with pytest.raises(ValueError, match="backoff"):
        CostAwareController(backoff=1.5)
    with pytest.raises(ValueError, match="adapt setting backoff"):
        AdaptConfig(backoff=-0.1)


def test_a_measured_update_cost_is_reused_by_the_next_job_of_the_same_shapes(target, eagle3, monkeypatch):
    """The first job calibrates its update cost; the next job of the same shapes starts from the
    cost measured so far instead, and decides and trains the same way (calibration draws none
    of the adapter's random keys); other shapes calibrate their own."""
    import specblock_jax as sbj
    from specblock_jax.adaptation import AdaptConfig, Adapter
    from specblock_jax.adaptation import costs as adapter_mod

    monkeypatch.setattr(adapter_mod, "MEASURED_COSTS", {})
    rng = np.random.default_rng(6)
    job = [rng.integers(0, V, 9).tolist() for _ in range(8)]

    def run(**settings):
        ad = Adapter(eagle3, AdaptConfig(**{"min_rows": 2, "window": 40, "capacity": 8, "batch_rows": 2,
                                            "eval_rows": 2, "cost_scale": 0.0, **settings}))
        sbj.generate(target, job, drafter=eagle3, max_new_tokens=16, adapter=ad,
                     options=sbj.DecodeOptions(batch_size=2, refill=False))
        return ad, [k for e in ad.events for k in e if k.startswith("calibration")]

    first, calibrated = run()
    assert calibrated == ["calibration_s"] and list(adapter_mod.MEASURED_COSTS) == [first.cost_key()]
    measured = adapter_mod.MEASURED_COSTS[first.cost_key()]["cost_s"]
    second, reused = run()
    assert reused == ["calibration_reused_s"] and [e["calibration_reused_s"] for e in second.events
                                                   if "calibration_reused_s" in e] == [measured]
    assert [e["update"] for e in second.events] == [e["update"] for e in first.events]
    assert [e.get("rolled_back") for e in second.events] == [e.get("rolled_back") for e in first.events]
    assert all(bool(jnp.array_equal(second.trainable[k], first.trainable[k])) for k in first.trainable)
    assert run(steps=4)[1] == ["calibration_s"]  # another round shape


def _job_run(target, eagle3, **settings):
    import specblock_jax as sbj
    from specblock_jax.adaptation import AdaptConfig, Adapter

    rng = np.random.default_rng(6)
    job = [rng.integers(0, V, 9).tolist() for _ in range(8)]
    ad = Adapter(eagle3, AdaptConfig(**{"min_rows": 2, "window": 40, "capacity": 8, "batch_rows": 2,
                                        "eval_rows": 2, "cost_scale": 0.0, **settings}))
    sbj.generate(target, job, drafter=eagle3, max_new_tokens=16, adapter=ad,
                 options=sbj.DecodeOptions(batch_size=2, refill=False))
    return ad


def test_a_measured_update_cost_outlives_its_process_in_the_costs_file(target, eagle3, monkeypatch, tmp_path):
    """With `costs_file`, a job in a new process (the in-process store emptied) starts from the
    cost a job of the same round shape measured on this machine, and decides the same way; the
    file keys by shape and machine, and a corrupt file is refused naming it."""
    from specblock_jax.adaptation import costs

    path = tmp_path / "adapt_costs.json"
    monkeypatch.setattr(costs, "MEASURED_COSTS", {})
    first = _job_run(target, eagle3, costs_file=str(path))
    assert [k for e in first.events for k in e if k.startswith("calibration")] == ["calibration_s"]
    saved = json.loads(path.read_text())
    assert list(saved) == [costs.key_digest(first.cost_key())]
    entry = saved[costs.key_digest(first.cost_key())]
    assert entry["cost_s"] == first.controller.cost_estimate > 0 and entry["step_s"] == first.step_s >= 0
    monkeypatch.setattr(costs, "MEASURED_COSTS", {})  # a new process
    second = _job_run(target, eagle3, costs_file=str(path))
    assert [e["calibration_reused_s"] for e in second.events if "calibration_reused_s" in e] == [entry["cost_s"]]
    assert not any("calibration_s" in e for e in second.events) and second.step_s == entry["step_s"]
    assert [e["update"] for e in second.events] == [e["update"] for e in first.events]
    monkeypatch.setattr(costs, "MEASURED_COSTS", {})
    assert costs.lookup(first.cost_key()[:-1] + ("other",), path) is None  # another shape or backend
    path.write_text("{not json")
    with pytest.raises(ValueError, match="adapt_costs.json"):
        costs.lookup(first.cost_key(), path)


def test_next_round_size_follows_the_realised_gain_per_step_against_a_step_cost():
    """A round doubles while one more step's saving (horizon x s/token x gain per step) is at
    least twice a step's cost, halves when it is under one step's cost, and keeps its size
    between; bounded by 1 and max_steps."""
    from specblock_jax.adaptation.controller import CostAwareController

    ctl = CostAwareController()
    ctl.observe_decoding(1000, 10.0)  # 0.01 s per token
    # 8 steps bought +8%: 1% per step; over 1,000 tokens one step saves 0.1 s
    assert ctl.next_steps(8, 0.08, 0.05, 1000, 64) == 16
    assert ctl.next_steps(8, 0.08, 0.049, 1000, 12) == 12  # capped
    assert ctl.next_steps(8, 0.08, 0.07, 1000, 64) == 8
    assert ctl.next_steps(8, 0.08, 0.11, 1000, 64) == 4
    assert ctl.next_steps(8, -0.02, 0.01, 1000, 64) == 4  # a loss buys nothing
    assert ctl.next_steps(1, 0.0, 0.01, 1000, 64) == 1
    assert ctl.next_steps(8, 0.08, 0.05, 0, 64) == 4  # nothing queued
    # a resized round's predicted cost: the measured round's plus its extra steps'
    ctl.observe_cost(2.0)
    assert ctl.decide(1000, extra_cost_s=0.4).cost_s == pytest.approx(2.4)
    assert ctl.decide(1000, extra_cost_s=-3.0).cost_s == 0.0


def test_rounds_are_resized_by_the_controller_and_their_cost_normalised(target, eagle3, monkeypatch):
    """With `max_steps`, each judged round's (steps, realised gain) sizes the next round through
    `next_steps`; every update event records its steps, within [1, max_steps]; the controller's
    cost estimate stays that of a round at the config's steps."""
    from specblock_jax.adaptation import costs
    from specblock_jax.adaptation.controller import CostAwareController

    monkeypatch.setattr(costs, "MEASURED_COSTS", {})
    calls = []
    real = CostAwareController.next_steps

    def spy(self, last_steps, realised, step_s, remaining, max_steps):
        calls.append((last_steps, realised))
        return min(2 * last_steps, max_steps) if len(calls) % 2 else real(self, last_steps, realised, step_s,
                                                                           remaining, max_steps)
    monkeypatch.setattr(CostAwareController, "next_steps", spy)
    ad = _job_run(target, eagle3, steps=2, max_steps=8)
    steps = [e["steps"] for e in ad.events if e["update"]]
    gains = [e["realised_gain"] for e in ad.events if e["update"] and "realised_gain" in e]
    assert len(steps) >= 3 and steps[0] == 2 and all(1 <= s <= 8 for s in steps)
    assert calls == list(zip(steps, gains))[:len(calls)] and len(calls) >= 2
    assert steps[1] == 4  # the first resize doubled (the spy's odd calls)
    fixed = _job_run(target, eagle3, steps=2)
    assert all(e["steps"] == 2 for e in fixed.events if e["update"])
