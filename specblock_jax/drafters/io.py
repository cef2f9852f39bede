"""Drafter folders: `config.json` (kind, architecture, decoding settings) + `model.safetensors`.

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

from specblock_jax.models.config import RopeConfig
from specblock_jax.models.target import Target


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        out.update(_flatten(v, name + "/") if isinstance(v, dict) else {name: v})
    return out


def _fill(template: dict, flat: dict[str, np.ndarray], dtype, where: str, prefix: str = "") -> dict:
    """The template's structure with arrays from `flat` (shapes checked, every key used)."""
    out = {}
    for k, v in template.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out[k] = _fill(v, flat, dtype, where, name + "/")
            continue
        if name not in flat:
            raise ValueError(f"{where}: tensor {name!r} is missing")
        x = flat.pop(name)
        if tuple(x.shape) != tuple(v.shape):
            raise ValueError(f"{where}: tensor {name!r} has shape {x.shape}, expected {v.shape}")
        out[k] = jnp.asarray(x.astype(dtype))
    return out


def save_drafter(drafter, params: dict, path: str | os.PathLike, dtype: str = "bfloat16") -> Path:
    """Writes the drafter's settings and its trainable weights (stored as `dtype`)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    kind = getattr(drafter, "kind", None) or type(drafter).__name__
    settings = {f.name: getattr(drafter, f.name) for f in dataclasses.fields(drafter)
                if f.name not in ("config", "graphdef")}
    meta = {"kind": kind, "config": dataclasses.asdict(drafter.config), "decoding": settings}
    (path / "config.json").write_text(json.dumps(meta, indent=2))
    np_dtype = jnp.dtype(dtype)
    flat = {k: np.asarray(jax.device_get(v)).astype(np_dtype) for k, v in _flatten(params).items()}
    save_file(flat, str(path / "model.safetensors"), metadata={"format": "flax"})
    return path


def load_drafter(path: str | os.PathLike, target: Target, dtype: str | None = None, **decoding):
    """(Drafter, params) ready for `sbj.generate(target, ..., drafter=...)`. `decoding` overrides
    the saved decoding settings (e.g. num_nodes=32, depth=6)."""
    from specblock_jax.drafters.eagle3 import Eagle3Config, Eagle3Drafter, abstract_eagle3

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path}: not a drafter folder (config.json is missing)")
    meta = json.loads((path / "config.json").read_text())
    if meta.get("kind") not in ("Eagle3Drafter",):
        raise ValueError(f"{path}: unknown drafter kind {meta.get('kind')!r}")
    raw = dict(meta["config"])
    raw["rope"] = RopeConfig(**raw["rope"])
    raw["feature_layers"] = tuple(raw["feature_layers"])
    raw["dtype"] = dtype or target.config.dtype
    config = Eagle3Config(**raw)
    tc = target.config
    if (config.vocab_size, config.hidden_size) != (tc.vocab_size, tc.hidden_size) or max(
            config.feature_layers) > tc.num_layers:
        raise ValueError(f"{path}: drafter trained for vocab {config.vocab_size}, width "
                         f"{config.hidden_size}, layers {config.feature_layers}; the target has vocab "
                         f"{tc.vocab_size}, width {tc.hidden_size}, {tc.num_layers} layers")
    graphdef, template = abstract_eagle3(config)
    flat = load_file(str(path / "model.safetensors"))
    params = _fill(template, flat, jnp.dtype(config.dtype), str(path))
    if flat:
        raise ValueError(f"{path}: unexpected tensors {sorted(flat)}")
    drafter = Eagle3Drafter(config, graphdef, **{**meta["decoding"], **decoding})
    return drafter, {"draft": params, "embed": target.params["embed_tokens"]}
