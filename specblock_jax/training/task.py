"""The interface between one drafter kind and the generic drafter trainer, and the task registry.

A drafter kind (EAGLE-3, SpecBlock, DFlash, BlockPilot, ...) trains through `training.trainer.train`
by implementing `TrainTask` and registering a builder under its kind name, at import time of its
module:

    from specblock_jax.training.task import register_task

    class Eagle3Task:                       # implements TrainTask
        def __init__(self, cfg: dict, target: sbj.Target): ...
        ...

    register_task("eagle3", Eagle3Task)     # builder(cfg, target) -> TrainTask

`specblock-train eagle3 --config configs/drafters/eagle3.yaml` then calls `load_builtin_tasks()`
(which imports the modules in `BUILTIN_TASK_MODULES`), builds the task with
`TASKS["eagle3"](cfg, target)` and trains it. `cfg` is the whole YAML config (trainer keys and the
kind's own keys alike; see configs/drafters/README.md).

Contract of the methods (all pure, no hidden state changed between calls):
- `init_params(key)`: the trainable pytree of arrays (fp32 recommended; the optimizer state and
  checkpoints follow its structure). Called once per run, also on resume (as the restore template).
- `frozen()`: a pytree of arrays that is read but never trained (e.g. the target's params); passed
  unchanged to every `loss_fn` call and never donated, so it may share buffers with the target.
- `loss_fn(params, frozen, batch, key)`: runs under `jax.jit` and `jax.value_and_grad`. `batch` is
  the data iterator's dict of int32 [B, T] arrays ("tokens", "loss_mask", "attention_mask"; see
  `training.regen_dataset.pack_example`); `key` is this step's PRNG key
  (`fold_in(key(seed), step)`). Returns (scalar loss, {name: scalar}) where the names must not be
  "step", "loss", "lr", "grad_norm", "tokens_per_s" or "elapsed_s" (the trainer logs those).
- `decoding_drafter(params)`: (Drafter, drafter_params) for `sbj.generate` (evaluation of tau).
- `export(params, out_dir)`: writes the trained drafter folder (config + weights) to `out_dir`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable, Protocol

import jax

from specblock_jax.models.transformer import apply, causal_mask, positions_from_valid

if TYPE_CHECKING:
    import specblock_jax as sbj

# Modules that register drafter tasks when imported; a module that does not exist (yet) is skipped.
BUILTIN_TASK_MODULES: tuple[str, ...] = (
    "specblock_jax.drafters.eagle3_train", "specblock_jax.drafters.specblock_train",
    "specblock_jax.drafters.dflash_train")


class TrainTask(Protocol):
    """One drafter kind's training: params to optimise, a loss, and how to decode/export it."""

    def init_params(self, key: jax.Array) -> Any: ...  # the trainable pytree

    def frozen(self) -> Any: ...  # frozen pytree (e.g. target params), passed to every loss call

    def loss_fn(self, params, frozen, batch: dict[str, jax.Array], key: jax.Array
                ) -> tuple[jax.Array, dict[str, jax.Array]]: ...  # scalar loss, scalar metrics

    def decoding_drafter(self, params) -> tuple[Any, Any]: ...  # (Drafter, drafter_params)

    def export(self, params, out_dir: str) -> None: ...  # save the trained drafter folder


def frozen_target_outputs(target: "sbj.Target", params, batch: dict[str, jax.Array],
                          hidden_ids: tuple[int, ...], logits: bool = True):
    """The frozen target over a training batch (inside a `loss_fn`): (hidden [B, T, n, H] at
    `hidden_ids`, logits [B, T, V] or None), under stop_gradient."""
    tokens, valid = batch["tokens"], batch["attention_mask"]
    b, t = tokens.shape
    out = apply(target.graphdef, params, tokens, positions_from_valid(valid), causal_mask(b, t, valid),
                hidden_ids=hidden_ids, compute_logits=logits)
    return jax.lax.stop_gradient((out.hidden, out.logits))


# kind -> builder(config dict, target); filled by register_task(kind, builder)
TASKS: dict[str, Callable[[dict, "sbj.Target"], TrainTask]] = {}


def register_task(kind: str, builder: Callable[[dict, "sbj.Target"], TrainTask]) -> None:
    """Registers `builder(cfg, target) -> TrainTask` as drafter kind `kind`.

    Re-registering the same builder (a module imported twice) is a no-op; a different builder
    under a taken name is refused, as is the reserved name "target" (the target trainer).
    """
    if not kind or not kind.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"task kind {kind!r}: use letters, digits, '-' and '_'")
    if kind == "target":
        raise ValueError("task kind 'target' is reserved for the target trainer")
    if not callable(builder):
        raise TypeError(f"task {kind!r}: builder must be callable(cfg, target), got {builder!r}")
    if TASKS.get(kind, builder) is not builder:
        raise ValueError(f"task kind {kind!r} is already registered by {TASKS[kind]!r}")
    TASKS[kind] = builder


def load_builtin_tasks() -> dict[str, Callable[[dict, "sbj.Target"], TrainTask]]:
    """Imports the drafter modules of `BUILTIN_TASK_MODULES` (they register their tasks) and
    returns `TASKS`. A module that is missing is skipped; an error inside one is raised."""
    for name in BUILTIN_TASK_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as e:
            if e.name != name:  # the module exists but something it imports is missing
                raise
    return TASKS
