"""The one trainer and the `specblock-train` CLI, with a tiny bigram TrainTask.

The bigram "drafter" (embedding -> logits of the next token) trains on synthetic regen-style
records; its decoding drafter is prompt lookup, so evaluation runs real speculative decoding on a
tiny random target.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
import yaml

import specblock_jax as sbj
from specblock_jax.drafters.prompt_lookup import PromptLookup
from specblock_jax.drafters import registry
from specblock_jax.training.regen_dataset import BatchIterator, RegenDataset, is_validation
from specblock_jax.training.task import parse_settings
from specblock_jax.trainer.trainer import (TRAINER_DEFAULTS, lr_schedule, make_optimizer, make_train_step,
                                            tau_evaluator, train, with_defaults)
from specblock_jax_cli.train import cli

VOCAB = 64
TIMING = ("tokens_per_s", "elapsed_s", "eval_s")
EVAL_PROMPTS = [[0, 5, 6, 7, 5, 6, 7, 5, 6], [0, 9, 10, 9, 10, 9, 10]]


class BigramTask:
    """logits(next | token) = embed[token] @ out + frozen bias; the step key adds input noise."""

    def __init__(self, cfg: dict, target: sbj.Target):
        self.vocab, self.dim = target.config.vocab_size, cfg.get("dim", 16)
        self.bias = jnp.zeros((self.vocab,), jnp.float32)

    def init_params(self, key: jax.Array) -> dict:
        k1, k2 = jax.random.split(key)
        return {"embed": 0.1 * jax.random.normal(k1, (self.vocab, self.dim)),
                "out": 0.1 * jax.random.normal(k2, (self.dim, self.vocab))}

    def frozen(self) -> dict:
        return {"bias": self.bias}

    def loss_fn(self, params, frozen, batch, key):
        tokens = batch["tokens"]
        mask = batch["loss_mask"][:, :-1].astype(jnp.float32)
        h = params["embed"][tokens[:, :-1]]
        h = h + 0.01 * jax.random.normal(key, h.shape)
        logits = h @ params["out"] + frozen["bias"]
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
        denom = jnp.maximum(mask.sum(), 1.0)
        acc = ((jnp.argmax(logits, -1) == tokens[:, 1:]) * mask).sum() / denom
        return (ce * mask).sum() / denom, {"acc_0": acc}

    def decoding_drafter(self, params):
        return sbj.LoadedDrafter(PromptLookup(), ())

    def export(self, params, out_dir: str) -> None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        np.savez(Path(out_dir) / "params.npz", **jax.device_get(params))


def records(n: int, vocab: int = VOCAB, seed: int = 0, prefix: str = "r") -> list[dict]:
    """Regen-style records: BOS, two prompt tokens, then a counting response ending in EOS (1)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        a = int(rng.integers(3, vocab - 12))
        out.append({"id": f"{prefix}{i}", "mode": "greedy", "prompt_ids": [0, a, a + 1],
                    "response_ids": list(range(a + 2, a + 10)) + [1]})
    return out


def base_cfg(run: Path, **changes) -> dict:
    cfg = {"run_dir": str(run), "out_dir": str(run / "export"), "seed": 0, "lr": 0.05,
           "warmup_steps": 2, "max_steps": 12, "log_every": 1, "ckpt_every": 4,
           "keep_checkpoints": 2, "eval_every": 6, "eval_max_new_tokens": 16, "eval_batch_size": 2}
    return {**cfg, **changes}


def factory(source: list[dict], seen: list | None = None, kill_at: int | None = None):
    """data_iter_factory over `source` (batch 4, length 16); records the states it is given;
    kill_at=k raises KeyboardInterrupt on the k-th batch (an interruption mid-run)."""

    def make(state):
        if seen is not None:
            seen.append(state)
        it = BatchIterator(source, batch_size=4, max_len=16, seed=0, state=state)
        if kill_at is None:
            return it

        class Killed:
            calls = 0

            def __next__(self):
                Killed.calls += 1
                if Killed.calls == kill_at:
                    raise KeyboardInterrupt
                return next(it)

            get_state = it.get_state

        return Killed()

    return make


def latest_state(run: Path):
    mngr = ocp.CheckpointManager((run / "checkpoints").absolute())
    step = mngr.latest_step()
    restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                          meta=ocp.args.JsonRestore()))
    return step, restored.state, restored.meta, mngr.all_steps()


def log_records(run: Path, drop_timing: bool = True) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in recs] if drop_timing else recs


def train_drafter(task, cfg: dict, target, data_iter_factory, prompts=EVAL_PROMPTS) -> dict:
    """`train` with the tau evaluation over `prompts`, as a drafter run has it."""
    return train(task, cfg, data_iter_factory, tau_evaluator(task, target, prompts, cfg))


@pytest.fixture(scope="module")
def target():
    return sbj.init_target(sbj.models.config.tiny(vocab_size=VOCAB, eos_token_ids=(1,)), seed=0)


@pytest.fixture(scope="module")
def data():
    return records(24)


@pytest.fixture(scope="module")
def full_run(target, data, tmp_path_factory):
    """An uninterrupted 12-step run: (run dir, summary)."""
    run = tmp_path_factory.mktemp("full")
    task = BigramTask({}, target)
    return run, train_drafter(task, base_cfg(run), target, factory(data))


# ---------------------------------------------------------------------------- optimizer/step

def test_train_step_reduces_loss_on_a_fixed_batch_and_donates_params_only(target, data):
    task = BigramTask({}, target)
    cfg = with_defaults(base_cfg(Path("unused"), max_steps=30, warmup_steps=0))
    tx, _ = make_optimizer(cfg)
    step = make_train_step(task, tx)
    batch = next(BatchIterator(data, batch_size=8, max_len=16, seed=0))
    params = task.init_params(jax.random.key(0))
    first_params = params
    opt_state, frozen = tx.init(params), task.frozen()
    losses = []
    for i in range(30):
        params, opt_state, metrics = step(params, opt_state, frozen, batch, jax.random.key(i))
        losses.append(float(metrics["loss"]))
        assert set(metrics) == {"loss", "acc_0", "grad_norm"}
    assert losses[-1] < 0.3 * losses[0], losses
    assert float(metrics["acc_0"]) > 0.9
    assert all(x.is_deleted() for x in jax.tree.leaves(first_params))  # donated
    assert not frozen["bias"].is_deleted()  # not donated
    np.testing.assert_array_equal(np.asarray(frozen["bias"]), 0.0)


def test_lr_schedule_warmup_then_cosine_to_floor():
    sched = lr_schedule({"lr": 1.0, "min_lr_ratio": 0.1, "warmup_steps": 4, "max_steps": 13})
    np.testing.assert_allclose([float(sched(i)) for i in range(4)], [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(float(sched(4)), 1.0, rtol=1e-6)
    np.testing.assert_allclose(float(sched(8)), 0.55, rtol=1e-6)  # halfway down the cosine
    np.testing.assert_allclose(float(sched(12)), 0.1, rtol=1e-6)
    values = [float(sched(i)) for i in range(4, 13)]
    assert all(a > b for a, b in zip(values, values[1:]))


def test_reserved_metric_names_are_refused(target, data):
    class Clashing(BigramTask):
        def loss_fn(self, params, frozen, batch, key):
            loss, _ = super().loss_fn(params, frozen, batch, key)
            return loss, {"lr": loss}

    task = Clashing({}, target)
    tx, _ = make_optimizer(with_defaults(base_cfg(Path("unused"))))
    params = task.init_params(jax.random.key(0))
    batch = next(BatchIterator(data, batch_size=4, max_len=16))
    with pytest.raises(ValueError, match=r"task metric names \['lr'\] are reserved"):
        make_train_step(task, tx)(params, tx.init(params), task.frozen(), batch, jax.random.key(0))


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ValueError, match="'run_dir' must be set"):
        with_defaults({"out_dir": "x"})
    with pytest.raises(ValueError, match="'max_steps' must be an integer >= 1"):
        with_defaults(base_cfg(tmp_path, max_steps=0))
    with pytest.raises(ValueError, match="'time_budget_min' must be a number > 0 or null"):
        with_defaults(base_cfg(tmp_path, time_budget_min=-1))
    with pytest.raises(ValueError, match="'stop_min_gain' must be a number >= 0 or null"):
        with_defaults(base_cfg(tmp_path, stop_min_gain=-0.1))
    with pytest.raises(ValueError, match="'stop_min_gain' needs eval_every >= 1"):
        with_defaults(base_cfg(tmp_path, stop_min_gain=0.02, eval_every=0))


# ------------------------------------------------------------------------------- train runs

def test_metrics_log_eval_checkpoints_export_and_summary(full_run, target):
    run, summary = full_run
    recs = log_records(run, drop_timing=False)
    train_recs = [r for r in recs if "loss" in r]
    eval_recs = [r for r in recs if "eval_tau_mean" in r]
    assert [r["step"] for r in train_recs] == list(range(1, 13))
    for r in train_recs:
        assert set(r) == {"step", "loss", "acc_0", "lr", "grad_norm", "tokens_seen", "tokens_per_s",
                          "elapsed_s", "flops"}
        assert r["tokens_seen"] == r["step"] * 4 * 12  # cumulative: 4 rows x 12 real tokens a step
        assert r["tokens_per_s"] > 0 and r["grad_norm"] > 0
        assert r["flops"] == pytest.approx(r["step"] * summary["flops_per_step"])  # cumulative
    assert train_recs[-1]["loss"] < train_recs[0]["loss"]
    assert train_recs[0]["lr"] == pytest.approx(0.025) and train_recs[1]["lr"] == pytest.approx(0.05)
    assert [r["step"] for r in eval_recs] == [6, 12]
    # tau is that of real speculative decoding with the task's drafter
    expected = [r.stats.tau for r in sbj.generate(target, EVAL_PROMPTS, drafter=sbj.load_drafter("prompt_lookup", target), max_new_tokens=16,
                                                  sampling=sbj.Sampling(0))]
    for r in eval_recs:
        assert r["eval_prompts"] == 2
        assert r["eval_tau_mean"] == pytest.approx(np.mean(expected))
        assert r["eval_tau_median"] == pytest.approx(np.median(expected))
        assert r["eval_tau_mean"] >= 1.0
    step, state, meta, kept = latest_state(run)
    assert step == 12 and kept == [8, 12]
    assert meta["data"] == {"epoch": 2, "batch": 0}  # 24 examples / 4 per batch = 6 per epoch
    assert meta["tokens_seen"] == 12 * 4 * 12  # 12 steps x 4 rows x 12 real tokens
    exported = np.load(run / "export" / "params.npz")
    np.testing.assert_array_equal(exported["embed"], state["params"]["embed"])
    saved = json.loads((run / "summary.json").read_text())
    assert saved["steps"] == summary["steps"] == 12 and saved["stop_reason"] == "max_steps"
    assert saved["eval_tau_mean"] == eval_recs[-1]["eval_tau_mean"]
    assert [e["step"] for e in saved["eval_history"]] == [6, 12]
    assert saved["last_train_record"]["step"] == 12
    assert saved["flops_per_step"] > 0 and saved["train_flops"] == pytest.approx(12 * saved["flops_per_step"])


def test_kill_and_resume_is_bit_identical(full_run, target, data, tmp_path):
    full_dir, _ = full_run
    run = tmp_path / "killed"
    task = BigramTask({}, target)
    with pytest.raises(KeyboardInterrupt):  # killed while fetching the 10th batch
        train_drafter(task, base_cfg(run), target, factory(data, kill_at=10))
    assert latest_state(run)[0] == 8
    assert max(r["step"] for r in log_records(run)) == 9  # step 9 will be redone
    assert not (run / "summary.json").exists()

    states = []
    summary = train_drafter(BigramTask({}, target), base_cfg(run), target, factory(data, states))
    assert states == [{"epoch": 1, "batch": 2}]  # resumed at step 8, data included
    assert summary["steps"] == 12
    step_a, state_a, meta_a, _ = latest_state(full_dir)
    step_b, state_b, meta_b, _ = latest_state(run)
    assert step_a == step_b == 12
    for a, b in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b), strict=True):
        np.testing.assert_array_equal(a, b)
    assert meta_a["data"] == meta_b["data"] and meta_a["tokens_seen"] == meta_b["tokens_seen"]
    assert log_records(run) == log_records(full_dir)

    # a larger max_steps continues the finished run (under the new, longer LR schedule)
    states = []
    summary = train_drafter(BigramTask({}, target), base_cfg(run, max_steps=15), target,
                            factory(data, states))
    assert states == [{"epoch": 2, "batch": 0}] and summary["steps"] == 15
    recs = log_records(run)
    assert [r["step"] for r in recs if "loss" in r] == list(range(1, 16))
    assert [r["step"] for r in recs if "eval_tau_mean" in r] == [6, 12, 15]
    assert latest_state(run)[0] == 15


def test_time_budget_stops_the_run(target, data, tmp_path):
    cfg = base_cfg(tmp_path, time_budget_min=1e-6, eval_every=0)
    summary = train_drafter(BigramTask({}, target), cfg, target, factory(data), prompts=[])
    assert summary["stop_reason"] == "time_budget" and summary["steps"] == 1
    assert "eval_tau_mean" not in summary and summary["eval_history"] == []
    assert latest_state(tmp_path)[0] == 1
    assert (tmp_path / "export" / "params.npz").exists()


def test_a_plateau_stops_the_run_and_survives_a_resume(target, data, tmp_path):
    """With stop_min_gain the run evaluates at its start, then every eval_every steps, and stops
    after the first evaluation that gains less than the fraction over the one before (here
    1.0 -> 1.5 -> 1.52: +1.3% < 2% at step 4); a rerun on the finished run dir stays stopped."""
    scores = iter([1.0, 1.5, 1.52, 9.0])
    evaluate = lambda params: {"score": next(scores)}  # noqa: E731
    cfg = base_cfg(tmp_path, max_steps=12, eval_every=2, stop_min_gain=0.02, stop_metric="score")
    summary = train(BigramTask({}, target), cfg, factory(data), evaluate)
    assert summary["stop_reason"] == "plateau" and summary["steps"] == 4
    assert [(e["step"], e["score"]) for e in summary["eval_history"]] == [(0, 1.0), (2, 1.5), (4, 1.52)]
    assert latest_state(tmp_path)[0] == 4
    again = train(BigramTask({}, target), cfg, factory(data), lambda params: {"score": 0.0})
    assert again["stop_reason"] == "plateau" and again["steps"] == 4
    with pytest.raises(ValueError, match="stop_metric 'missing' is not in the evaluation records"):
        train(BigramTask({}, target), {**cfg, "run_dir": str(tmp_path / "b"), "stop_metric": "missing"},
              factory(data), lambda params: {"score": 1.0})
    assert [r["step"] for r in log_records(tmp_path / "b")] == [0]  # refused at the start, before training


@pytest.mark.slow
def test_a_tasks_own_optimizer_evaluation_and_export_fields(target, data, tmp_path):
    """A task may bring its optimizer (here: plain SGD at a constant LR); `evaluate` results are
    logged and its last one, with the fields `export` returns, lands in the summary."""

    class Own(BigramTask):
        def optimizer(self, cfg):
            return optax.sgd(0.5), optax.constant_schedule(0.5)

        def export(self, params, out_dir):
            super().export(params, out_dir)
            return {"exported_norm": float(optax.tree.norm(params))}

    task = Own({}, target)
    first = task.init_params(jax.random.key(0))  # the trainer's init (seed 0)
    train(task, base_cfg(tmp_path / "one", max_steps=1, eval_every=0), factory(data))
    batch = next(factory(data)(None))
    key = jax.random.fold_in(jax.random.key(0), 0)  # step 0's key
    grads = jax.grad(lambda p: task.loss_fn(p, task.frozen(), batch, key)[0])(first)
    _, state, _, _ = latest_state(tmp_path / "one")
    for got, p, g in zip(*(jax.tree.leaves(t) for t in (state["params"], first, grads)), strict=True):
        np.testing.assert_allclose(got, p - 0.5 * g, rtol=1e-5, atol=1e-7)  # one SGD step, not AdamW

    evaluate = lambda params: {"val_norm": float(optax.tree.norm(params))}  # noqa: E731
    summary = train(task, base_cfg(tmp_path / "five", max_steps=5, eval_every=2), factory(data), evaluate)
    recs = log_records(tmp_path / "five")
    assert [r["lr"] for r in recs if "loss" in r] == [0.5] * 5
    evals = [r for r in recs if "loss" not in r]
    assert [r["step"] for r in evals] == [2, 4, 5]  # every eval_every steps, and at the end
    assert [e["step"] for e in summary["eval_history"]] == [2, 4, 5]
    _, state, _, _ = latest_state(tmp_path / "five")
    final_norm = float(optax.tree.norm(state["params"]))
    assert summary["val_norm"] == evals[-1]["val_norm"] == pytest.approx(final_norm)
    assert summary["exported_norm"] == pytest.approx(final_norm)

    with pytest.raises(ValueError, match=r"evaluation names \['loss'\] are reserved"):
        train(task, base_cfg(tmp_path / "bad", max_steps=2, eval_every=1), factory(data),
              lambda params: {"loss": 0.0})


# -------------------------------------------------------------------------------- registry

def _no_load(*args):
    raise AssertionError("the bigram kind has no drafter folders")


BIGRAM = registry.DrafterKind("bigram", load=_no_load, task=BigramTask)


def test_register_refuses_reserved_conflicting_and_malformed_kinds(monkeypatch):
    registry.kinds()  # import every built-in kind first: the patched copy below then holds them all
    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))
    registry.register(BIGRAM)
    registry.register(BIGRAM)  # the same entry again (a module imported twice): a no-op
    assert registry.get("bigram") is BIGRAM
    with pytest.raises(ValueError, match="'bigram' is already registered"):
        registry.register(registry.DrafterKind("bigram", load=_no_load))
    with pytest.raises(ValueError, match="'target' is reserved"):
        registry.register(registry.DrafterKind("target", load=_no_load))
    with pytest.raises(ValueError, match="letter"):
        registry.register(registry.DrafterKind("a b", load=_no_load))
    with pytest.raises(ValueError, match="unknown drafter kind 'no_such_kind'"):
        registry.get("no_such_kind")


def test_kind_settings_are_typed_and_checked(target):
    from specblock_jax.drafters.eagle3._train import Eagle3Task, Eagle3TrainConfig
    s = parse_settings(Eagle3TrainConfig, {"feature_layers": [1, 2, 3], "ttt_decay": 1, "ttt_steps": 3})
    assert s == Eagle3TrainConfig(feature_layers=(1, 2, 3), ttt_decay=1.0, ttt_steps=3)
    with pytest.raises(ValueError, match=r"eagle3: unknown setting\(s\) \['ttt_step'\]"):
        Eagle3Task({"ttt_step": 3}, target)
    with pytest.raises(ValueError, match=r"ttt_steps='4': expected int"):
        parse_settings(Eagle3TrainConfig, {"ttt_steps": "4"})
    with pytest.raises(ValueError, match=r"top_k=True: expected int"):
        parse_settings(Eagle3TrainConfig, {"top_k": True})


@pytest.mark.parametrize("kind", ["eagle3", "specblock", "dflash"])
def test_shipped_configs_parse_and_code_defaults_agree_with_them(kind):
    """Every key of a shipped drafter YAML is a run, trainer or kind key, and the kind's defaults
    in code are the values its shipped YAML sets (no default that silently disagrees)."""
    cfg = yaml.safe_load(Path(f"configs/drafters/{kind}.yaml").read_text())
    own = {k: v for k, v in cfg.items() if k not in {**cli.CLI_DEFAULTS, **TRAINER_DEFAULTS}}
    settings_cls = registry.get(kind).task.Settings
    assert own == {k: v for k, v in cli.kind_defaults(kind).items() if k in own}
    assert set(own) == set(cli.kind_defaults(kind))  # the YAML documents every kind key
    parse_settings(settings_cls, own)


@pytest.mark.parametrize("path,kind", [("configs/drafters/eagle3-v2.yaml", "eagle3"),
                                       ("configs/drafters/specblock-v2.yaml", "specblock"),
                                       ("configs/drafters/specblock-v2-data.yaml", "specblock"),
                                       ("configs/drafters/dflash-v2.yaml", "dflash"),
                                       ("configs/drafters/dflash-v2-plateau.yaml", "dflash")])
def test_variant_configs_use_only_known_keys(path, kind):
    """A shipped variant YAML (another target, other budgets) sets only run, trainer and kind keys,
    with values of the right types."""
    cfg = yaml.safe_load(Path(path).read_text())
    own = {k: v for k, v in cfg.items() if k not in {**cli.CLI_DEFAULTS, **TRAINER_DEFAULTS}}
    assert set(own) <= set(cli.kind_defaults(kind)), set(own) - set(cli.kind_defaults(kind))
    parse_settings(registry.get(kind).task.Settings, own)
    with_defaults({**cfg, "run_dir": "runs/x"})  # the common keys are well-typed (run_dir: the CLI fills it)


def test_builtin_kinds_are_found_by_convention():
    assert registry.kinds(trainable=True) == ["blockpilot", "dflash", "eagle3", "specblock"]
    assert set(registry.kinds()) >= {"blockpilot", "dflash", "eagle3", "specblock"}


# ------------------------------------------------------------------------------------- CLI

def write_yaml(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_cli_overrides_are_typed_and_unknown_keys_refused(tmp_path):
    path = write_yaml(tmp_path / "d.yaml", {"dim": 16, "lr": 0.001, "tie": True, "layers": [1, 2]})
    cfg = cli.load_drafter_config(path, ["dim=32", "lr=3e-4", "tie=false", "layers=[3, 4]",
                                         "time_budget_min=30", "regen_dir=data/x", "max_steps=7"])
    assert (cfg["dim"], cfg["lr"], cfg["tie"], cfg["layers"]) == (32, 3e-4, False, [3, 4])
    assert (cfg["time_budget_min"], cfg["regen_dir"], cfg["max_steps"]) == (30, "data/x", 7)
    assert cfg["batch_size"] == cli.CLI_DEFAULTS["batch_size"]  # defaults fill missing keys
    with pytest.raises(ValueError, match="unknown key 'dimm'"):
        cli.load_drafter_config(path, ["dimm=3"])
    with pytest.raises(ValueError, match=r"override dim='x': expected int"):
        cli.load_drafter_config(path, ["dim=x"])
    with pytest.raises(ValueError, match="is not key=value"):
        cli.load_drafter_config(path, ["dim"])


def test_cli_refuses_unknown_kinds_and_keys_with_clear_messages(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(registry._KINDS, "bigram", BIGRAM)
    path = write_yaml(tmp_path / "d.yaml", {"dim": 16})
    with pytest.raises(SystemExit) as e:
        cli.main(["nope", "--config", str(path)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown kind 'nope': choose from target" in err and "bigram" in err
    with pytest.raises(SystemExit):
        cli.main(["bigram", "--config", str(path), "bogus=1"])
    assert "unknown key 'bogus'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bigram", "--config", str(tmp_path / "missing.yaml")])
    assert "no such file" in capsys.readouterr().err


def test_cli_target_kind_delegates_to_train_target(monkeypatch):
    calls = []
    monkeypatch.setattr(cli.train_target, "main", calls.append)
    cli.main(["target", "--config", "configs/target/tiny-test.yaml", "max_steps=3", "seed=1"])
    assert calls == [["--config", "configs/target/tiny-test.yaml", "max_steps=3", "seed=1"]]


def test_cli_trains_a_registered_kind_end_to_end(tiny_ckpt, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(registry._KINDS, "bigram", BIGRAM)
    vocab = sbj.load_target(tiny_ckpt).config.vocab_size
    recs = records(400, vocab=vocab)
    val_ids = [r["id"] for r in recs if is_validation(r["id"])]
    assert len(val_ids) >= 2  # the fixed ids put a few records in the validation split
    regen = tmp_path / "regen"
    regen.mkdir()
    (regen / "greedy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    path = write_yaml(tmp_path / "bigram.yaml", {"dim": 8, "max_steps": 3})
    cli.main(["bigram", "--config", str(path), f"target_dir={tiny_ckpt}", f"regen_dir={regen}",
              f"run_dir={tmp_path / 'run'}", "batch_size=4", "max_len=16", "eval_num_prompts=2",
              "eval_every=0", "eval_max_new_tokens=8", "log_every=1", "warmup_steps=1"])
    out = capsys.readouterr().out
    assert "2 evaluation prompts" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["eval_prompts"] == 2
    assert summary["config"]["kind"] == "bigram" and summary["config"]["dim"] == 8
    assert summary["out_dir"] == str(tmp_path / "run" / "export")
    assert (tmp_path / "run" / "export" / "params.npz").exists()
    assert (regen / "tfds").is_dir()  # tfds_dir defaults to <regen_dir>/tfds
    # the evaluation prompts are the token ids of distinct validation-split prompts
    sources = RegenDataset(data_dir=str(regen / "tfds")).as_data_source()
    prompts = cli.eval_prompt_list({"eval_num_prompts": 2, "eval_prompts": "",
                                    "regen_dir": str(regen)}, sources)
    val_prompts = [r["prompt_ids"] for r in recs if r["id"] in val_ids]
    assert len(prompts) == 2 and prompts[0] != prompts[1]
    assert all(p in val_prompts for p in prompts)


def test_eval_prompts_from_a_prompt_jsonl(tmp_path, capsys):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"id": "a", "prompt": "def f():"}\nnot json\n{"id": "b", "prompt": "x = "}\n'
                    '{"id": "c", "prompt": "y"}\n')
    cfg = {"eval_num_prompts": 2, "eval_prompts": str(path), "regen_dir": ""}
    assert cli.eval_prompt_list(cfg, {}) == ["def f():", "x = "]
    assert "line 2: skipped, invalid JSON" in capsys.readouterr().err
    assert cli.eval_prompt_list({**cfg, "eval_num_prompts": 0}, {}) == []
    with pytest.raises(ValueError, match="no validation split"):
        cli.eval_prompt_list({**cfg, "eval_prompts": ""}, {"train": []})


def test_cli_counts_a_draft_vocabulary_from_the_training_examples(tmp_path, capsys):
    from specblock_jax.drafters import draft_vocab

    source = [{"prompt_ids": np.asarray([0, 5, 5]), "response_ids": np.asarray([7, 5, 1])},
              {"prompt_ids": np.asarray([0, 7]), "response_ids": np.asarray([9, 1])}]
    path = cli.count_draft_vocab(source, VOCAB, 4, str(tmp_path / "run"))
    vocab = draft_vocab.load(path, VOCAB, 4)
    assert vocab.d2t.tolist() == [5, 0, 1, 7]  # 3x 5, then 2x each of 0, 1, 7 (ties to the lower id)
    assert "4 of 64 target tokens, 90.0% of the training tokens" in capsys.readouterr().out


def test_training_refuses_to_replace_a_shipped_or_foreign_model(tmp_path):
    """Shipped models are read-only to the trainer: an out_dir under a checkout's assets/ or one
    outside the run holding a model is refused before any step unless overwrite=true."""
    from specblock_jax.trainer.trainer import OutDirError, check_out_dir

    checkout = tmp_path / "checkout"
    (checkout / "specblock_jax").mkdir(parents=True)
    shipped = checkout / "assets" / "drafters" / "eagle3"
    shipped.mkdir(parents=True)
    (shipped / "config.json").write_text("{}")
    before = (shipped / "config.json").read_bytes()
    run = tmp_path / "runs" / "r"
    with pytest.raises(OutDirError, match=rf"out_dir: {shipped}: holds a shipped model under assets/"):
        train(_task_for_out_dir(), {"run_dir": str(run), "out_dir": str(shipped)}, lambda state: iter(()),
              lambda params: {})
    assert (shipped / "config.json").read_bytes() == before and not run.exists()  # refused before anything ran
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "config.json").write_text("{}")
    with pytest.raises(OutDirError, match="holds a model this run did not write"):
        check_out_dir(other, run, overwrite=False)
    assert "will replace a shipped model" in check_out_dir(shipped, run, overwrite=True)
    assert check_out_dir(run / "export", run, overwrite=False) is None  # the run's own folder
    assert check_out_dir(tmp_path / "fresh", run, overwrite=False) is None  # nothing there yet


def _task_for_out_dir():
    class Untouched:  # the trainer must refuse before it asks the task anything
        def __getattr__(self, name):
            raise AssertionError(f"the trainer used the task ({name}) before checking out_dir")

    return Untouched()
