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

Kinds are found by convention: the entry of kind `k` is registered when its module is imported,
`specblock_jax.drafters.k_train` for a trainable kind (it imports `specblock_jax.drafters.k`, which
defines the drafter), else `specblock_jax.drafters.k`. A kind defined outside the package registers
the same way when its module is imported. Adding a drafter = its module (+ its `_train` module)
and one `register(...)` call.
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
class DrafterKind:
    """A drafter kind: its folder loader and, when it trains, its training task and adaptation
    objective (see the module docstring for their signatures)."""

    name: str
    load: Callable[..., tuple[Any, Any]]
    task: Callable[..., Any] | None = None
    objective: Callable[..., Any] | None = None


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
    """Imports the module that registers kind `name` by convention, if there is one."""
    for module in (f"{PACKAGE}.{name}_train", f"{PACKAGE}.{name}"):
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)
            return


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
        if not info.name.startswith("_") and info.name not in _KINDS:
            _import_kind(info.name.removesuffix("_train"))
    return sorted(k for k, v in _KINDS.items() if v.task is not None or not trainable)


def kind_of(drafter: Any) -> DrafterKind:
    """The entry of a decoding-side drafter (its `kind` attribute)."""
    name = getattr(drafter, "kind", None)
    if name is None:
        raise ValueError(f"{type(drafter).__name__} has no `kind`: it is not a registered drafter")
    return get(name)
