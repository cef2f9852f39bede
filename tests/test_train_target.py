"""The target's training (TargetTask through the one trainer): packed LM data, loss goes down, exact
resume after an interruption, export.

Every test uses configs/target/tiny-test.yaml on a small synthetic corpus written to a temp dir.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from safetensors import safe_open

from specblock_jax.models import init_target, load_target
from specblock_jax.training import lm_data
from specblock_jax.trainer.target_task import decay_mask, mean_loss, model_config, target_settings
from specblock_jax.trainer.trainer import with_defaults
from specblock_jax_cli.train import train_target
from specblock_jax_cli.train.train_target import load_config, train

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "assets" / "tokenizer"
TINY = ROOT / "configs" / "target" / "tiny-test.yaml"
TIMING = ("tokens_per_s", "elapsed_s")


def _write_corpus(directory: Path) -> None:
    """train/validation JSONL of small, repetitive Python functions (easy to learn)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 60), ("validation", 12)):
        with open(directory / f"{split}.jsonl", "w") as f:
            for i in range(n):
                a, b = rng.integers(0, 100, size=2)
                text = (f"def add_{i}(x, y):\n    \"\"\"Return x + y + {a}.\"\"\"\n"
                        f"    return x + y + {a}\n\n\ndef mul_{i}(x):\n    return x * {b}\n")
                f.write(json.dumps({"path": f"{split}/m{i}.py", "text": text}) + "\n")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("corpus")
    _write_corpus(d)
    return d


def _cfg(corpus: Path, run: Path, *overrides: str) -> dict:
    return load_config(TINY, [f"corpus_dir={corpus}", f"tokenizer_dir={TOKENIZER}",
                              f"token_cache_dir={corpus / 'tokens'}", f"run_dir={run}",
                              f"out_dir={run / 'export'}", *overrides])


def _records(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def _latest_state(run: Path):
    """(step, params, opt_state) of the run's latest checkpoint, restored as numpy."""
    mngr = ocp.CheckpointManager((run / "checkpoints").absolute())
    step = mngr.latest_step()
    restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                          meta=ocp.args.JsonRestore()))
    assert restored.meta["step"] == step
    return step, restored.state


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory) -> tuple[dict, dict, Path]:
    run = tmp_path_factory.mktemp("run")
    cfg = _cfg(corpus, run, "max_steps=30", "eval_every=10", "ckpt_every=10", "num_samples=1")
    return cfg, train(cfg), run


# ------------------------------------------------------------------------------------- data

def test_tokenised_split_is_bos_text_eos_and_cached(corpus):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER), local_files_only=True)
    cache_dir = corpus / "tokens-a"
    ids = lm_data.load_split_ids(corpus, "validation", TOKENIZER, cache_dir)
    texts = lm_data.read_texts(corpus / "validation.jsonl")
    expected = []
    for text in texts:
        body = tok(text, add_special_tokens=False)["input_ids"]
        expected += [tok.bos_token_id] + body + [tok.eos_token_id]
    np.testing.assert_array_equal(ids, np.asarray(expected))
    cached = list(cache_dir.glob("validation-*.npy"))
    assert [p.name for p in cached] == [f"validation-{lm_data.tokenizer_hash(TOKENIZER)}.npy"]
    (corpus / "validation.jsonl").rename(corpus / "validation.moved")  # the cache must suffice
    try:
        again = lm_data.load_split_ids(corpus, "validation", TOKENIZER, cache_dir)
        np.testing.assert_array_equal(again, ids)
    finally:
        (corpus / "validation.moved").rename(corpus / "validation.jsonl")


def test_bad_record_is_named(tmp_path):
    path = tmp_path / "train.jsonl"
    records = [{"path": "a.py", "text": "x = 1"}, {"path": "b.py"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ValueError, match=r"train.jsonl:2: record has no string field 'text'"):
        lm_data.read_texts(path)


def test_pack_windows_cover_every_id():
    ids = np.arange(43, dtype=np.uint16)
    windows = lm_data.pack(ids, 8)
    assert windows.shape == (5, 9)
    for i, w in enumerate(windows):
        np.testing.assert_array_equal(w, np.arange(8 * i, 8 * i + 9))
    targets = windows[:, 1:].reshape(-1)  # every id after the first is predicted exactly once
    np.testing.assert_array_equal(targets, np.arange(1, 41))


def test_batch_iterator_is_deterministic_and_resumable():
    windows = lm_data.pack(np.arange(10 * 4 + 1, dtype=np.uint16), 4)  # 10 windows
    run = lm_data.BatchIterator(windows, batch_size=3, seed=7)
    batches = [next(run) for _ in range(8)]  # 3 batches per epoch: crosses two epoch boundaries
    for b in batches:  # inputs and next-token labels of the same windows
        assert set(b) == {"tokens", "labels"}
        assert all(x.shape == (3, 4) and x.dtype == np.int32 for x in b.values())
        np.testing.assert_array_equal(b["labels"], b["tokens"] + 1)
    again = lm_data.BatchIterator(windows, batch_size=3, seed=7)
    for a, b in zip(batches, (next(again) for _ in range(8))):
        np.testing.assert_array_equal(a["tokens"], b["tokens"])
    for epoch in range(2):  # no window repeats within an epoch
        starts = np.concatenate([b["tokens"][:, 0] for b in batches[3 * epoch:3 * epoch + 3]])
        assert len(set(starts.tolist())) == 9
    first_epochs = [np.concatenate([b["tokens"][:, 0] for b in batches[3 * e:3 * e + 3]]) for e in range(2)]
    assert not np.array_equal(first_epochs[0], first_epochs[1])  # reshuffled per epoch
    other = lm_data.BatchIterator(windows, batch_size=3, seed=8)
    assert not all(np.array_equal(a["tokens"], next(other)["tokens"]) for a in batches[:3])

    probe = lm_data.BatchIterator(windows, batch_size=3, seed=7)
    for _ in range(4):
        next(probe)
    state = probe.get_state()
    assert state == {"epoch": 1, "index": 1}
    resumed = lm_data.BatchIterator(windows, batch_size=3, seed=7, **state)
    for expected in batches[4:]:
        np.testing.assert_array_equal(next(resumed)["tokens"], expected["tokens"])


# ------------------------------------------------------------------------------------ config

def test_overrides_are_typed_by_the_default(tmp_path):
    cfg = load_config(TINY, ["max_steps=12", "lr=0.5", "run_dir=/x", "seed=3"])
    assert (cfg["max_steps"], cfg["lr"], cfg["run_dir"], cfg["seed"]) == (12, 0.5, "/x", 3)
    assert isinstance(cfg["lr"], float) and isinstance(cfg["max_steps"], int)
    with pytest.raises(ValueError, match="unknown key 'max_step'"):
        load_config(TINY, ["max_step=3"])
    with pytest.raises(ValueError, match=r"max_steps='1.5': expected int"):
        load_config(TINY, ["max_steps=1.5"])


@pytest.mark.parametrize("name", ["reference", "v2", "tiny-test"])
def test_shipped_target_configs_split_into_target_and_trainer_keys(name):
    cfg = load_config(ROOT / "configs" / "target" / f"{name}.yaml")
    settings = target_settings(cfg)  # every non-trainer key is a target setting, well typed
    assert model_config(settings).num_layers == cfg["num_layers"] and settings.seq_len == cfg["seq_len"]
    with_defaults({**cfg, "run_dir": "runs/x"})  # the trainer keys are well typed
    with pytest.raises(ValueError, match=r"target: unknown setting\(s\) \['bogus'\]"):
        target_settings({**cfg, "bogus": 1})
    with pytest.raises(ValueError, match=r"target: missing setting\(s\) \['seq_len'\]"):
        target_settings({k: v for k, v in cfg.items() if k != "seq_len"})


# --------------------------------------------------------------------------------- training

def test_training_reduces_loss(trained):
    cfg, summary, run = trained
    records = _records(run)
    losses = [r["loss"] for r in records if "loss" in r]
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(losses) == 30 and len(vals) == 3
    assert losses[0] > 8.5  # ~ln(8192) at initialisation
    assert np.mean(losses[-3:]) < losses[0] - 2.0
    assert vals[-1] < vals[0] and summary["val_loss"] < losses[0] - 2.0
    assert [r["tokens_seen"] for r in records if "loss" in r] == [s * 4 * 32 for s in range(1, 31)]
    lrs = [r["lr"] for r in records if "lr" in r]
    # update n uses schedule(n - 1): linear warmup from 0 over 2 updates, then cosine decay
    assert lrs[:3] == pytest.approx([0.0, cfg["lr"] / 2, cfg["lr"]])
    assert all(a > b for a, b in zip(lrs[2:], lrs[3:]))
    assert lrs[-1] == pytest.approx(cfg["lr"] * cfg["min_lr_ratio"], rel=0.05)


def test_resume_after_interruption_is_exact(corpus, tmp_path, monkeypatch):
    common = ("max_steps=8", "ckpt_every=3", "eval_every=4", "num_samples=0")
    straight_dir, resumed_dir = tmp_path / "straight", tmp_path / "resumed"
    straight = train(_cfg(corpus, straight_dir, *common))

    cfg = _cfg(corpus, resumed_dir, *common)
    with monkeypatch.context() as m:  # killed while fetching the 6th batch
        batches = lm_data.BatchIterator.__next__
        calls = []

        def killed(self):
            calls.append(1)
            if len(calls) == 6:
                raise KeyboardInterrupt
            return batches(self)

        m.setattr(lm_data.BatchIterator, "__next__", killed)
        with pytest.raises(KeyboardInterrupt):
            train(cfg)
    # a kill between checkpoints: the last checkpoint is step 3's, the log ran ahead to 5
    assert _latest_state(resumed_dir)[0] == 3
    assert max(r["step"] for r in _records(resumed_dir)) == 5
    assert not (resumed_dir / "summary.json").exists()
    resumed = train(cfg)

    assert _records(resumed_dir) == _records(straight_dir)
    for key in ("steps", "tokens_seen", "val_loss", "val_loss_bf16_export"):
        assert resumed[key] == straight[key], key
    step_a, state_a = _latest_state(straight_dir)
    step_b, state_b = _latest_state(resumed_dir)
    assert step_a == step_b == 8
    leaves_a, leaves_b = jax.tree.leaves(state_a), jax.tree.leaves(state_b)
    assert len(leaves_a) == len(leaves_b) > 0
    for a, b in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(a, b)


def test_export_loads_with_load_target(trained, corpus):
    cfg, summary, run = trained
    export = Path(cfg["out_dir"])
    target = load_target(export, dtype="float32")
    c = target.config
    assert (c.bos_token_id, c.eos_token_ids, c.pad_token_id) == (0, (1,), 2)
    assert c.tie_word_embeddings and c.max_position_embeddings >= 2048 and c.family == "qwen3"
    assert (c.hidden_size, c.num_layers, c.vocab_size) == (32, 2, 8192)
    assert json.loads((export / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(str(export / "model.safetensors"), "np") as f:
        assert "lm_head.weight" not in f.keys()
    with safe_open(str(export / "model.safetensors"), "pt") as f:
        assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"torch.bfloat16"}
    assert target.tokenizer is not None and target.tokenizer("def f").input_ids[0] == 0

    # the loaded export scores the validation batches exactly as the trainer measured it
    val_ids = lm_data.load_split_ids(corpus, "validation", TOKENIZER, cfg["token_cache_dir"])
    batches = lm_data.eval_batches(lm_data.pack(val_ids, cfg["seq_len"]), cfg["batch_size"],
                                   cfg["final_eval_batches"])
    loss = mean_loss(target.graphdef, target.params, batches)
    assert loss == pytest.approx(summary["val_loss_bf16_export"], abs=1e-6)
    assert abs(summary["val_loss_bf16_export"] - summary["val_loss"]) < 0.05

    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 1 and samples[0]["id"] == "HumanEval/0" and samples[0]["completion"]


def _run_cli(corpus: Path, run: Path, *overrides: str) -> subprocess.Popen:
    args = [sys.executable, "-m", train_target.__name__, "--config", str(TINY), f"corpus_dir={corpus}",
            f"tokenizer_dir={TOKENIZER}", f"token_cache_dir={corpus / 'tokens'}", f"run_dir={run}",
            f"out_dir={run / 'export'}", *overrides]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_training_process_killed_with_sigkill_resumes_bit_identically(corpus, tmp_path):
    """Training outlives sessions: a real process SIGKILLed mid-run (possibly mid-checkpoint), then
    the same command again, gives the uninterrupted run's metrics and final state bit for bit."""
    common = ("max_steps=24", "ckpt_every=2", "log_every=1", "eval_every=6", "num_samples=0",
              "time_budget_min=60.0")
    straight = _run_cli(corpus, tmp_path / "straight", *common)
    assert straight.wait(timeout=600) == 0, straight.stderr.read()

    killed_dir = tmp_path / "killed"
    proc = _run_cli(corpus, killed_dir, *common)
    log, deadline = killed_dir / "metrics.jsonl", time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= 8:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL  # killed before it could finish
    killed_at = max(r["step"] for r in _records(killed_dir))
    assert 6 <= killed_at < 24
    resumed = _run_cli(corpus, killed_dir, *common)
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read()

    assert _records(killed_dir) == _records(tmp_path / "straight")
    (step_a, state_a), (step_b, state_b) = _latest_state(tmp_path / "straight"), _latest_state(killed_dir)
    assert step_a == step_b == 24
    for a, b in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b), strict=True):
        np.testing.assert_array_equal(a, b)


def test_weight_decay_skips_norms_of_the_stacked_layers():
    params = init_target(model_config(target_settings(load_config(TINY))), seed=0).params
    mask = decay_mask(params)
    assert params["layers"]["input_layernorm"]["weight"].ndim == 2  # [L, H]: stacked, still a norm
    assert not mask["layers"]["input_layernorm"]["weight"] and not mask["norm"]["weight"]
    assert mask["layers"]["mlp"]["up_proj"] and mask["layers"]["self_attn"]["q_proj"]
    assert mask["embed_tokens"]
