"""Drafter folders: `config.json` (kind, architecture, decoding settings) + `model.safetensors`.

The "kind" names the drafter kind in the registry (`drafters/registry.py`), which knows its loader.

A drafter folder holds only the drafter's own trained weights. Weights it shares with its target
(the frozen embedding) are taken from the target at load time, after checking that the target's
vocabulary and width match the ones the drafter was trained for.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from specblock_jax import writing
from specblock_jax.drafters import draft_vocab, hf_format, registry
from specblock_jax.drafters.base import LoadedDrafter
from specblock_jax.models.target import Target


def flatten_params(tree: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dict of arrays -> {"a/b/c": array}."""
    out = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        out.update(flatten_params(v, name + "/") if isinstance(v, dict) else {name: v})
    return out


def fill_params(template: dict, flat: dict[str, np.ndarray], dtype, where: str, prefix: str = "") -> dict:
    """The template's structure with arrays from `flat` (shapes checked, every key used)."""
    out = {}
    for k, v in template.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out[k] = fill_params(v, flat, dtype, where, name + "/")
            continue
        if name not in flat:
            raise ValueError(f"{where}: tensor {name!r} is missing")
        x = flat.pop(name)
        if tuple(x.shape) != tuple(v.shape):
            raise ValueError(f"{where}: tensor {name!r} has shape {x.shape}, expected {v.shape}")
        out[k] = jnp.asarray(x.astype(dtype))
    return out


def save_drafter(drafter, params: dict, path: str | os.PathLike, dtype: str = "bfloat16",
                 format: str = hf_format.NATIVE, vocab=None, *, target=None, overwrite: bool = False,
                 **engine) -> Path:
    """Writes the drafter's settings and its trainable weights (stored as `dtype`).

    params: its trainable params, or the decoding params `load_drafter` returns ({"draft", "embed"
    [, "d2t", "t2d"]}: the reduced draft vocabulary is taken from them). vocab: a DraftVocab
    (drafters/draft_vocab.py) saved with it. format: "specblock" (ours: every kind) or a layout
    its kind registers (`hf_format.formats()`): a serving engine's, "eagle3" / "speculators"
    (EAGLE-3) or "dflash", or a public release's, "specblock_hf". Those layouts record facts of
    the target the drafter serves, so they need `target` (a Target, or its HF folder): its
    position limit, its name for the engine (`verifier=` if given, else the folder the target was
    loaded from) and its architectures, the same fields `specblock-export` writes
    (`hf_format.target_fields`). `engine`: chat (the chat format trained on), verifier, or the
    fields themselves (max_positions, verifier_architectures: `hf_format.export`).
    A folder under the shipped assets/ is refused unless `overwrite` (writing.py); files are
    written with the user's umask."""
    writing.check_writable(path, overwrite)
    if "draft" in params:
        if vocab is None and "d2t" in params:
            vocab = draft_vocab.DraftVocab(np.asarray(params["d2t"]), np.asarray(params["t2d"]))
        params = params["draft"]
    if format not in hf_format.formats():
        raise ValueError(f"format {format!r}: choose from {hf_format.formats()}")
    if format != hf_format.NATIVE:
        if target is not None:
            engine = {**hf_format.target_fields(target, engine.pop("verifier", "")), **engine}
        out = hf_format.export(drafter, flatten_params(params), vocab, path, format, dtype, **engine)
        writing.follow_umask(out)
        return out
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    kind = drafter.kind
    settings = {f.name: getattr(drafter, f.name) for f in dataclasses.fields(drafter)
                if f.name not in ("config", "graphdef")}
    meta = {"kind": kind, "config": dataclasses.asdict(drafter.config), "decoding": settings}
    if engine.get("chat"):
        meta["chat"] = engine["chat"]
    (path / "config.json").write_text(json.dumps(meta, indent=2))
    np_dtype = jnp.dtype(dtype)
    flat = {k: np.asarray(jax.device_get(v)).astype(np_dtype) for k, v in flatten_params(params).items()}
    save_file(flat, str(path / "model.safetensors"), metadata={"format": "flax"})
    if vocab is not None:
        draft_vocab.save(path, vocab)
    writing.follow_umask(path)
    return path


def load_weights(path: Path, template: dict, dtype) -> dict:
    """The drafter folder's weights in the structure of `template` (every tensor checked)."""
    flat = load_file(str(path / "model.safetensors"))
    params = fill_params(template, flat, jnp.dtype(dtype), str(path))
    if flat:
        raise ValueError(f"{path}: unexpected tensors {sorted(flat)}")
    return params


def check_target(path: Path, vocab_size: int, hidden_size: int, layers: tuple[int, ...], target: Target):
    """Refuses a target whose vocabulary, width or depth differ from what the drafter was trained on."""
    tc = target.config
    if (vocab_size, hidden_size) != (tc.vocab_size, tc.hidden_size) or max(layers) > tc.num_layers:
        raise ValueError(f"{path}: drafter trained for vocab {vocab_size}, width {hidden_size}, "
                         f"layers {layers}; the target has vocab {tc.vocab_size}, width "
                         f"{tc.hidden_size}, {tc.num_layers} layers")


def record_chat(path: str | os.PathLike, chat: dict[str, Any]) -> None:
    """Adds the chat format a drafter was trained on (`training.chat.ChatFormat.record`) to its
    folder's config.json as "chat"."""
    file = Path(path) / "config.json"
    meta = json.loads(file.read_text())
    meta["chat"] = chat
    file.write_text(json.dumps(meta, indent=2))


def check_chat(meta: dict, chat: dict[str, Any] | None, where: str) -> None:
    """ValueError naming the field when serving's chat format `chat` ({"chat_template_sha256",
    "enable_thinking"}, `ChatFormat.record`) differs from the one the drafter recorded. Either
    side None (raw text) is not checked."""
    recorded = meta.get("chat")
    if not recorded or chat is None:
        return
    for field in ("chat_template_sha256", "enable_thinking"):
        if recorded.get(field) != chat.get(field):
            raise ValueError(f"{where}: chat format mismatch in {field}: the drafter was trained with "
                             f"{recorded.get(field)!r}, serving uses {chat.get(field)!r}")


def load_drafter(path: str | os.PathLike, target: Target, dtype: str | None = None,
                 chat: dict[str, Any] | None = None, **decoding) -> LoadedDrafter:
    """The drafter with its weights, ready for `sbj.generate(target, ..., drafter=...)`. path: a
    drafter folder, or the name of a kind with no weights ("prompt_lookup"). `decoding` overrides
    the saved decoding settings (e.g. num_nodes=32, depth=6; preset="paper": a named set of
    them, `DrafterKind.presets`). `chat`: the chat format prompts are
    served in (`ChatFormat(...).record(tokenizer)`), refused when the drafter recorded another
    (`check_chat`). A folder in a serving engine's layout (EAGLE-3, speculators, DFlash) is
    imported (`drafters/hf_format.py`). Errors name the folder or file."""
    name = str(path)
    if name in registry.kinds() and not registry.get(name).weights and not Path(name).exists():
        kind = registry.get(name)
        drafter, params = kind.load(None, {"kind": name, "decoding": {}}, target,
                                    dtype or target.config.dtype, kind.decoding_settings(decoding, name))
        return LoadedDrafter(drafter, params)
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such drafter folder")
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path}: not a drafter folder (config.json is missing)")
    try:
        meta = json.loads((path / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path / 'config.json'}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path / 'config.json'}: expected a JSON object")
    if "kind" not in meta:
        meta = hf_format.import_meta(path, meta, target.config)
    check_chat(meta, chat, str(path))
    try:
        kind = registry.get(meta.get("kind"))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    decoding = kind.decoding_settings(decoding, str(path))
    return LoadedDrafter(*kind.load(path, meta, target, dtype or target.config.dtype, decoding))
