"""BlockPilot: features, per-sequence block sizes in one batch == each sequence alone, policy
training (the registered task through the one trainer, and its CLI), save/load."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specblock_jax as sbj
from specblock_jax.drafters import registry
from specblock_jax.drafters.blockpilot._model import (BlockPilotDrafter, PolicyConfig, choose, features,
                                               init_policy, save_blockpilot)
from specblock_jax.drafters.blockpilot._train import PolicyData, prefill_features
from specblock_jax.drafters.dflash._model import DFlashDrafter
from specblock_jax.drafters.dflash._train import DFlashTask
from specblock_jax.drafters.io import load_drafter, save_drafter
from specblock_jax.trainer.trainer import train

V = 8
SIZES = (2, 3, 4)


@pytest.fixture(scope="module")
def pilot(target):
    """A BlockPilot drafter with a random policy, and its params."""
    task = DFlashTask({"num_layers": 2, "block_size": 4, "num_anchors": 3}, target)
    dparams = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, task.init_params(jax.random.key(1)))
    policy = PolicyConfig(SIZES, "topk", 4, V, 16)
    graphdef, pparams = init_policy(policy, seed=3)
    pparams = jax.tree.map(lambda x: x * 8.0, pparams)  # decisive random choices
    pparams["std"] = jnp.ones_like(pparams["std"])
    drafter = BlockPilotDrafter(DFlashDrafter(task.config, task.graphdef, block_size=4), policy, graphdef)
    return task, drafter, {"dflash": task.decoding_drafter(dparams)[1], "policy": pparams}


def test_topk_features_are_sorted_probabilities_and_entropy():
    logits = jnp.asarray([[0.0, 2.0, 1.0, -1.0], [1.0, 1.0, 1.0, 1.0]])
    f = np.asarray(features(logits, "topk", 2))
    p = np.exp(np.asarray(logits)) / np.exp(np.asarray(logits)).sum(-1, keepdims=True)
    np.testing.assert_allclose(f[:, :2], -np.sort(-p, axis=-1)[:, :2], rtol=1e-6)
    np.testing.assert_allclose(f[:, 2], -(p * np.log(p)).sum(-1), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(features(logits, "full")), p, rtol=1e-6)


def _prompts():
    rng = np.random.default_rng(5)
    return [rng.integers(0, V, rng.integers(2, 15)).tolist() for _ in range(10)]


def _chosen(target, drafter, params, prompts) -> list[int]:
    """The policy's size for each prompt, from the target's logits after it (alone, unpadded)."""
    logits = jnp.stack([sbj.forward(target, [p])[0, -1] for p in prompts])
    return np.asarray(choose(drafter.policy_graphdef, params["policy"], drafter.policy, logits)).tolist()


@pytest.mark.slow
def test_rows_decode_at_their_own_sizes_in_one_batch_token_identical_to_target_only(target, pilot):
    """generate at batch 8, rows of mixed chosen sizes: greedy output is target-only decoding's;
    each row reports its chosen size and drafts exactly as a DFlash drafter whose static block is
    that size (its tokens and tau, so its tree size, are that drafter's)."""
    task, drafter, params = pilot
    prompts = _prompts()[:8]
    chosen = _chosen(target, drafter, params, prompts)
    assert len(set(chosen)) >= 2  # the batch really mixes sizes
    opts = sbj.DecodeOptions(batch_size=8)
    spec = sbj.generate(target, prompts, drafter=sbj.LoadedDrafter(drafter, params), max_new_tokens=16, options=opts)
    ar = sbj.generate(target, prompts, max_new_tokens=16, options=opts)
    assert [r.token_ids for r in spec] == [a.token_ids for a in ar]
    assert [r.stats.block_size for r in spec] == chosen
    assert {r.stats.batch for r in spec} == {0}  # one batch
    for size in sorted(set(chosen)):
        rows = [i for i in range(len(prompts)) if chosen[i] == size]
        fixed = DFlashDrafter(task.config, task.graphdef, block_size=size)
        res = sbj.generate(target, [prompts[i] for i in rows], drafter=sbj.LoadedDrafter(fixed, params["dflash"]),
                           max_new_tokens=16, options=opts)
        assert [r.token_ids for r in res] == [spec[i].token_ids for i in rows]
        assert [r.stats.tau for r in res] == [spec[i].stats.tau for i in rows], size


@pytest.mark.slow
def test_a_prompt_chooses_and_samples_the_same_alone_and_in_a_batch_of_8(target, pilot):
    """The policy's choice (stats.block_size) for a prompt decoded alone equals its choice in a
    batch of 8 (padded to the batch's width) and the policy on its unpadded logits; sampled, each
    row's tokens and tau in the mixed batch are those it gets alone (same key stream), so a row
    follows the target's distribution as its own-size DFlash drafter does."""
    _, drafter, params = pilot
    prompts = _prompts()[:8]
    chosen = _chosen(target, drafter, params, prompts)
    assert len(set(chosen)) >= 2
    loaded = sbj.LoadedDrafter(drafter, params)
    kw = dict(sampling=sbj.Sampling(1.0), max_new_tokens=16, seed=2)
    mixed = sbj.generate(target, prompts, drafter=loaded, **kw, options=sbj.DecodeOptions(batch_size=8))
    alone = sbj.generate(target, prompts, drafter=loaded, **kw, options=sbj.DecodeOptions(batch_size=1))
    assert [r.stats.block_size for r in mixed] == [r.stats.block_size for r in alone] == chosen
    for m, a in zip(mixed, alone):
        assert m.token_ids == a.token_ids and m.stats.tau == a.stats.tau


class _Spy:
    """Records each executable `run_requests` runs: (function name, the loop drafter's static size)."""

    def __init__(self, monkeypatch):
        import specblock_jax.decoding.runner as decode_module
        import specblock_jax.decoding.refill as refill_module

        self.calls: list[tuple[str, int | None]] = []
        real = decode_module.compiled

        def spy(fn, static, *args, **kw):
            exe, seconds = real(fn, static, *args, **kw)
            loop = next((s for s in static if hasattr(s, "drafter")), None)
            size = None if loop is None or loop.drafter is None else loop.drafter.num_nodes

            def run(*a):
                self.calls.append((getattr(fn, "__qualname__", fn.__name__), size))
                return exe(*a)
            return run, seconds

        monkeypatch.setattr(decode_module, "compiled", spy)
        monkeypatch.setattr(refill_module, "compiled", spy)


@pytest.mark.slow
def test_one_prefill_per_batch_no_second_prefill(target, pilot, monkeypatch):
    """Static batches: each batch runs its prefill once (the loop's start, where the policy
    chooses) and then its decoding steps, nothing else; no routing prefill. A row's target
    forwards are that one prefill plus its decoding steps."""
    _, drafter, params = pilot
    rng = np.random.default_rng(11)
    prompts = _prompts() + [rng.integers(0, V, rng.integers(2, 15)).tolist() for _ in range(6)]
    spy = _Spy(monkeypatch)
    res = sbj.generate(target, prompts, drafter=sbj.LoadedDrafter(drafter, params), max_new_tokens=12,
                       options=sbj.DecodeOptions(batch_size=8, refill=False))
    names = [name for name, _ in spy.calls]
    assert names == ["SpeculativeLoop.start", "finish_loop"] * 2  # 16 prompts, 2 batches: 2 prefills
    for batch in (0, 1):  # the batch's longest row: 1 prefill + every decoding step the batch ran
        rows = [r for r in res if r.stats.batch == batch]
        assert max(r.stats.target_forwards for r in rows) == 1 + rows[0].stats.batch_steps
    # continuous batching: one prefill per request (the first batch's, then one insert per refill)
    spy.calls.clear()
    res = sbj.generate(target, prompts, drafter=sbj.LoadedDrafter(drafter, params), max_new_tokens=12,
                       options=sbj.DecodeOptions(batch_size=8, refill=True))
    starts = [name for name, _ in spy.calls if name in ("SpeculativeLoop.start", "insert_rows")]
    assert starts[0] == "SpeculativeLoop.start" and len(starts) <= 1 + len(prompts) - 8
    ar = sbj.generate(target, prompts, max_new_tokens=12, options=sbj.DecodeOptions(batch_size=8))
    assert [r.token_ids for r in res] == [a.token_ids for a in ar]


@pytest.mark.slow
def test_a_batch_compiles_one_loop_at_its_rows_largest_size(target, pilot, monkeypatch):
    """A batch whose rows chose two sizes {a, b} compiles its prefill and one loop, at max(a, b)
    (below max(sizes) when the batch's rows all chose less); a warm job compiles nothing."""
    from specblock_jax.decoding.compiled import compilation_count, on_compile

    _, drafter, params = pilot
    rng = np.random.default_rng(3)
    pool = [rng.integers(0, V, rng.integers(2, 15)).tolist() for _ in range(60)]
    chosen = _chosen(target, drafter, params, pool)
    counts = {s: chosen.count(s) for s in SIZES}
    pair = [s for s in SIZES if counts[s] >= 4][:2]  # the two smallest sizes with 4 prompts each
    assert len(pair) == 2, counts
    prompts = [p for p, c in zip(pool, chosen) if c == pair[0]][:4] + [p for p, c in zip(pool, chosen) if c == pair[1]][:4]
    spy = _Spy(monkeypatch)
    described: list[str] = []
    before = compilation_count()
    with on_compile(described.append):
        res = sbj.generate(target, prompts, drafter=sbj.LoadedDrafter(drafter, params), max_new_tokens=11,
                           options=sbj.DecodeOptions(batch_size=8))
    assert sorted({r.stats.block_size for r in res}) == pair
    assert compilation_count() - before == 2, described  # the prefill and one loop
    assert [d.split(",")[0] for d in described] == ["blockpilot SpeculativeLoop.start", "blockpilot finish_loop"]
    assert spy.calls[-1] == ("finish_loop", max(pair))
    before = compilation_count()  # warm: other prompts of the same sizes compile nothing
    sbj.generate(target, prompts[::-1], drafter=sbj.LoadedDrafter(drafter, params), max_new_tokens=11,
                 options=sbj.DecodeOptions(batch_size=8))
    assert compilation_count() == before


@pytest.mark.slow
def test_a_refilled_stream_runs_each_segment_at_its_live_rows_largest_size(target, pilot, monkeypatch):
    """Continuous batching: after each refill the stream's loop runs at the largest size its live
    rows chose, so a refilled request drafts at its own size (its tokens and tau as alone)."""
    _, drafter, params = pilot
    prompts = _prompts()
    chosen = _chosen(target, drafter, params, prompts)
    spy = _Spy(monkeypatch)
    loaded = sbj.LoadedDrafter(drafter, params)
    budgets = [4 + 3 * (i % 4) for i in range(len(prompts))]
    res = sbj.generate(target, prompts, drafter=loaded, max_new_tokens=budgets,
                       options=sbj.DecodeOptions(batch_size=2, refill=True))
    assert [r.stats.block_size for r in res] == chosen
    sizes = {size for name, size in spy.calls if name == "SpeculativeLoop.run"}
    assert sizes <= set(SIZES) and len(sizes) >= 2
    alone = sbj.generate(target, prompts, drafter=loaded, max_new_tokens=budgets, options=sbj.DecodeOptions(batch_size=1))
    for r, a in zip(res, alone):
        assert r.token_ids == a.token_ids and r.stats.tau == a.stats.tau


def test_key_index_makes_a_split_job_sample_as_the_whole(target):
    prompts = _prompts()
    kw = dict(sampling=sbj.Sampling(1.0), max_new_tokens=12, seed=7)
    whole = sbj.generate(target, prompts, **kw, options=sbj.DecodeOptions(batch_size=2))
    part = sbj.generate(target, prompts[3:7], **kw, options=sbj.DecodeOptions(batch_size=2, key_index=range(3, 7)))
    assert [r.token_ids for r in part] == [r.token_ids for r in whole[3:7]]
    shifted = sbj.generate(target, prompts[3:7], **kw, options=sbj.DecodeOptions(batch_size=2))  # other key streams
    assert [r.token_ids for r in shifted] != [r.token_ids for r in whole[3:7]]
    with pytest.raises(ValueError, match="key_index: got 2 values for 4 prompts"):
        sbj.generate(target, prompts[3:7], **kw, options=sbj.DecodeOptions(batch_size=2, key_index=[0, 1]))


def _separable(seed: int = 0) -> PolicyData:
    """200 points of 5 features, labelled by two thresholds; tau 3 at the labelled size, else 1."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(200, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 1).astype(np.int32)
    tau = np.stack([np.where(y == k, 3.0, 1.0) + rng.random(200) * 0.1 for k in range(3)], 1)
    return PolicyData(x, y, tau)


@pytest.mark.parametrize("loss", ["ce", "regret"])
def test_the_registered_policy_task_learns_a_separable_labelling(target, pilot, loss, tmp_path):
    """The "blockpilot" kind's task trains through the one trainer (full batch) and exports a
    drafter folder that loads with the policy it trained, standardisation included."""
    task_cls = registry.get("blockpilot").task
    data, heldout = _separable(0), _separable(1)
    task = task_cls({"sizes": list(SIZES), "top_k": 4, "width": 32, "dropout": 0.1, "loss": loss},
                    target, data, heldout)
    run = tmp_path / "run"
    cfg = {"run_dir": str(run), "out_dir": str(run / "export"), "lr": 3e-3, "b1": 0.9, "b2": 0.999,
           "weight_decay": 0.05, "max_steps": 150, "log_every": 1, "eval_every": 50, "ckpt_every": 150}
    summary = train(task, cfg, task.batches, task.evaluate)
    assert summary["train"]["accuracy"] > 0.9 and summary["heldout"]["accuracy"] > 0.85
    assert summary["last_train_record"]["loss"] < (0.4 if loss == "ce" else 0.3)
    assert summary["heldout"]["mean_tau_chosen"] > 0.9 * summary["heldout"]["mean_tau_oracle"]
    assert [r["step"] for r in summary["eval_history"]] == [50, 100, 150]
    assert summary["eval_accuracy"] == summary["heldout"]["accuracy"]
    assert summary["tokens_seen"] == 150 * 200  # a full batch of 200 prompts a step
    # the export drives a DFlash folder beside it ("../dflash") and holds the trained policy
    _, drafter, params = pilot
    save_drafter(drafter.dflash, params["dflash"]["draft"], run / "dflash", dtype="float32")
    loaded, lp = load_drafter(run / "export", target)
    assert loaded.policy.sizes == SIZES and loaded.policy.in_dim == 5
    from flax import nnx
    policy = nnx.merge(loaded.policy_graphdef, lp["policy"])
    pred = np.asarray(jnp.argmax(policy(jnp.asarray(heldout.features)), -1))
    assert np.mean(pred == heldout.labels) == summary["heldout"]["accuracy"]
    np.testing.assert_allclose(np.asarray(lp["policy"]["mean"]), data.features.mean(0), rtol=1e-6)


def test_save_and_load_round_trip(target, pilot, tmp_path):
    task, drafter, params = pilot
    save_drafter(drafter.dflash, params["dflash"]["draft"], tmp_path / "dflash", dtype="float32")
    save_blockpilot(tmp_path / "bp", drafter.policy, params["policy"], "../dflash")
    loaded, lp = load_drafter(tmp_path / "bp", target)
    assert isinstance(loaded, BlockPilotDrafter) and loaded.policy == drafter.policy
    assert loaded.num_nodes == max(SIZES)
    for a, b in zip(jax.tree.leaves(params["policy"]), jax.tree.leaves(lp["policy"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(params["dflash"]["draft"]), jax.tree.leaves(lp["dflash"]["draft"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    logits = jax.random.normal(jax.random.key(0), (6, V)) * 3
    np.testing.assert_array_equal(choose(loaded.policy_graphdef, lp["policy"], loaded.policy, logits),
                                  choose(drafter.policy_graphdef, params["policy"], drafter.policy, logits))


@pytest.mark.slow
def test_shipped_blockpilot_drafter_loads_and_is_lossless():
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    target = sbj.load_target(root / "assets" / "target")
    folder = root / "assets" / "drafters" / "blockpilot"
    drafter, params = sbj.load_drafter(folder, target)
    assert isinstance(drafter, BlockPilotDrafter) and drafter.num_nodes == max(drafter.policy.sizes)
    # issue 58: the window B-2..B+2 around its DFlash's training block, and the DFlash it drives is
    # the one its labels were measured with (benchmarks/blockpilot_window/labels/*/settings.json)
    import hashlib
    trained = json.loads((folder / "../dflash/config.json").read_text())["config"]["block_size"]
    assert drafter.policy.sizes == tuple(range(trained - 2, trained + 3))
    meta = json.loads((folder / "config.json").read_text())
    label_dflash = json.loads((root / "benchmarks/blockpilot_window/labels/train/settings.json").read_text())["dflash"]
    assert (root / label_dflash).resolve() == (folder / meta["dflash_dir"]).resolve()
    digest = hashlib.sha256((folder / meta["dflash_dir"] / "model.safetensors").read_bytes()).hexdigest()
    assert meta["labels_dflash_sha256"] == digest
    lines = (root / "assets/prompts/heldout.jsonl").read_text().splitlines()[:4]
    prompts = [json.loads(x)["prompt"] for x in lines]
    ar = sbj.generate(target, prompts, max_new_tokens=32, options=sbj.DecodeOptions(batch_size=4))
    spec = sbj.generate(target, prompts, drafter=sbj.LoadedDrafter(drafter, params), max_new_tokens=32,
                        options=sbj.DecodeOptions(batch_size=4))
    assert [s.token_ids for s in spec] == [a.token_ids for a in ar]


def test_specblock_train_runs_the_blockpilot_cli(capsys):
    from specblock_jax_cli.train import cli
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["blockpilot", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: specblock-train blockpilot") and "{labels,train}" in out
    with pytest.raises(SystemExit) as exit_info:  # its own arguments, checked by its parser
        cli.main(["blockpilot", "labels", "--prompts", "p.jsonl"])
    assert exit_info.value.code == 2 and "--out" in capsys.readouterr().err


@pytest.mark.slow
def test_specblock_train_blockpilot_train_makes_a_drafter_from_label_folders(tmp_path, capsys):
    """`specblock-train blockpilot train` on a label folder (written here): the shipped target's
    prefill features, the registered task through the trainer, a drafter folder that drives the
    shipped DFlash drafter and chooses as its report says."""
    from pathlib import Path

    from specblock_jax_cli.train import cli
    root = Path(__file__).resolve().parents[1]
    prompts = root / "assets" / "prompts" / "heldout.jsonl"
    records = [json.loads(x) for x in prompts.read_text().splitlines()[:6]]
    labels = tmp_path / "labels"
    taus = {4: [2.0, 1.0, 1.0, 2.0, 1.0, 1.0], 6: [1.0, 2.5, 1.0, 1.0, 2.5, 1.0], 8: [1.0, 1.0, 3.0, 1.0, 1.0, 3.0]}
    _label_folder(labels, taus, {4: 10.0, 6: 12.0, 8: 14.0}, ids=[r["id"] for r in records])
    dflash = root / "assets" / "drafters" / "dflash"
    (labels / "settings.json").write_text(json.dumps({"prompts": str(prompts), "dflash": str(dflash)}))
    out = tmp_path / "bp"
    cli.main(["blockpilot", "train", "--target", str(root / "assets" / "target"), "--labels", str(labels),
              "--eval-labels", str(labels), "--steps", "30", "--width", "16", "--run-dir", str(tmp_path / "runs"),
              "--out", str(out), "--dflash-dir", str(dflash)])
    report = json.loads((out / "report.json").read_text())
    assert (report["metric"], report["loss"], report["policy"]["sizes"]) == ("speed", "ce", [4, 6, 8])
    assert report["train"]["mean_tau_oracle"] == pytest.approx(np.mean([2.0, 2.5, 3.0, 2.0, 2.5, 3.0]))
    summary = json.loads((tmp_path / "runs" / "topk_speed_ce" / "summary.json").read_text())
    assert summary["steps"] == 30 and summary["train"] == report["train"]
    from specblock_jax.drafters.blockpilot._model import file_sha256
    meta = json.loads((out / "config.json").read_text())  # paired with the labels' DFlash drafter
    assert meta["labels_dflash_sha256"] == file_sha256(dflash / "model.safetensors")
    target = sbj.load_target(root / "assets" / "target")
    drafter, params = sbj.load_drafter(out, target)
    assert isinstance(drafter, BlockPilotDrafter) and drafter.policy.sizes == (4, 6, 8)
    x = prefill_features(target, [r["prompt"] for r in records], "topk", 32)
    from flax import nnx
    pred = np.asarray(jnp.argmax(nnx.merge(drafter.policy_graphdef, params["policy"])(jnp.asarray(x)), -1))
    assert np.bincount(pred, minlength=3).tolist() == report["train"]["predicted_counts"]


def test_oracle_labels_break_ties_toward_the_training_size():
    from specblock_jax.drafters.blockpilot._labels import oracle_labels
    sizes = [4, 8, 16]
    score = np.asarray([[2.0, 2.0, 2.0],    # three-way tie -> 16 (the training size)
                        [2.5, 2.5, 1.0],    # 4 and 8 tie -> 8 (nearer 16)
                        [3.0, 1.0, 1.0],    # a clear winner is kept
                        [1.0, 2.0, 2.0 - 1e-12]])  # equal within 1e-9 -> 16
    assert oracle_labels(score, sizes, prefer=16) == [2, 1, 0, 2]
    assert oracle_labels(score, sizes) == [0, 0, 0, 1]  # no preference: the smaller size
    assert oracle_labels(np.asarray([[1.0, 1.0, 1.0]]), [12, 14, 18], prefer=16) == [1]  # 14, 18 both 2 away


def _label_folder(folder, taus: dict[int, list[float]], step_ms: dict[int, float] | None, ids=None):
    folder.mkdir(parents=True, exist_ok=True)
    ids = ids or [f"p{i}" for i in range(len(next(iter(taus.values()))))]
    for size, row in taus.items():
        (folder / f"size_{size}.jsonl").write_text("".join(json.dumps({"id": i, "tau": t}) + "\n"
                                                          for i, t in zip(ids, row)))
    if step_ms is not None:
        (folder / "costs.json").write_text(json.dumps({"step_ms": {str(s): ms for s, ms in step_ms.items()}}))


def test_speed_labels_divide_each_prompts_tau_by_its_sizes_step_cost(tmp_path):
    from specblock_jax.drafters.blockpilot._labels import read_labels
    taus = {4: [2.0, 3.0, 1.5], 8: [3.0, 3.2, 1.5], 16: [3.2, 6.0, 1.5]}
    _label_folder(tmp_path / "a", taus, {4: 10.0, 8: 12.0, 16: 20.0})
    ids, sizes, tau, by_tau = read_labels(tmp_path / "a", "tau", prefer=8)
    assert ids == ["p0", "p1", "p2"] and sizes == [4, 8, 16] and by_tau == [2, 2, 1]  # p2: a tie -> 8
    # speed = tau / ms at 4 / 8 / 16: p0 0.200 / 0.250 / 0.160 -> 8; p1 0.300 / 0.267 / 0.300 -> a
    # 4-16 tie, both 4 away from 8 -> the smaller, 4; p2 equal taus -> the cheapest, 4
    assert read_labels(tmp_path / "a", "speed", prefer=8)[3] == [1, 0, 0]
    _label_folder(tmp_path / "b", taus, {4: 10.0, 8: 12.0})
    with pytest.raises(ValueError, match=r"costs.json: no step cost for sizes \[16\]"):
        read_labels(tmp_path / "b", "speed")


@pytest.mark.slow
def test_label_files_resume_without_repeating_a_prompt_or_a_profile(target, pilot, tmp_path):
    from specblock_jax.drafters.blockpilot._labels import read_labels
    from specblock_jax.drafters.blockpilot import write_labels
    task, drafter, params = pilot
    save_drafter(drafter.dflash, params["dflash"]["draft"], tmp_path / "dflash", dtype="float32")
    rng = np.random.default_rng(0)
    records = [{"id": f"r{i}", "prompt": rng.integers(0, V, 5 + i).tolist()} for i in range(5)]
    out = tmp_path / "labels"
    out.mkdir()
    kw = dict(max_new_tokens=8, batch_size=2, cost_prompts=2)
    write_labels(target, tmp_path / "dflash", records[:3], [2, 4], out, **kw)
    first = json.loads((out / "costs.json").read_text())
    assert set(first["step_ms"]) == {"2", "4"} and first["prompts"] == 2
    with (out / "size_4.jsonl").open("a") as f:
        f.write('{"id": "r3", "ta')  # a kill mid-write
    write_labels(target, tmp_path / "dflash", records, [2, 4], out, **kw)
    for size in (2, 4):
        ids = [json.loads(x)["id"] for x in (out / f"size_{size}.jsonl").read_text().splitlines()]
        assert ids == [r["id"] for r in records]  # each once, in order, the torn line dropped
    assert json.loads((out / "costs.json").read_text()) == first  # sizes already profiled: kept
    alone = tmp_path / "alone"
    alone.mkdir()
    write_labels(target, tmp_path / "dflash", records, [2, 4], alone, **{**kw, "cost_prompts": 0})
    assert read_labels(out, "tau")[2].tolist() == read_labels(alone, "tau")[2].tolist()


@pytest.mark.parametrize("path", ["configs/drafters/blockpilot.yaml", "configs/drafters/blockpilot-v2.yaml"])
def test_blockpilot_configs_set_only_known_keys(path, tmp_path):
    from pathlib import Path

    import yaml

    from specblock_jax.drafters.blockpilot import apply_config, parsers
    p, subparsers = parsers("x")
    apply_config(Path(path), subparsers)
    cfg = yaml.safe_load(Path(path).read_text())
    args = p.parse_args(["train"])  # the YAML filled the required flags
    assert args.labels == cfg["train"]["labels"] and args.metric == cfg["train"]["metric"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"labels": {"size": "4,8"}}))
    with pytest.raises(SystemExit, match=r"bad.yaml: labels: unknown keys \['size'\]"):
        apply_config(bad, parsers("x")[1])


@pytest.mark.slow
def test_an_oracle_gives_each_prompt_its_size_in_place_of_the_policy(target, pilot):
    """`oracle` (specblock-bench's :oracle=LABELS): each prompt decodes at the size its table entry
    names, in one batch, as it does alone with a DFlash drafter of that size; a prompt missing
    from the table is an error."""
    task, drafter, params = pilot
    prompts = _prompts()[:8]
    given = [SIZES[i % len(SIZES)] for i in range(len(prompts))]
    oracle = dataclasses.replace(drafter, oracle={tuple(p): s for p, s in zip(prompts, given)})
    assert oracle == drafter  # the table is not part of the compiled loops' key
    res = sbj.generate(target, prompts, drafter=sbj.LoadedDrafter(oracle, params), max_new_tokens=12,
                       options=sbj.DecodeOptions(batch_size=8))
    assert [r.stats.block_size for r in res] == given
    for i in (0, 1, 2):
        fixed = DFlashDrafter(task.config, task.graphdef, block_size=given[i])
        alone = sbj.generate(target, [prompts[i]], drafter=sbj.LoadedDrafter(fixed, params["dflash"]),
                             max_new_tokens=12)[0]
        assert res[i].token_ids == alone.token_ids and res[i].stats.tau == alone.stats.tau
    with pytest.raises(ValueError, match="oracle: prompt 0 .* no entry in the oracle's table"):
        sbj.generate(target, [[1, 2, 3, 4, 5, 6, 7, 0, 0, 1, 1, 1, 1, 1, 1, 1]], drafter=sbj.LoadedDrafter(oracle, params))


def test_a_policy_loads_only_with_the_dflash_drafter_its_labels_came_from(target, pilot, tmp_path):
    """save_blockpilot(labels_dflash=) records the SHA-256 of the labelling DFlash drafter's
    model.safetensors; load_blockpilot refuses a folder driving another DFlash drafter, and loads
    a folder without the record with one warning."""
    import warnings

    from specblock_jax.drafters.blockpilot._model import file_sha256

    _, drafter, params = pilot
    save_drafter(drafter.dflash, params["dflash"]["draft"], tmp_path / "dflash", dtype="float32")
    other = jax.tree.map(lambda x: x + 1.0, params["dflash"]["draft"])
    save_drafter(drafter.dflash, other, tmp_path / "other", dtype="float32")
    save_blockpilot(tmp_path / "bp", drafter.policy, params["policy"], "../dflash", labels_dflash=tmp_path / "dflash")
    meta = json.loads((tmp_path / "bp" / "config.json").read_text())
    assert meta["labels_dflash_sha256"] == file_sha256(tmp_path / "dflash" / "model.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a paired folder loads without a warning
        load_drafter(tmp_path / "bp", target)
    save_blockpilot(tmp_path / "bad", drafter.policy, params["policy"], "../other", labels_dflash=tmp_path / "dflash")
    with pytest.raises(ValueError, match=r"bad: its policy was trained on labels from a DFlash drafter .* but it "
                                         r"drives .*other"):
        load_drafter(tmp_path / "bad", target)
    save_blockpilot(tmp_path / "old", drafter.policy, params["policy"], "../dflash")  # no record
    with pytest.warns(UserWarning, match="labels_dflash_sha256"):
        load_drafter(tmp_path / "old", target)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per folder
        load_drafter(tmp_path / "old", target)


def test_oracle_table_maps_each_labelled_prompt_to_its_fastest_size(tmp_path):
    from specblock_jax.drafters.blockpilot._labels import oracle_table
    taus = {4: [2.0, 3.0, 1.5], 8: [3.0, 3.2, 1.5], 16: [3.2, 6.0, 1.5]}
    _label_folder(tmp_path, taus, {4: 10.0, 8: 12.0, 16: 20.0})
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(["12", "345", "6"])))
    (tmp_path / "settings.json").write_text(json.dumps({"prompts": str(prompts)}))
    encode = lambda texts: [[int(c) for c in t] for t in texts]  # noqa: E731
    # as in test_speed_labels_...: p0 -> 8, p1 -> 4, p2 -> 4
    assert oracle_table(tmp_path, encode, (4, 8, 16), prefer=8) == {(1, 2): 8, (3, 4, 5): 4, (6,): 4}
    with pytest.raises(ValueError, match=r"labels for sizes \[4, 8, 16\], the drafter has \[4, 8\]"):
        oracle_table(tmp_path, encode, (4, 8), prefer=8)
