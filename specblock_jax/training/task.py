"""The interface between a model to train and the one trainer (`training.trainer.train`), and typed
settings.

Everything the trainer trains is a `TrainTask`: the target itself (`training.target_task`), each
drafter kind (EAGLE-3, SpecBlock, DFlash: `drafters.base.DrafterTask`, whose trained drafter also decodes, for
the tau evaluation) and BlockPilot's policy (`drafters/blockpilot/_train.py`). A drafter kind names
its task's builder as the `task` of its registry entry (`specblock_jax.drafters.registry`):

    @dataclasses.dataclass(frozen=True)
    class Eagle3TrainConfig:                # the kind's own YAML keys, with their defaults
        ttt_steps: int = 4
        ...

    class Eagle3Task:                       # implements DrafterTask
        Settings = Eagle3TrainConfig
        def __init__(self, settings: Eagle3TrainConfig | Mapping, target: Target): ...

`specblock-train eagle3 --config configs/drafters/eagle3.yaml` splits the YAML into the run and
trainer keys (train/cli.py, trainer.py) and the kind's keys, which `parse_settings` turns into
the kind's frozen dataclass (an unknown key or a wrong type is an error naming the key).

Contract of the methods (all pure, no hidden state changed between calls):
- `init_params(key)`: the trainable pytree of arrays (fp32 recommended; the optimizer state and
  checkpoints follow its structure). Called once per run, also on resume (as the restore template).
- `frozen()`: a pytree of arrays that is read but never trained (e.g. the target's params); passed
  unchanged to every `loss_fn` call and never donated, so it may share buffers with the target.
- `loss_fn(params, frozen, batch, key)`: runs under `jax.jit` and `jax.value_and_grad`. `batch` is
  the data iterator's dict of arrays (drafters: int32 [B, T] "tokens", "loss_mask",
  "attention_mask", see `training.regen_dataset.pack_example`); `key` is this step's PRNG key
  (`fold_in(key(seed), step)`). Returns (scalar loss, {name: scalar}) where the names must not be
  the trainer's own record keys (`trainer.RESERVED_METRICS`).
- `export(params, out_dir)`: writes the trained model's folder (config + weights) to `out_dir`;
  returns None or a dict of fields for the run's summary (e.g. the export's own validation).
- `optimizer(cfg)` (optional): (optax transformation, LR schedule) for the run's config, in place
  of the trainer's `make_optimizer`.
- `decoding_drafter(params)` (a `DrafterTask`): a `LoadedDrafter` for `sbj.generate`
  (`trainer.tau_evaluator`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Protocol

import jax

from specblock_jax.models.target import Target
from specblock_jax.models.transformer import apply, causal_mask, positions_from_valid


class TrainTask(Protocol):
    """One model's training: params to optimise, a loss, and how to export it."""

    def init_params(self, key: jax.Array) -> Any: ...  # the trainable pytree

    def frozen(self) -> Any: ...  # frozen pytree (e.g. target params), passed to every loss call

    def loss_fn(self, params, frozen, batch: dict[str, jax.Array], key: jax.Array
                ) -> tuple[jax.Array, dict[str, jax.Array]]: ...  # scalar loss, scalar metrics

    def export(self, params, out_dir: str) -> dict[str, Any] | None: ...  # the trained model's folder


def frozen_target_outputs(target: Target, params, batch: dict[str, jax.Array],
                          hidden_ids: tuple[int, ...], logits: bool = True):
    """The frozen target over a training batch (inside a `loss_fn`): (hidden [B, T, n, H] at
    `hidden_ids`, logits [B, T, V] or None), under stop_gradient."""
    tokens, valid = batch["tokens"], batch["attention_mask"]
    b, t = tokens.shape
    out = apply(target.graphdef, params, tokens, positions_from_valid(valid), causal_mask(b, t, valid),
                hidden_ids=hidden_ids, compute_logits=logits)
    return jax.lax.stop_gradient((out.hidden, out.logits))


def parse_settings(cls: type, values: Any, where: str = "") -> Any:
    """The frozen settings dataclass `cls` from a mapping (e.g. YAML keys), or `values` itself if
    it already is one. Lists become tuples, ints are accepted for floats; an unknown key or a
    value of the wrong type, or a missing required one, raises ValueError naming it (prefixed by
    `where`)."""
    if isinstance(values, cls):
        return values
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"{where}unknown setting(s) {unknown} for {cls.__name__} (known: {sorted(fields)})")
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    missing = sorted(required - set(values))
    if missing:
        raise ValueError(f"{where}missing setting(s) {missing} for {cls.__name__}")
    hints = typing.get_type_hints(cls)
    return cls(**{k: _coerce(f"{where}{k}", v, hints[k]) for k, v in values.items()})


def _coerce(name: str, value: Any, hint: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        hint = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name}={value!r}: expected a list")
        return tuple(_coerce(name, x, args[0]) for x in value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and (not isinstance(value, hint)
                                           or (hint is int and isinstance(value, bool))):
        raise ValueError(f"{name}={value!r}: expected {hint.__name__}")
    return value
