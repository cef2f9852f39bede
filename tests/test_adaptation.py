"""Serving-time adaptation: free labels equal a full target forward, greedy output is unchanged
with adaptation on, the controller's cost decisions, subset updates, rollback, compilations."""

from __future__ import annotations

import json

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specblock_jax as sbj
from specblock_jax.adaptation import AdaptConfig, Adapter, CostAwareController
from specblock_jax.adaptation.adapter import crop_rows, paired_gain
from specblock_jax.adaptation.buffer import ReplayBuffer
from specblock_jax.decoding.compiled import compilation_count
from specblock_jax.drafters.blockpilot._model import BlockPilotDrafter, PolicyConfig, init_policy
from specblock_jax.drafters.dflash._train import DFlashTask
from specblock_jax.drafters.prompt_lookup import PromptLookup
from specblock_jax.drafters.eagle3._train import Eagle3Task
from specblock_jax.drafters.specblock._train import SpecBlockTask

V = 32


@pytest.fixture(scope="module")
def eagle3(target):
    task = Eagle3Task({"num_nodes": 10, "top_k": 3, "depth": 3}, target)
    return task.decoding_drafter(task.init_params(jax.random.key(1)))


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    return [rng.integers(0, V, rng.integers(3, 15)).tolist() for _ in range(8)]  # one bucket


def _adapter(drafter, **settings):
    return Adapter(drafter, AdaptConfig(**{"min_rows": 2, "window": 40, "capacity": 8,
                                                          "batch_rows": 2, "eval_rows": 2, **settings}))


def _leaf(params, key: tuple):
    for k in key:
        params = params[k]
    return params


def _unchanged(ad: Adapter, params) -> bool:
    """Every trainable weight of the adapter equals the original drafter's."""
    return all(bool(jnp.array_equal(ad.trainable[name], _leaf(params, key))) for name, key in ad.paths)


def _buffer_loss(ad: Adapter):
    """params -> the adapter's objective on every buffered row (its whole window)."""
    rows = ad.buffer.rows(list(range(ad.buffer.size)))
    return lambda params: float(ad.objective(ad.drafter, params, rows["hidden"], rows["tokens"],
                                             rows["loss_mask"], rows["valid"], jax.random.key(0), 0)[0])


@pytest.mark.slow
def test_collected_labels_equal_a_full_target_forward(target, eagle3, prompts):
    """The buffer's features (gathered from prefill and verification forwards) are the target's
    hidden states of a plain forward over the committed sequence; the loss mask marks exactly the
    positions whose next token was generated."""
    ad = _adapter(eagle3, cost_scale=math.inf)
    res = sbj.generate(target, prompts[:2], drafter=eagle3, max_new_tokens=12, adapter=ad,
                       options=sbj.DecodeOptions(batch_size=2))
    rows = ad.buffer.rows([0, 1])
    for r, (prompt, out) in enumerate(zip(prompts[:2], res)):
        seq = prompt + out.token_ids
        n = len(seq)
        assert rows["tokens"][r, :n].tolist() == seq and int(rows["valid"][r].sum()) == n
        full = sbj.models.apply(target.graphdef, target.params, jnp.asarray([seq]), jnp.arange(n)[None],
                                sbj.models.causal_mask(1, n), hidden_ids=eagle3[0].hidden_ids).hidden
        # every position but the last (whose hidden the loop never computes: no next token to train)
        np.testing.assert_allclose(np.asarray(rows["hidden"][r, :n - 1]), np.asarray(full[0, :n - 1]),
                                   atol=2e-5, rtol=1e-5)
        want = [int(len(prompt) <= i + 1 < n) for i in range(40)]
        assert rows["loss_mask"][r].tolist() == want


def test_buffer_keeps_the_last_window_of_long_sequences():
    buf = ReplayBuffer(capacity=2, window=4, num_features=1, hidden_size=1)
    hist = jnp.arange(10, dtype=jnp.int32)[None].repeat(3, 0)
    feats = hist[:, :, None, None].astype(jnp.float32)
    written = buf.add(hist, jnp.asarray([7, 3, 9]), jnp.asarray([2, 2, 8]), feats, num_rows=3)
    assert written.tolist() == [0, 1] and buf.size == 2  # 3 rows, capacity 2: the last two kept
    rows = buf.rows([0, 1])
    assert rows["tokens"].tolist() == [[0, 1, 2, 0], [5, 6, 7, 8]]
    assert rows["valid"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert rows["loss_mask"].tolist() == [[0, 1, 0, 0], [0, 0, 1, 0]]  # next token generated
    assert rows["hidden"][1, :, 0, 0].tolist() == [5, 6, 7, 8]


def test_buffer_insert_writes_in_place():
    """The insert donates the buffer (an undonated one copied all of it per request: ~22 ms of
    device work at the bench's 64 x 256-position buffer, landing in the next decode call's time)."""
    buf = ReplayBuffer(capacity=4, window=4, num_features=1, hidden_size=2)
    hist = jnp.arange(6, dtype=jnp.int32)[None]
    feats = jnp.ones((1, 6, 1, 2), jnp.float32)
    buf.add(hist, jnp.asarray([5]), jnp.asarray([2]), feats, num_rows=1)
    before = buf.data
    buf.add(hist, jnp.asarray([5]), jnp.asarray([2]), feats, num_rows=1)
    assert all(x.is_deleted() for x in before)  # donated: its memory now holds the new buffer
    assert buf.size == 2 and buf.rows([0, 1])["tokens"].tolist() == [[1, 2, 3, 4]] * 2


@pytest.mark.parametrize("kind", ["eagle3", "specblock", "dflash", "blockpilot"])
@pytest.mark.slow
def test_greedy_output_is_identical_with_adaptation_on_and_off(target, eagle3, prompts, kind):
    if kind == "eagle3":
        drafter = eagle3
    elif kind == "blockpilot":  # adaptation trains the DFlash drafter inside
        task = DFlashTask({"num_layers": 1, "block_size": 4, "num_anchors": 3, "mask_token_id": 3}, target)
        policy = PolicyConfig((2, 3, 4), "topk", 4, V, 16)
        graphdef, pparams = init_policy(policy, seed=3)
        pparams = {**jax.tree.map(lambda x: x * 8.0, pparams), "std": jnp.ones_like(pparams["std"])}
        dflash = task.decoding_drafter(task.init_params(jax.random.key(2)))
        drafter = sbj.LoadedDrafter(BlockPilotDrafter(dflash.drafter, policy, graphdef),
                                    {"dflash": dflash.params, "policy": pparams})
    else:
        task = (SpecBlockTask({"num_nodes": 10, "num_blocks": 2}, target) if kind == "specblock" else
                DFlashTask({"num_layers": 1, "block_size": 4, "num_anchors": 3, "mask_token_id": 3}, target))
        drafter = task.decoding_drafter(task.init_params(jax.random.key(2)))
    ar = sbj.generate(target, prompts, max_new_tokens=16, options=sbj.DecodeOptions(batch_size=2))
    off = sbj.generate(target, prompts, drafter=drafter, max_new_tokens=16, options=sbj.DecodeOptions(batch_size=2))
    ad = _adapter(drafter, cost_scale=0.0, learning_rate=1e-2, rollback=False)
    on = sbj.generate(target, prompts, drafter=drafter, max_new_tokens=16, adapter=ad,
                      options=sbj.DecodeOptions(batch_size=2, refill=True))
    summary = ad.summary()
    assert summary["updates"] == summary["decisions"] >= 3  # every refill with work left
    inner = (lambda p: p["dflash"]) if kind == "blockpilot" else (lambda p: p)
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.any(a != b)), inner(ad.params)["draft"],
                                           inner(drafter[1])["draft"]))
    assert any(changed)  # the drafter really was updated between batches
    assert [r.token_ids for r in on] == [r.token_ids for r in off] == [r.token_ids for r in ar]
    assert all(r.stats.adapt is not None for r in on)


@pytest.mark.slow
def test_controller_declines_above_any_gain_and_updates_at_zero_cost(target, eagle3, prompts):
    never = _adapter(eagle3, cost_scale=math.inf)
    before = compilation_count()
    sbj.generate(target, prompts, drafter=eagle3, max_new_tokens=16, adapter=never,
                 options=sbj.DecodeOptions(batch_size=2, refill=False))
    s = never.summary()
    assert s["decisions"] == 3 and s["updates"] == 0 and s["declined"] == 3
    assert _unchanged(never, eagle3[1])
    # an adapter that never updates prices no update: no calibration round, compiled or run
    assert not any("calibration_s" in e for e in never.events)
    assert compilation_count() - before <= 2  # the collecting decode loop and the buffer insert
    before = compilation_count()
    always = _adapter(eagle3, cost_scale=0.0)
    sbj.generate(target, prompts, drafter=eagle3, max_new_tokens=16, adapter=always,
                 options=sbj.DecodeOptions(batch_size=2, refill=False))
    s = always.summary()
    assert s["decisions"] == 3 and s["updates"] == 3 and s["adapt_time_s"] > 0
    events = [e for e in always.events if e.get("update")]
    assert all(e["cost_s"] > 0 and e["saving_s"] > 0 and "realised_gain" in e for e in events)
    # at most the collecting decode loop, the buffer insert, the update round and the evaluation
    assert compilation_count() - before <= 4
    again = compilation_count()
    sbj.generate(target, prompts, drafter=eagle3, max_new_tokens=16, adapter=always,
                 options=sbj.DecodeOptions(batch_size=2, refill=False))
    assert compilation_count() == again  # a persisted adapter reuses every executable


def test_the_adapter_decides_from_the_requests_it_holds_not_from_later_calls(target, eagle3, prompts):
    """A server knows its queue, not what comes after it: the first call's decisions are the same
    whether or not a second call follows, and its last batch, with nothing left queued, decides
    no update although the job goes on."""
    def decisions(ad, start=0):
        return [(e["update"], e.get("rolled_back", False), e["remaining_tokens"]) for e in ad.events[start:]]

    kw = dict(drafter=eagle3, max_new_tokens=16, options=sbj.DecodeOptions(batch_size=2, refill=False))
    alone, followed = _adapter(eagle3, cost_scale=0.0), _adapter(eagle3, cost_scale=0.0)
    sbj.generate(target, prompts[:6], adapter=alone, **kw)
    sbj.generate(target, prompts[:6], adapter=followed, **kw)
    sbj.generate(target, prompts[6:], adapter=followed, **kw)
    first = decisions(alone)
    assert len(first) == 3 and decisions(followed)[:3] == first
    assert first[0][0] and not first[-1][0] and first[-1][2] == 0.0  # updates while work is queued, none after
    assert "predicted_gain" not in alone.events[-1]  # nothing queued: no decision was asked for


def test_controller_arithmetic():
    c = CostAwareController(cost_scale=1.0, prior_gain=0.1)
    c.observe_decoding(tokens=1000, seconds=2.0)  # 2 ms per token
    c.observe_cost(1.0)
    d = c.decide(remaining_tokens=10_000)  # saving = 10k * 2 ms * 0.1 / 1.1 = 1.82 s > 1 s
    assert d.update and d.saving_s == pytest.approx(20.0 * 0.1 / 1.1)
    c.observe_gain(0.0)  # the update did not help: only the shrinking exploration term remains
    d = c.decide(remaining_tokens=10_000)  # gain 0.1 / 2 -> saving 0.95 s < 1 s
    assert not d.update and d.predicted_gain == pytest.approx(0.05)
    c.observe_gain(0.3)  # a later measurement says updates help
    assert c.decide(remaining_tokens=10_000).update
    assert not c.decide(remaining_tokens=0).update


def test_only_the_chosen_subset_changes(target, eagle3, prompts):
    ad = _adapter(eagle3, cost_scale=0.0, subset="layer/mlp+norm", learning_rate=1e-2, rollback=False)
    sbj.generate(target, prompts, drafter=eagle3, max_new_tokens=16, adapter=ad,
                 options=sbj.DecodeOptions(batch_size=2))
    names = {n for n, _ in ad.paths}
    assert names == {"draft/layer/mlp/down_proj", "draft/layer/mlp/gate_proj", "draft/layer/mlp/up_proj",
                     "draft/norm/weight"}
    old, new = eagle3[1]["draft"], ad.params["draft"]
    flat_old = dict(jax.tree_util.tree_flatten_with_path(old)[0])
    for path, value in jax.tree_util.tree_flatten_with_path(new)[0]:
        name = "draft/" + "/".join(str(getattr(k, "key", k)) for k in path)
        assert bool(jnp.array_equal(value, flat_old[path])) == (name not in names), name
    with pytest.raises(ValueError, match="matches no drafter weight"):
        _adapter(eagle3, subset="nothing")


@pytest.mark.slow
def test_updates_reduce_the_loss_on_buffered_rows(target, eagle3, prompts):
    ad = _adapter(eagle3, cost_scale=math.inf, learning_rate=3e-3, steps=10)
    sbj.generate(target, prompts, drafter=eagle3, max_new_tokens=16, adapter=ad,
                 options=sbj.DecodeOptions(batch_size=4))
    loss = _buffer_loss(ad)
    first = loss(ad.params)
    for _ in range(3):
        ad.trainable, ad.opt_state, _, _ = ad._update()  # a whole round of `steps`
    assert loss(ad.params) < 0.8 * first


def test_training_crops_cover_the_generated_positions_and_drop_the_last_label():
    w, n = 12, 4
    tok = jnp.arange(w, dtype=jnp.int32)[None].repeat(3, 0) + 100 * jnp.arange(3)[:, None]
    fea = tok[:, :, None, None].astype(jnp.float32)
    valid = jnp.asarray([[1] * 12, [1] * 9 + [0] * 3, [1] * 3 + [0] * 9], jnp.int32)
    # scored: row 0 positions 6-10, row 1 positions 2-3, row 2 nothing
    mask = jnp.zeros((3, w), jnp.int32).at[0, 6:11].set(1).at[1, 2:4].set(1)
    starts = set()
    for seed in range(40):
        t, f, v, m = crop_rows(tok, fea, valid, mask, n, jax.random.key(seed))
        assert t.shape == (3, n) and f.shape == (3, n, 1, 1)
        s = np.asarray(t[:, 0]) - 100 * np.arange(3)  # each row's crop start
        assert np.array_equal(np.asarray(t) - 100 * np.arange(3)[:, None], s[:, None] + np.arange(n))
        assert np.array_equal(np.asarray(f[:, :, 0, 0]), np.asarray(t))  # features move with tokens
        assert np.array_equal(np.asarray(v), np.asarray(valid)[np.arange(3)[:, None], s[:, None] + np.arange(n)])
        # starts within [first - n // 4, last + 2 - n]: row 0 [5, 8], row 1 [1, 1]; row 2 (nothing scored) 0
        assert 5 <= s[0] <= 8 and s[1] == 1 and s[2] == 0
        expect = np.asarray(mask)[np.arange(3)[:, None], s[:, None] + np.arange(n)]
        expect[:, -1] = 0  # the crop's last label lies outside it
        assert np.array_equal(np.asarray(m), expect)
        starts.add(int(s[0]))
    assert starts == {5, 6, 7, 8}  # every allowed start is drawn


def test_cropped_updates_reduce_the_loss_and_cost_one_compilation(target, eagle3, prompts):
    ad = _adapter(eagle3, cost_scale=math.inf, learning_rate=3e-3, steps=10, train_window=16)
    sbj.generate(target, prompts, drafter=eagle3, max_new_tokens=16, adapter=ad,
                 options=sbj.DecodeOptions(batch_size=4))
    loss = _buffer_loss(ad)
    first = loss(ad.params)
    ad.trainable, ad.opt_state, _, _ = ad._update()
    before = compilation_count()
    for _ in range(2):
        ad.trainable, ad.opt_state, _, _ = ad._update()
    assert compilation_count() == before  # the cropped round compiled once
    assert loss(ad.params) < 0.8 * first  # scored on the whole rows, trained on crops
    with pytest.raises(ValueError, match="train_window"):
        AdaptConfig(train_window=1)


def test_an_update_that_hurts_is_rolled_back(target, eagle3, prompts, monkeypatch):
    ad = _adapter(eagle3, cost_scale=0.0, learning_rate=1e-2)
    monkeypatch.setattr(ad, "_evaluate", lambda old, new, slots: (2.0, 1.0, 0.0, 0.01))  # new is worse
    sbj.generate(target, prompts, drafter=eagle3, max_new_tokens=16, adapter=ad,
                 options=sbj.DecodeOptions(batch_size=2, refill=False))
    ups = [e for e in ad.events if e.get("update")]
    assert len(ups) == 3 and all(e["realised_gain"] == -0.5 for e in ups)
    assert sum(bool(e.get("rolled_back")) for e in ad.events) == 3
    assert _unchanged(ad, eagle3[1])  # every update was undone


def test_an_update_is_kept_only_when_its_gain_clears_keep_z_standard_errors(target, eagle3, prompts, monkeypatch):
    """+2% with a 5% standard error is noise and rolled back at keep_z=1, kept at keep_z=0; +20% is kept."""
    for taus, keep_z, kept in (((1.0, 1.02), 1.0, False), ((1.0, 1.2), 1.0, True), ((1.0, 1.02), 0.0, True)):
        ad = _adapter(eagle3, cost_scale=0.0, learning_rate=1e-2, keep_z=keep_z)
        monkeypatch.setattr(ad, "_evaluate", lambda old, new, slots, t=taus: (*t, 0.05, 0.01))
        sbj.generate(target, prompts, drafter=eagle3, max_new_tokens=16, adapter=ad,
                     options=sbj.DecodeOptions(batch_size=2, refill=False))
        scored = [e for e in ad.events if "eval_gain_se" in e]
        assert len(scored) >= 2 and all(e["eval_gain_se"] == 0.05 for e in scored)
        assert sum(bool(e.get("rolled_back")) for e in ad.events) == (0 if kept else len(scored))
        assert _unchanged(ad, eagle3[1]) != kept
    with pytest.raises(ValueError, match="keep_z"):
        AdaptConfig(keep_z=-1)


def test_unseen_evaluation_judges_each_update_at_once_on_buffered_rows_its_steps_never_drew(
        target, eagle3, prompts, monkeypatch):
    """evaluate_on="unseen": an update whose round left `eval_rows` buffered rows undrawn (the
    draws recomputed on the host from the round's key) is scored in its own event on the newest of
    them, so the next decision need not wait for fresh rows; one that drew nearly every row waits
    for fresh rows as before. Greedy output stays the target's."""
    ad = _adapter(eagle3, cost_scale=0.0, learning_rate=1e-2, steps=1, evaluate_on="unseen")
    rounds, judged = [], {}
    real_update, real_evaluate = ad._update, ad._evaluate

    def update(steps=None, key=None):
        key_used = []
        real_key = ad._next_key
        ad._next_key = lambda: key_used.append(real_key()) or key_used[-1]
        try:
            out = real_update(steps, key)
        finally:
            ad._next_key = real_key
        if key is None:  # a real round (the calibration's pass a fixed key)
            drawn = {int(i) for i in jax.random.randint(jax.random.fold_in(key_used[0], 0), (2,), 0, ad.buffer.size)}
            newest = [(ad.buffer.next - 1 - i) % ad.config.capacity for i in range(ad.buffer.size)]
            rounds.append([s for s in newest if s not in drawn])
        return out

    def evaluate(old, new, slots):
        if old is not new:  # not the calibration's timing run, which scores one weight set twice
            judged.setdefault(len(rounds) - 1, list(slots))
        return real_evaluate(old, new, slots)

    monkeypatch.setattr(ad, "_update", update)
    monkeypatch.setattr(ad, "_evaluate", evaluate)
    on = sbj.generate(target, prompts, drafter=eagle3, max_new_tokens=16, adapter=ad,
                      options=sbj.DecodeOptions(batch_size=2, refill=False))
    ar = sbj.generate(target, prompts, max_new_tokens=16, options=sbj.DecodeOptions(batch_size=2))
    assert [r.token_ids for r in on] == [r.token_ids for r in ar]
    ups = [e for e in ad.events if e.get("update")]
    assert len(ups) == len(rounds) >= 3
    for n, (event, unseen) in enumerate(zip(ups, rounds)):
        if len(unseen) >= 2:
            assert event["evaluated_on"] == "unseen" and "eval_tau_old" in event and "realised_gain" in event
            assert judged[n] == unseen[:2]  # the newest undrawn rows, newest first
        else:
            assert "evaluated_on" not in event and "eval_tau_old" not in event
    assert sum(len(u) >= 2 for u in rounds) >= 2
    with pytest.raises(ValueError, match="evaluate_on"):
        AdaptConfig(evaluate_on="later")


def test_the_paired_gain_and_its_standard_error():
    """Exact pooled taus and gain; the delta-method standard error matches the spread of the gain
    over 4000 independent draws of 32 paired rows (within 10%)."""
    old, new = (np.array([2, 4]), np.array([4, 4])), (np.array([2, 2]), np.array([4, 4]))  # (steps, committed)
    a, b, gain, se = paired_gain(old, new)
    assert (a, b) == pytest.approx((8 / 6, 2.0)) and gain == pytest.approx(0.5) and se > 0
    assert paired_gain((old[0][:1], old[1][:1]), (new[0][:1], new[1][:1]))[3] == 0.0  # one row: no spread
    rng = np.random.default_rng(0)
    draws = []
    for _ in range(4000):
        steps = rng.integers(20, 120, 32)
        committed = np.round(steps * rng.uniform(1.2, 2.4, 32))  # rows differ a lot
        new_committed = np.round(committed * (1.03 + rng.normal(0, 0.08, 32)))  # +3% +- 8% per row
        draws.append(paired_gain((steps, committed), (steps, new_committed)))
    gains, ses = np.array([d[2] for d in draws]), np.array([d[3] for d in draws])
    assert np.mean(gains) == pytest.approx(0.03, abs=0.005)
    assert np.mean(ses) == pytest.approx(np.std(gains), rel=0.1)


def test_bad_settings_and_kinds_are_refused(target, eagle3):
    with pytest.raises(ValueError, match="key=value"):
        AdaptConfig.parse("subset")
    assert AdaptConfig.parse("subset=layer+fc,cost_scale=0,rollback=false") == AdaptConfig(
        subset="layer,fc", cost_scale=0.0, rollback=False)
    with pytest.raises(ValueError, match="cannot adapt|trainable weights"):
        Adapter(sbj.LoadedDrafter(PromptLookup(), ()))
    with pytest.raises(ValueError, match="the drafter the adapter was built for"):
        sbj.generate(target, [[1, 2, 3]], drafter=sbj.load_drafter("prompt_lookup", target), adapter=_adapter(eagle3))


@pytest.mark.slow
def test_the_adapter_state_saves_and_a_resumed_job_continues_identically(target, eagle3, prompts, tmp_path):
    """Saving after half a job and loading into a fresh adapter continues exactly as the adapter
    that never stopped (updates forced: cost_scale=0)."""
    kw = dict(drafter=eagle3, max_new_tokens=12, options=sbj.DecodeOptions(batch_size=2))
    straight, first = _adapter(eagle3, cost_scale=0.0), _adapter(eagle3, cost_scale=0.0)
    for ad in (straight, first):
        sbj.generate(target, prompts[:4], adapter=ad, **kw)
    first.save_state(str(tmp_path / "state"))
    resumed = _adapter(eagle3, cost_scale=0.0)
    resumed.load_state(str(tmp_path / "state"))
    assert resumed.events == json.loads(json.dumps(first.events, default=float))
    assert resumed.controller.updates == first.controller.updates >= 1 and resumed.buffer.size == first.buffer.size
    for ad in (straight, resumed):
        sbj.generate(target, prompts[4:], adapter=ad, **kw)
    assert [e["update"] for e in resumed.events] == [e["update"] for e in straight.events]
    for name in straight.trainable:
        np.testing.assert_array_equal(np.asarray(resumed.trainable[name]), np.asarray(straight.trainable[name]))
    for a, b in zip(jax.tree.leaves(resumed.opt_state), jax.tree.leaves(straight.opt_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="saved for another drafter or adapt setting"):
        _adapter(eagle3, steps=3).load_state(str(tmp_path / "state"))


@pytest.mark.slow
def test_sampling_follows_the_target_distribution_while_adapting(small_vocab_target):
    """6000 sampled continuations in 6 batches with an update between every two (cost_scale=0):
    the (t2, t3) pairs still follow the target's exact distribution (the drafter only proposes)."""
    from helpers_sampling import V as SV, chi_square_pvalue, exact_pair_distribution

    task = Eagle3Task({"num_nodes": 6, "top_k": 2, "depth": 2}, small_vocab_target)
    drafter = task.decoding_drafter(task.init_params(jax.random.key(4)))
    ad = Adapter(drafter, AdaptConfig(cost_scale=0.0, min_rows=2, window=8, capacity=16, batch_rows=2,
                                       eval_rows=2, learning_rate=1e-2, rollback=False))
    prompt = [1, 2, 3]
    res = sbj.generate(small_vocab_target, [prompt] * 6000, drafter=drafter, adapter=ad, max_new_tokens=3, seed=11,
                       sampling=sbj.Sampling(1.0), options=sbj.DecodeOptions(batch_size=1000, refill=False))
    assert ad.summary()["updates"] >= 2 and not _unchanged(ad, drafter[1])
    counts = np.zeros((SV, SV))
    for r in res:
        counts[r.token_ids[1], r.token_ids[2]] += 1
    assert chi_square_pvalue(counts, exact_pair_distribution(small_vocab_target, prompt, 1.0)) > 1e-3
    assert chi_square_pvalue(counts, exact_pair_distribution(small_vocab_target, prompt, 1.25)) < 1e-6
