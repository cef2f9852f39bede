"""The one trainer, for the target and every drafter: a `TrainTask`, AdamW, orbax checkpoints,
exact resume, periodic evaluation.

    summary = train(task, cfg, data_iter_factory, evaluate)

One `jax.jit` train step, a pure function
    (params, opt_state, frozen, batch, key) -> (params, opt_state, metrics)
with params and optimizer state donated and `frozen` (e.g. the target's weights) not. The step's
PRNG key is `fold_in(key(seed), step)` (step = updates done before it), so a resumed run draws
the same keys as an uninterrupted one. Optimizer: the task's own (`task.optimizer(cfg)`), else
global-norm clipping, then AdamW (weight decay on arrays of rank >= 2 only) with `lr_schedule`:
linear warmup, then cosine decay over `max_steps`.

Run directory (`cfg["run_dir"]`):
    metrics.jsonl   one JSON record per line. Training, every `log_every` steps:
                    {"step", "loss", <each task metric>, "lr", "grad_norm", "tokens_seen",
                     "tokens_per_s", "elapsed_s", "flops"} where loss, task metrics and grad_norm
                    are means over the steps since the previous record, lr is the last step's and
                    tokens_seen counts the run's tokens so far (`batch_tokens`). Evaluation, every
                    `eval_every` steps and at the end: {"step", <what `evaluate` returns>}, e.g. a
                    drafter's {"eval_tau_mean", "eval_tau_median", "eval_prompts", "eval_s"}
                    (`tau_evaluator`) or the target's {"val_loss", "val_ppl"}.
    checkpoints/    orbax: params, opt_state and meta (step, data iterator state, seed, elapsed);
                    every `ckpt_every` steps and at the end, the latest `keep_checkpoints` kept.
    summary.json    written at the end (see `train`).
Rerunning on the same run dir resumes from the latest checkpoint, drops the metrics records of
later steps, and continues bit-identically (same params, optimizer state and records, timing
fields apart; records match when ckpt_every is a multiple of log_every, else the first record
after a resume averages fewer steps). Resuming with a larger max_steps continues under the new LR
schedule; the seed must not change.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from tqdm import tqdm

from specblock_jax.decoding import DecodeOptions, Sampling, generate
from specblock_jax.models.target import Target
from specblock_jax import parallel, writing
from specblock_jax.parallel.training import TrainLayout
from specblock_jax.drafters.base import DrafterTask
from specblock_jax.training.task import TrainTask

# Keys `train` reads from cfg, with their defaults (configs/drafters/README.md describes them).
TRAINER_DEFAULTS: dict[str, Any] = {
    "run_dir": "",  # required
    "out_dir": "",  # required: where task.export writes the drafter
    "seed": 0,
    "lr": 3e-4, "min_lr_ratio": 0.1, "warmup_steps": 100, "weight_decay": 0.01,
    "b1": 0.9, "b2": 0.95, "grad_clip": 1.0,
    "max_steps": 1000, "time_budget_min": None,
    "log_every": 10, "ckpt_every": 200, "keep_checkpoints": 2,
    "eval_every": 200, "eval_max_new_tokens": 64, "eval_batch_size": 8,
    "stop_min_gain": None, "stop_metric": "eval_tau_mean",
    "overwrite": False,  # allow out_dir to replace a model this run did not write (module docstring of check_out_dir)
}
RESERVED_METRICS = ("step", "loss", "lr", "grad_norm", "tokens_seen", "tokens_per_s", "elapsed_s",
                    "flops")


class DataIterator(Protocol):
    """What `data_iter_factory(state)` returns, e.g. a `training.regen_dataset.BatchIterator`."""

    def __next__(self) -> dict[str, np.ndarray]: ...  # arrays with a leading [B]; StopIteration at the end

    def get_state(self) -> dict[str, int]: ...  # plain ints; the factory accepts it back


class OutDirError(writing.ShippedFolderError):
    """The run would replace a model it did not write (see `check_out_dir`)."""


def check_out_dir(out_dir: str | Path, run_dir: str | Path, overwrite: bool) -> str | None:
    """Shipped models are read-only to training: an out_dir outside the run's own folder that
    already holds a model (a config.json), or any folder under a checkout's assets/, is refused
    unless `overwrite` (OutDirError naming it), so a throwaway run cannot replace the embedded
    default. With overwrite, returns the line that says what the export will replace (None when
    it replaces nothing)."""
    out, run = Path(out_dir).resolve(), Path(run_dir).resolve()
    if run == out or run in out.parents:
        return None
    shipped = writing.shipped(out)  # the one check every writer shares (specblock_jax/writing.py)
    holds_model = (out / "config.json").exists()
    if not (shipped or holds_model):
        return None
    what = "a shipped model under assets/" if shipped else "a model this run did not write"
    if not overwrite:
        raise OutDirError(f"out_dir: {out_dir}: holds {what}; training exports under its run_dir by default "
                          "(leave out_dir unset), or pass overwrite=true to replace it")
    return f"out_dir: {out_dir}: the export will replace {what} (overwrite=true)"


def with_defaults(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`cfg` with the missing trainer keys set to their defaults, checked (errors name the key)."""
    out = {**TRAINER_DEFAULTS, **cfg}
    for key in ("run_dir", "out_dir"):
        if not out[key]:
            raise ValueError(f"config key {key!r} must be set (a directory path)")
    for key in ("max_steps", "log_every", "ckpt_every", "keep_checkpoints", "eval_max_new_tokens",
                "eval_batch_size"):
        if not isinstance(out[key], int) or out[key] < 1:
            raise ValueError(f"config key {key!r} must be an integer >= 1, got {out[key]!r}")
    for key in ("warmup_steps", "eval_every", "seed"):
        if not isinstance(out[key], int) or out[key] < 0:
            raise ValueError(f"config key {key!r} must be an integer >= 0, got {out[key]!r}")
    for key in ("lr", "min_lr_ratio", "weight_decay", "b1", "b2", "grad_clip"):
        if not isinstance(out[key], (int, float)) or out[key] < 0:
            raise ValueError(f"config key {key!r} must be a number >= 0, got {out[key]!r}")
    gain = out["stop_min_gain"]
    if gain is not None:
        if not isinstance(gain, (int, float)) or gain < 0:
            raise ValueError(f"config key 'stop_min_gain' must be a number >= 0 or null, got {gain!r}")
        if not out["eval_every"]:
            raise ValueError("config key 'stop_min_gain' needs eval_every >= 1 (the gain is measured "
                             "between two consecutive evaluations)")
    budget = out["time_budget_min"]
    if budget is not None and (not isinstance(budget, (int, float)) or budget <= 0):
        raise ValueError(f"config key 'time_budget_min' must be a number > 0 or null, got {budget!r}")
    return out


# ---------------------------------------------------------------------------------- optimizer

def lr_schedule(cfg: Mapping[str, Any]) -> optax.Schedule:
    """LR of update number `count` (0-based): lr * (count + 1) / warmup_steps during warmup, then
    a cosine from lr down to lr * min_lr_ratio at count = max_steps - 1 (held after that)."""
    peak, floor = float(cfg["lr"]), float(cfg["lr"]) * float(cfg["min_lr_ratio"])
    warm, total = cfg["warmup_steps"], cfg["max_steps"]

    def schedule(count):
        t = jnp.asarray(count, jnp.float32)
        warmup = peak * (t + 1.0) / max(warm, 1)
        frac = jnp.clip((t - warm) / max(total - 1 - warm, 1), 0.0, 1.0)
        cosine = floor + 0.5 * (peak - floor) * (1.0 + jnp.cos(jnp.pi * frac))
        return jnp.where(t < warm, warmup, cosine)

    return schedule


def make_optimizer(cfg: Mapping[str, Any]) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(global-norm clipping then AdamW with `lr_schedule`, the schedule): the optimizer of a task
    without its own `optimizer(cfg)`."""
    schedule = lr_schedule(cfg)
    decay_mask = lambda params: jax.tree.map(lambda x: jnp.ndim(x) >= 2, params)  # noqa: E731
    tx = optax.chain(
        optax.clip_by_global_norm(cfg["grad_clip"]),
        optax.adamw(schedule, b1=cfg["b1"], b2=cfg["b2"], weight_decay=cfg["weight_decay"],
                    mask=decay_mask))
    return tx, schedule


def make_train_step(task: TrainTask, tx: optax.GradientTransformation) -> Callable:
    """The jitted step (params, opt_state, frozen, batch, key) -> (params, opt_state, metrics);
    params and opt_state are donated. metrics: {"loss", <task metrics>, "grad_norm"} (scalars,
    grad_norm before clipping). `train_step_fn` is the same step unjitted (the sharded trainer
    jits it with shardings, see parallel/training.py)."""
    return functools.partial(jax.jit, donate_argnums=(0, 1))(train_step_fn(task, tx))


def train_step_fn(task: TrainTask, tx: optax.GradientTransformation) -> Callable:
    """The pure step function (not jitted) that `make_train_step` compiles."""

    def train_step(params, opt_state, frozen, batch, key):
        (loss, metrics), grads = jax.value_and_grad(task.loss_fn, has_aux=True)(
            params, frozen, batch, key)
        clash = sorted(set(metrics) & set(RESERVED_METRICS))
        if clash:
            raise ValueError(f"task metric names {clash} are reserved by the trainer "
                             f"(reserved: {RESERVED_METRICS})")
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, **metrics, "grad_norm": optax.tree.norm(grads)}

    return train_step


# ----------------------------------------------------------------------------------- eval

def evaluate_tau(task: DrafterTask, params: Any, target: Target,
                 prompts: Sequence[str | Sequence[int]], cfg: Mapping[str, Any],
                 mesh: Any = None) -> dict[str, Any]:
    """Greedy speculative decoding of `prompts` with the task's drafter; tau statistics.

    Returns {"eval_tau_mean", "eval_tau_median", "eval_prompts", "eval_s"}: tau (tokens committed
    per target forward, bonus included) over the prompts that had a decoding forward
    (eval_prompts of them; the means are None when none had). With a mesh, decoding is sharded
    and, in a multi-host run, each host decodes its share of the prompts (taus gathered).
    """
    start = time.perf_counter()
    if mesh is None:
        results = generate(target, list(prompts), drafter=task.decoding_drafter(params),
                               max_new_tokens=cfg["eval_max_new_tokens"], sampling=Sampling(0.0),
                               options=DecodeOptions(batch_size=min(cfg["eval_batch_size"], len(prompts))))
    else:
        mine = parallel.host_shard(list(prompts))
        results = generate(target, mine, drafter=task.decoding_drafter(params),
                               max_new_tokens=cfg["eval_max_new_tokens"], sampling=Sampling(0.0),
                               options=DecodeOptions(batch_size=cfg["eval_batch_size"], mesh=mesh))
    taus = [r.stats.tau for r in results if r.stats.tau is not None]
    if mesh is not None and jax.process_count() > 1:
        taus = parallel.host_gather_floats(taus)
    return {"eval_tau_mean": statistics.fmean(taus) if taus else None,
            "eval_tau_median": statistics.median(taus) if taus else None,
            "eval_prompts": len(taus), "eval_s": time.perf_counter() - start}


def tau_evaluator(task: DrafterTask, target: Target, prompts: Sequence[str | Sequence[int]],
                  cfg: Mapping[str, Any], mesh: Any = None) -> Callable[[Any], dict] | None:
    """The `evaluate` of a drafter run: params -> `evaluate_tau` over `prompts` (None, no
    evaluation, when there are none). mesh: as `train`'s."""
    if not prompts:
        return None
    cfg = {**TRAINER_DEFAULTS, **cfg}
    if isinstance(mesh, parallel.ShardingPlan):
        mesh = mesh.mesh
    return lambda params: evaluate_tau(task, params, target, prompts, cfg, mesh)


# ------------------------------------------------------------------------------ run state

def step_flops(train_step: Callable, *args) -> float | None:
    """FLOPs of one train step at these arguments' shapes: XLA's cost analysis of the lowered (not
    yet optimised) step, counting a multiply-add as 2. None where the backend gives no estimate.
    Lowering neither compiles nor runs the step."""
    try:
        cost = train_step.lower(*args).cost_analysis()
    except Exception:  # noqa: BLE001 - an estimate only; some backends/versions do not provide it
        return None
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"]) if cost and cost.get("flops") else None


def checkpoint_manager(directory: Path, keep: int) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False)
    return ocp.CheckpointManager(directory.absolute(), options=options)


def save_checkpoint(mngr: ocp.CheckpointManager, step: int, params, opt_state, meta: dict) -> None:
    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
        meta=ocp.args.JsonSave(meta)), force=True)


def append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _truncate_log(path: Path, step: int) -> list[dict]:
    """Keeps the records of steps <= `step` (later ones were written after the checkpoint)."""
    keep = [r for r in _read_log(path) if r["step"] <= step]
    path.write_text("".join(json.dumps(r) + "\n" for r in keep))
    return keep


def batch_tokens(batch: Mapping[str, np.ndarray]) -> int:
    """The tokens a batch trains on: the ones of its "attention_mask", else the size of its
    "tokens", else its rows (a batch of examples that are not token sequences, as BlockPilot's
    prefill features)."""
    if "attention_mask" in batch:
        return int(np.sum(batch["attention_mask"]))
    if "tokens" in batch:
        return int(np.size(batch["tokens"]))
    return int(np.shape(next(iter(batch.values())))[0])


def _mean_metrics(window: list[dict[str, jax.Array]]) -> dict[str, float]:
    """Per-name means over the steps of `window` (one device->host transfer)."""
    stacked = jax.device_get({k: jnp.stack([m[k] for m in window]) for k in window[0]})
    return {k: float(np.mean(v)) for k, v in stacked.items()}


# ----------------------------------------------------------------------------------- train

def train(task: TrainTask, cfg: Mapping[str, Any],
          data_iter_factory: Callable[[dict[str, int] | None], DataIterator],
          evaluate: Callable[[Any], Mapping[str, Any]] | None = None, mesh: Any = None) -> dict[str, Any]:
    """Trains `task` (resuming from the run dir's latest checkpoint), exports it, returns the summary.

    cfg: the config dict; the keys of `TRAINER_DEFAULTS` are read (missing ones take defaults),
        others are ignored.
    data_iter_factory(state): a fresh iterator for state None, else one continuing at `state` (a
        `get_state()` result). StopIteration from it ends training ("data_exhausted").
    evaluate(params): a flat dict of JSON values for the log (names other than the trainer's
        `RESERVED_METRICS`), every `eval_every` steps and at the end; None = no evaluation. A
        drafter run's is `tau_evaluator(...)`.
    Stops at max_steps, when the elapsed run time (summed over resumes, evaluations included)
    reaches time_budget_min, when the data ends, or (stop_min_gain set) when an evaluation's
    `stop_metric` has gained less than stop_min_gain (a fraction) over the previous one
    ("plateau"; with stop_min_gain the run also evaluates at its first step, so a fine-tuned
    drafter's start counts as the first evaluation); then evaluates (unless done at this step),
    saves a checkpoint, calls `task.export(params, out_dir)` and writes summary.json:
        {"steps", "stop_reason", "elapsed_s", "tokens_seen", "flops_per_step", "train_flops",
         "last_train_record", <the final evaluation's fields>, "eval_history", "run_dir",
         "out_dir", "config", <the fields `task.export` returned>}
    (the final evaluation's fields are there when it ran at the last step; eval_history holds the
    run's evaluation records; tokens_seen counts `batch_tokens` over the run, resumes included).
    mesh: None (one device, the default) or a `jax.sharding.Mesh` / `parallel.ShardingPlan`: the
    step runs sharded (params and optimizer state FSDP + tensor-parallel, batch over "data"),
    checkpoints are saved sharded and restore onto any mesh shape. In a multi-host run each host's
    iterator yields its rows of the global batch (`parallel.HostShard`); process 0 writes the
    logs, the summary and the export.
    """
    cfg = with_defaults(cfg)
    replacing = check_out_dir(cfg["out_dir"], cfg["run_dir"], bool(cfg["overwrite"]))
    if replacing and jax.process_index() == 0:
        print(replacing, flush=True)
    run = _Run(task, cfg, evaluate, mesh)
    run.restore(data_iter_factory)
    stop_reason = run.loop()
    exported = run.finish()
    return _write_summary(cfg, run.step, stop_reason, run.elapsed, run.tokens_seen, _read_log(run.log_path),
                          write=run.primary, flops_per_step=run.flops_per_step, exported=exported)


class _Run:
    """One call of `train`: the state its steps share (params, optimizer state, the step count,
    the metrics window, the progress bar), each step a method: build (`__init__`), `restore`,
    `loop` (`train_one` per batch, `log_window`, `run_eval`, `checkpoint`), `finish`."""

    def __init__(self, task: TrainTask, cfg: dict[str, Any], evaluate, mesh: Any):
        """The run folder, the optimizer, fresh params and the (possibly sharded) train step."""
        self.task, self.cfg, self.evaluate, self.mesh = task, cfg, evaluate, mesh
        self.run_dir = Path(cfg["run_dir"])
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.run_dir / "metrics.jsonl"
        tx, self.schedule = task.optimizer(cfg) if hasattr(task, "optimizer") else make_optimizer(cfg)
        self.frozen = task.frozen()
        self.params = task.init_params(jax.random.key(cfg["seed"]))
        self.primary = jax.process_index() == 0
        if mesh is None:
            self.train_step = make_train_step(task, tx)
            self.opt_state = tx.init(self.params)
        else:
            plan = mesh if isinstance(mesh, parallel.ShardingPlan) else parallel.ShardingPlan(mesh, fsdp=True)
            layout = TrainLayout.make(plan, tx, self.params, self.frozen)
            self.params, self.frozen = layout.put(self.params), layout.put_frozen(self.frozen)
            self.opt_state = layout.init_opt(self.params)
            self.train_step = layout.jit_step(train_step_fn(task, tx))

    def restore(self, data_iter_factory) -> None:
        """Resumes from the run's latest checkpoint (if any), opens the data at its state, and
        sets up the timing, the evaluation history and the progress bar."""
        cfg = self.cfg
        self.mngr = checkpoint_manager(self.run_dir / "checkpoints", cfg["keep_checkpoints"])
        self.step, data_state, self.elapsed, self.tokens_seen, records = 0, None, 0.0, 0, []
        if self.mngr.latest_step() is not None:
            restored = self.mngr.restore(self.mngr.latest_step(), args=ocp.args.Composite(
                state=ocp.args.StandardRestore({"params": self.params, "opt_state": self.opt_state}),
                meta=ocp.args.JsonRestore()))
            self.params, self.opt_state = restored.state["params"], restored.state["opt_state"]
            meta = restored.meta
            if meta["seed"] != cfg["seed"]:
                raise ValueError(f"{self.run_dir}: checkpoint was made with seed={meta['seed']}, config has "
                                 f"seed={cfg['seed']}; use another run_dir")
            self.step, data_state, self.elapsed, self.tokens_seen = (meta["step"], meta["data"], meta["elapsed_s"],
                                                                     meta["tokens_seen"])
            records = _truncate_log(self.log_path, self.step) if self.primary else _read_log(self.log_path)
            print(f"resumed {self.run_dir} at step {self.step} (data state {data_state})")
        elif self.primary:
            self.log_path.unlink(missing_ok=True)
        self.data = data_iter_factory(data_state)
        self.base_key = jax.random.key(cfg["seed"])
        self.last_eval = max((r["step"] for r in records if "loss" not in r), default=-1)
        self.budget_s = math.inf if cfg["time_budget_min"] is None else 60.0 * cfg["time_budget_min"]
        self.session_start = time.perf_counter() - self.elapsed
        self.window, self.window_tokens, self.window_start, self.window_pause = [], 0, time.perf_counter(), 0.0
        self.flops_per_step = None
        self.eval_history = [r for r in records if "loss" not in r]
        self.plateau = (_plateaued(cfg, self.eval_history[:-1], self.eval_history[-1])
                        if self.eval_history else False)
        self.bar = tqdm(total=cfg["max_steps"], initial=min(self.step, cfg["max_steps"]), desc="train",
                        unit="step")

    def checkpoint(self) -> None:
        save_checkpoint(self.mngr, self.step, self.params, self.opt_state, {
            "step": self.step, "data": self.data.get_state(), "seed": self.cfg["seed"],
            "elapsed_s": time.perf_counter() - self.session_start, "tokens_seen": self.tokens_seen})

    def run_eval(self) -> None:
        if self.evaluate is not None:
            result = dict(self.evaluate(self.params))
            clash = sorted(set(result) & set(RESERVED_METRICS))
            if clash:
                raise ValueError(f"evaluation names {clash} are reserved by the trainer "
                                 f"(reserved: {RESERVED_METRICS})")
            if self.primary:
                append_jsonl(self.log_path, {"step": self.step, **result})
            self.bar.write(f"step {self.step}: " + ", ".join(f"{k} {v}" for k, v in result.items()))
            self.plateau = self.plateau or _plateaued(self.cfg, self.eval_history, result)
            self.eval_history.append(result)
        self.last_eval = self.step

    def log_window(self) -> None:
        """Appends the training record of the steps since the previous one."""
        means = _mean_metrics(self.window)
        now = time.perf_counter()
        grad_norm = means.pop("grad_norm")
        record = {"step": self.step, **means, "lr": float(self.schedule(self.step - 1)), "grad_norm": grad_norm,
                  "tokens_seen": self.tokens_seen,
                  "tokens_per_s": self.window_tokens / (now - self.window_start - self.window_pause),
                  "elapsed_s": now - self.session_start}
        if self.flops_per_step:
            record["flops"] = self.flops_per_step * self.step  # cumulative, over the run
        if self.primary:
            append_jsonl(self.log_path, record)
        self.bar.set_postfix(loss=f"{record['loss']:.4f}")
        self.window, self.window_tokens, self.window_start, self.window_pause = [], 0, now, 0.0

    def loop(self) -> str:
        """Steps until max_steps, a plateau, the time budget or the end of the data; the stop reason."""
        cfg = self.cfg
        if cfg["stop_min_gain"] is not None and not self.eval_history and self.evaluate is not None:
            self.run_eval()  # the starting point the first gain is measured from
        while self.step < cfg["max_steps"]:
            if self.plateau:
                return "plateau"
            if self.elapsed >= self.budget_s:
                return "time_budget"
            try:
                batch = next(self.data)
            except StopIteration:
                return "data_exhausted"
            self.train_one(batch)
            if self.step % cfg["log_every"] == 0 or self.step == cfg["max_steps"]:
                self.log_window()
            pause_start = time.perf_counter()  # evaluation and checkpoints stay out of tokens/s
            if cfg["eval_every"] and self.step % cfg["eval_every"] == 0:
                self.run_eval()
            if self.step % cfg["ckpt_every"] == 0:
                self.checkpoint()
            self.window_pause += time.perf_counter() - pause_start
            self.elapsed = time.perf_counter() - self.session_start
        return "max_steps"

    def train_one(self, batch) -> None:
        """One optimizer step on `batch` (its FLOPs estimated at the first)."""
        n_tokens = batch_tokens(batch)
        if self.mesh is not None and jax.process_count() > 1:  # every host's rows of the global batch
            n_tokens = parallel.host_sum([n_tokens])[0]
        key = jax.random.fold_in(self.base_key, self.step)
        if self.flops_per_step is None:
            self.flops_per_step = step_flops(self.train_step, self.params, self.opt_state, self.frozen,
                                             batch, key) or 0.0
        self.params, self.opt_state, metrics = self.train_step(self.params, self.opt_state, self.frozen, batch, key)
        self.step += 1
        self.tokens_seen += n_tokens
        self.window.append(metrics)
        self.window_tokens += n_tokens
        self.bar.update(1)

    def finish(self) -> dict[str, Any]:
        """The last record, evaluation and checkpoint, then the export (process 0; a shipped
        out_dir only with overwrite, which `check_out_dir` has checked); what the export returned."""
        if self.window:  # stopped early between two records
            self.log_window()
        self.bar.close()
        if self.last_eval != self.step:
            self.run_eval()
        self.elapsed = time.perf_counter() - self.session_start
        if self.mngr.latest_step() != self.step:
            self.checkpoint()
        self.mngr.wait_until_finished()
        self.mngr.close()
        params = self.params
        if self.mesh is not None:
            params = parallel.fetch(params)  # numpy on every host (all-gathered)
            parallel.sync("specblock-train-end")
        exported = {}
        if self.primary:
            allowed = writing.replacing(self.cfg["out_dir"]) if self.cfg["overwrite"] else contextlib.nullcontext()
            with allowed:
                exported = self.task.export(params, self.cfg["out_dir"]) or {}
        parallel.sync("specblock-train-exported")  # (a no-op for one process)
        return exported


def _plateaued(cfg: Mapping[str, Any], history: Sequence[Mapping[str, Any]],
               latest: Mapping[str, Any]) -> bool:
    """Whether `latest` evaluation gained less than cfg["stop_min_gain"] (relative) in
    cfg["stop_metric"] over the last of `history`; False without a rule or an earlier evaluation.
    Raises ValueError at the first evaluation that lacks the metric."""
    if cfg["stop_min_gain"] is None:
        return False
    name = cfg["stop_metric"]
    if name not in latest:
        raise ValueError(f"stop_metric {name!r} is not in the evaluation records "
                         f"(they hold {sorted(latest)})")
    if not history:
        return False
    before, now = float(history[-1][name]), float(latest[name])
    return now - before < cfg["stop_min_gain"] * abs(before)


def _write_summary(cfg: dict[str, Any], step: int, stop_reason: str, elapsed: float,
                   tokens_seen: int, records: list[dict], write: bool = True,
                   flops_per_step: float | None = None,
                   exported: Mapping[str, Any] | None = None) -> dict[str, Any]:
    evals = [r for r in records if "loss" not in r]
    last_eval = evals[-1] if evals and evals[-1]["step"] == step else {}
    summary = {
        "steps": step, "stop_reason": stop_reason, "elapsed_s": elapsed, "tokens_seen": tokens_seen,
        "flops_per_step": flops_per_step or None,
        "train_flops": flops_per_step * step if flops_per_step else None,
        "last_train_record": next((r for r in reversed(records) if "loss" in r), None),
        **{k: v for k, v in last_eval.items() if k != "step"},
        "eval_history": evals,
        "run_dir": cfg["run_dir"], "out_dir": cfg["out_dir"], "config": cfg, **(exported or {}),
    }
    if write:
        Path(cfg["run_dir"], "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary
