"""The drafter registry: one entry per drafter kind, found by the kind's short name.

A kind is the name written as "kind" in a drafter folder's `config.json` ("eagle3", "specblock",
"dflash", "blockpilot", ...). Its entry holds everything the rest of the code asks of a kind:

    register(DrafterKind(
        name="eagle3",                 # config.json "kind"; also `Eagle3Drafter.kind`
        load=load_eagle3,              # (path, meta, target, dtype, decoding) -> (Drafter, params)
        task=Eagle3Task,               # optional: builder(TrainConfig, Target) -> TrainTask (BlockPilot's
                                       #   policy task also takes its data: blockpilot/_train.py)
        objective=eagle3_objective,    # optional: serving-time adaptation loss (adaptation/objective.py)
        budget_knob="num_nodes", grid={...},  # auto serving's and calibration's knob (serving/)
        formats=(ReleasedFormat(...),),       # released layouts it reads and writes (hf_format.py)
        aot=AotPreset(...),            # its drafter as released, for ahead-of-time pricing (aot/)
        train_command=main,            # optional: a kind trained by a command of its own (BlockPilot)
        method_settings={"oracle": f}, # optional: host-side method settings (BlockPilot's oracle)
    ))

Kinds are found by convention: kind `k` is the package `specblock_jax.drafters.k`, whose
`__init__.py` makes the one `register(...)` call (its model, training task and formats live in
`_`-prefixed modules beside it). A kind defined outside the package registers the same way when its
module is imported. Adding a drafter = one folder and one `register(...)` call; nothing outside
the kind's package names it (tests/test_kinds.py checks).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pkgutil
from typing import Any, Callable

PACKAGE = "specblock_jax.drafters"


@dataclasses.dataclass(frozen=True)
class ReleasedFormat:
    """A folder layout other than ours that a kind's drafters are released in (a serving engine's,
    or a public release's), read by `load_drafter` (detected from config.json) and written by
    `save_drafter(format=name)`; drafters/hf_format.py dispatches to it and has the helpers the
    engine layouts share."""

    name: str
    kind: str  # the kind whose drafters it holds: `save_drafter(format=name)` refuses another kind's
    detect: Callable[[dict], bool]  # a folder's config.json -> is it this layout
    import_meta: Callable[..., dict]  # (path, config.json, target config) -> our drafter meta
    read_weights: Callable[..., tuple]  # (path, meta, config, target) -> (flat params, DraftVocab | None)
    export: Callable[..., Any]
    """(drafter, flat params, vocab, path, *, dtype, max_positions, verifier, chat,
    verifier_architectures) -> path (keywords: `hf_format.export`'s)."""


@dataclasses.dataclass(frozen=True)
class AotPreset:
    """A kind's drafter as released, for ahead-of-time pricing from a CPU host (specblock_jax/aot:
    abstract weights at a deployment target's shapes; the aot presets and train modules read this
    and name no kind)."""

    drafter: type
    """The decoding drafter class: its settings, plus `config` and `graphdef` for a network."""
    size_knob: str
    """The decoding setting that sizes a step: "block_size" takes `price_method`'s `block` (else its
    `nodes`); any other (a tree's "num_nodes") its `nodes`."""
    config: type | None = None  # the architecture config class (a folder's "config"); None: no network
    model: type | None = None  # the nnx model class
    released: Callable[[Any], Any] | None = None
    """Target ModelConfig -> the drafter config sized as released for it."""
    decoding: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The released decoding settings (under the method's ':key=value' overrides)."""
    priced_settings: tuple[str, ...] = ()
    """Decoding settings a bench's drafter passes to the priced method besides its size."""
    extra_params: Callable[[Any, dict], dict] | None = None
    """(config, abstract target params) -> decoding params beyond {"draft", "embed"} and a draft
    vocabulary's {"d2t", "t2d"} (DFlash: the target's head)."""
    train_settings: Callable[[Any, Any], dict] | None = None
    """(drafter, a scratch folder) -> the training settings that reproduce the drafter's config
    (a reduced draft vocabulary's placeholder map is written to the folder); None: no train step."""
    abstract_task: Callable[[Callable, dict, Any], Any] | None = None
    """(task builder, settings, abstract Target) -> the training task, for a task that reads the
    target's weights when built (default: the builder called as it is)."""


@dataclasses.dataclass(frozen=True)
class Converter:
    """A kind's `specblock-convert KIND ...` subcommand (train/convert.py): a released artefact
    that is not a drafter folder (a policy's model.pt, a whole release) to ours, and back."""

    help: str
    arguments: Callable[[Any], None]  # adds the subcommand's arguments to an argparse parser
    run: Callable[[Any], str]  # the parsed arguments -> the line printed; ValueError on a refusal


@dataclasses.dataclass(frozen=True)
class DrafterKind:
    """A drafter kind: its folder loader and, when it trains, its training task and adaptation
    objective (see the module docstring for their signatures), and what serving, the released
    formats, ahead-of-time pricing and the command-line tools ask of it."""

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
    aot: AotPreset | None = None
    """Its released drafter for `specblock-aot` (see `AotPreset`; a kind that drives another's
    drafter may give that kind's); None: not priced."""
    convert: Converter | None = None
    """Its `specblock-convert` subcommand, if it has one."""
    train_command: Callable[[list[str], str], None] | None = None
    """For a kind trained from labels its own command decodes (not from a YAML config by the one
    trainer): its `main(argv, prog)`, which `specblock-train KIND ARGS` runs (BlockPilot's lives
    in its package, `_command.py`)."""
    method_settings: dict[str, Callable[[Any, str, Any], Any]] = dataclasses.field(default_factory=dict)
    """A method's `:key=value` settings that the kind applies on the host to a loaded drafter
    (not decoding settings): {key: (LoadedDrafter, value, Target) -> LoadedDrafter}, ValueError
    on a bad value (BlockPilot's `oracle=LABELS_DIR`; `specblock-bench` applies them by name)."""
    presets: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    """Named decoding settings (e.g. EAGLE-3's "paper": the paper's tree), chosen with
    `load_drafter(..., preset=NAME)` or a method's ':preset=NAME'; other settings given beside
    it override the preset's (`decoding_settings`)."""

    def decoding_settings(self, decoding: dict[str, Any], where: str = "") -> dict[str, Any]:
        """`decoding` with a "preset" entry expanded into the preset's settings (the others
        given win); a clear error naming the kind's presets for an unknown one."""
        if "preset" not in decoding:
            return dict(decoding)
        rest = {k: v for k, v in decoding.items() if k != "preset"}
        name = decoding["preset"]
        if name not in self.presets:
            have = ", ".join(sorted(self.presets)) or "none"
            raise ValueError(f"{where + ': ' if where else ''}the {self.name} kind has no decoding preset "
                             f"{name!r} (presets: {have})")
        return {**self.presets[name], **rest}


_KINDS: dict[str, DrafterKind] = {}


def register(kind: DrafterKind) -> DrafterKind:
    """Registers `kind` under `kind.name`. Registering the same entry again (a module imported
    twice) is a no-op; another entry under a taken name is refused, as is the name "target", and
    a released format that names another kind."""
    name = kind.name
    if not name or not name.replace("_", "").isalnum() or not name[0].isalpha():
        raise ValueError(f"drafter kind {name!r}: use a letter, then letters, digits and '_'")
    if name == "target":
        raise ValueError("drafter kind 'target' is reserved for the target trainer")
    if name in _KINDS and _KINDS[name] != kind:
        raise ValueError(f"drafter kind {name!r} is already registered ({_KINDS[name]})")
    for fmt in kind.formats:
        if fmt.kind != name:
            raise ValueError(f"drafter kind {name!r}: its format {fmt.name!r} holds {fmt.kind!r} drafters")
    _KINDS[name] = kind
    return kind


def unregister(name: str) -> None:
    """Forgets kind `name` (a test's toy kind); unknown names are ignored."""
    _KINDS.pop(name, None)


def _import_kind(name: str) -> None:
    """Imports the package that registers kind `name` by convention, if there is one."""
    module = f"{PACKAGE}.{name}"
    if importlib.util.find_spec(module) is not None:
        importlib.import_module(module)


def get(name: str) -> DrafterKind:
    """The entry of kind `name`; a clear error for an unknown one."""
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
    """Every registered kind's released formats by name (kinds in name order)."""
    return {f.name: f for k in kinds() for f in _KINDS[k].formats}


def kind_of(drafter: Any, required: bool = True) -> DrafterKind | None:
    """The entry of a decoding-side drafter (its `kind` attribute); for a drafter of no registered
    kind (e.g. a test's), an error, or None when not `required`."""
    name = getattr(drafter, "kind", None)
    if not required and (name is None or name not in kinds()):
        return None
    if name is None:
        raise ValueError(f"{type(drafter).__name__} has no `kind`: it is not a registered drafter")
    return get(name)


def method_setting_names() -> set[str]:
    """Every registered kind's host-side method setting names (`DrafterKind.method_settings`)."""
    return {key for name in kinds() for key in get(name).method_settings}
