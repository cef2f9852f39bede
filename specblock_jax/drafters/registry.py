"""The drafter registry: one entry per drafter kind, found by the kind's short name.

A kind is the name written as "kind" in a drafter folder's `config.json` ("eagle3", "specblock",
"dflash", "blockpilot", ...). Its entry holds everything the framework needs to know about it:

    register(DrafterKind(
        name="eagle3",                 # config.json "kind"; also `Eagle3Drafter.kind`
        load=load_eagle3,              # (path, meta, target, dtype, decoding) -> (Drafter, params)
        task=Eagle3Task,               # optional: builder(TrainConfig, Target) -> TrainTask (BlockPilot's
                                       #   policy task also takes its data: blockpilot_train.py)
        objective=eagle3_objective,    # optional: serving-time adaptation loss (adaptation/objective.py)
    ))

Kinds are found by convention: kind `k` is the package `specblock_jax.drafters.k`, whose
`__init__.py` makes the one `register(...)` call (its model, training task and formats live in
`_`-prefixed modules beside it). A kind defined outside the package registers the same way when its
module is imported. Adding a drafter = one folder and one `register(...)` call.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pkgutil
from typing import Any, Callable

PACKAGE = "specblock_jax.drafters"

# Kind names that older drafter folders wrote (the drafter class name) -> the kind.
LEGACY_NAMES = {"Eagle3Drafter": "eagle3", "SpecBlockDrafter": "specblock", "DFlashDrafter": "dflash",
                "BlockPilotDrafter": "blockpilot"}


@dataclasses.dataclass(frozen=True)
class ReleasedFormat:
    """A folder layout of a kind's released checkpoints (besides ours and the engine layouts of
    drafters/hf_format.py), read by `load_drafter` and written by `save_drafter(format=name)`."""

    name: str
    detect: Callable[[dict], bool]  # a folder's config.json -> is it this layout
    import_meta: Callable[..., dict]  # (path, config.json, target config) -> our drafter meta
    read_weights: Callable[..., tuple]  # (path, meta, config, target) -> (flat params, DraftVocab | None)
    export: Callable[..., Any]  # (drafter, flat params, vocab, path, dtype, max_positions, chat) -> path


@dataclasses.dataclass(frozen=True)
class DrafterKind:
    """A drafter kind: its folder loader and, when it trains, its training task and adaptation
    objective (see the module docstring for their signatures)."""

    name: str
    load: Callable[..., tuple[Any, Any]]
    task: Callable[..., Any] | None = None
    objective: Callable[..., Any] | None = None
    budget_knob: str | None = None
    """The decoding setting that sizes a step's draft (e.g. "num_nodes"), which auto serving and
    calibration vary; None: the kind has none."""
    grid: dict[str, tuple[int, ...]] | None = None
    """Calibration's default candidates per decoding knob (serving/calibrate.py); None: the kind
    is not calibrated."""
    knob_range: Callable[[Any, str], tuple[int, int]] | None = None
    """(drafter, knob) -> the [low, high] values calibration may try (None: any positive)."""
    formats: tuple[ReleasedFormat, ...] = ()
    """Released layouts the kind reads and writes (see `ReleasedFormat`)."""
    weights: bool = True
    """False for a kind with no folder (prompt lookup): `load_drafter(name)` builds it from its
    name and decoding settings alone (`load` gets path None)."""


_KINDS: dict[str, DrafterKind] = {}


def register(kind: DrafterKind) -> DrafterKind:
    """Registers `kind` under `kind.name`. Registering the same entry again (a module imported
    twice) is a no-op; another entry under a taken name is refused, as is the name "target"."""
    name = kind.name
    if not name or not name.replace("_", "").isalnum() or not name[0].isalpha():
        raise ValueError(f"drafter kind {name!r}: use a letter, then letters, digits and '_'")
    if name == "target":
        raise ValueError("drafter kind 'target' is reserved for the target trainer")
    if name in _KINDS and _KINDS[name] != kind:
        raise ValueError(f"drafter kind {name!r} is already registered ({_KINDS[name]})")
    _KINDS[name] = kind
    return kind


def _import_kind(name: str) -> None:
    """Imports the package that registers kind `name` by convention, if there is one."""
    module = f"{PACKAGE}.{name}"
    if importlib.util.find_spec(module) is not None:
        importlib.import_module(module)


def get(name: str) -> DrafterKind:
    """The entry of kind `name` (legacy class names accepted); a clear error for an unknown one."""
    name = LEGACY_NAMES.get(name, name)
    if name not in _KINDS and isinstance(name, str) and name.replace("_", "").isalnum():
        _import_kind(name)
    if name not in _KINDS:
        raise ValueError(f"unknown drafter kind {name!r} (known: {', '.join(kinds())})")
    return _KINDS[name]


def kinds(trainable: bool = False) -> list[str]:
    """Every kind name: the package's drafter modules and any registered from elsewhere;
    `trainable` keeps the kinds with a training task."""
    for info in pkgutil.iter_modules(importlib.import_module(PACKAGE).__path__):
        if info.ispkg and not info.name.startswith("_") and info.name not in _KINDS:
            _import_kind(info.name)
    return sorted(k for k, v in _KINDS.items() if v.task is not None or not trainable)


def released_formats() -> dict[str, ReleasedFormat]:
    """Every registered kind's released formats by name."""
    kinds()
    return {f.name: f for kind in _KINDS.values() for f in kind.formats}


def kind_of(drafter: Any) -> DrafterKind:
    """The entry of a decoding-side drafter (its `kind` attribute)."""
    name = getattr(drafter, "kind", None)
    if name is None:
        raise ValueError(f"{type(drafter).__name__} has no `kind`: it is not a registered drafter")
    return get(name)
