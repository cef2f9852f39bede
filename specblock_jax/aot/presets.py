"""Deployment presets: target configs from the models' public `config.json` (no weights), and
drafters sized as the released ones for a target.

    cfg = load_preset("qwen3-8b")                       # a ModelConfig in bf16
    cfg = load_target_config("path/to/hf_dir")          # or a config.json, or a preset name
    drafter, params = released_drafter("eagle3", cfg)   # params: jax.ShapeDtypeStruct leaves

Target presets copy the fields of the Hugging Face `config.json` of Qwen/Qwen3-{0.6B,1.7B,4B,8B,32B}
and meta-llama/Llama-3.1-{8B,70B} that `ModelConfig.from_hf` reads.

Drafters, as released for an 8B-scale target (/work/shared/METHODS.md, read from the public code):
each kind says how in its `DrafterKind.aot` (`registry.AotPreset`, the kind's `_aot.py`):
  eagle3     1 decoder layer at the target's widths, a 32,000-token draft vocabulary (d2t/t2d),
             features {2, L/2, L-3}; decoding: the shipped tree (16 nodes, top-k 4, depth 5)
  specblock  2 layers, block 4, 32,000-token draft vocabulary, rank head 256 wide; decoding: the
             shipped tree; the reference's ~90-node tree is `specblock:num_nodes=90:root_topk=10`
  dflash     z-lab's DFlash for Qwen3-8B: 5 layers at the target's widths, block 16, features
             evenly from 1 to L-3; the target's embedding and head
  blockpilot the DFlash drafter drafting at the block size given (its policy MLP runs once per
             request, after the prefill: not a step phase)
  prompt_lookup, ar: no network
A method is "ar" or a kind's name (`methods()`), and may carry ':key=value' decoding overrides
(`serving/methods.py` syntax), e.g. `eagle3:top_k=1:depth=5:num_nodes=6` (a chain of 5), or be a
drafter folder (its config.json is read, no weights).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from specblock_jax.serving.methods import parse_method
from specblock_jax.drafters import registry
from specblock_jax.drafters.common import abstract_model, config_from_meta
from specblock_jax.drafters.registry import AotPreset
from specblock_jax.models.config import ModelConfig
from specblock_jax.models.target import abstract_target

_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
          "head_dim": 128, "num_key_value_heads": 8, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
          "max_position_embeddings": 40960, "hidden_act": "silu", "torch_dtype": "bfloat16",
          "bos_token_id": 151643, "eos_token_id": 151645, "attention_bias": False,
          "use_sliding_window": False}
_LLAMA31 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
            "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "max_position_embeddings": 131072, "hidden_act": "silu", "torch_dtype": "bfloat16",
            "bos_token_id": 128000, "eos_token_id": 128001, "attention_bias": False,
            "mlp_bias": False, "tie_word_embeddings": False}


def _hf(base: dict, hidden, inter, layers, heads, tied) -> dict:
    return {**base, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "tie_word_embeddings": tied}


# preset name -> the fields of its public config.json that ModelConfig reads
PRESETS: dict[str, dict] = {
    "qwen3-0.6b": _hf(_QWEN3, 1024, 3072, 28, 16, True),
    "qwen3-1.7b": _hf(_QWEN3, 2048, 6144, 28, 16, True),
    "qwen3-4b": _hf(_QWEN3, 2560, 9728, 36, 32, True),
    "qwen3-8b": _hf(_QWEN3, 4096, 12288, 36, 32, False),
    "qwen3-32b": _hf(_QWEN3, 5120, 25600, 64, 64, False),
    "llama-3.1-8b": _hf(_LLAMA31, 4096, 14336, 32, 32, False),
    "llama-3.1-70b": _hf(_LLAMA31, 8192, 28672, 80, 64, False),
}
AR = "ar"  # target-only decoding: no drafter


def methods() -> tuple[str, ...]:
    """The method names `released_drafter` takes besides a drafter folder: "ar" and every kind
    with a released drafter (`DrafterKind.aot`)."""
    return (AR, *(k for k in registry.kinds() if registry.get(k).aot is not None))


def _folder_kinds() -> list[str]:
    """The kinds whose drafter folders can be priced: their preset builds their own network."""
    return [k for k in registry.kinds() if (p := registry.get(k).aot) is not None and p.model is not None
            and p.drafter.kind == k]


def load_preset(name: str, dtype: str = "bfloat16") -> ModelConfig:
    """The ModelConfig of preset `name` (one of PRESETS) in `dtype`."""
    if name not in PRESETS:
        raise ValueError(f"unknown target preset {name!r} (presets: {', '.join(PRESETS)})")
    return ModelConfig.from_hf(PRESETS[name], dtype=dtype)


def load_target_config(target: str | ModelConfig, dtype: str | None = None) -> ModelConfig:
    """A preset name, an HF folder or its config.json -> ModelConfig (dtype: as given, else the
    config's own; presets default to bf16). A ModelConfig passes through (in `dtype` if given)."""
    if isinstance(target, ModelConfig):
        return target.replace(dtype=dtype) if dtype else target
    if target in PRESETS:
        return load_preset(target, dtype or "bfloat16")
    path = Path(target)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"target {target!r} is neither a preset ({', '.join(PRESETS)}) nor an HF "
                         "folder / config.json")
    return ModelConfig.from_hf(json.loads(path.read_text()), dtype=dtype)


def _abstract_drafter_params(preset: AotPreset, config: Any, target_params: dict) -> dict:
    """The decoding params' shapes: {"draft", "embed"} (+ d2t/t2d of a draft vocabulary, + what the
    kind adds, e.g. DFlash's target head), as `load_model` and the kind's loader build them."""
    _, template = abstract_model(preset.model, config)
    params = {"draft": template, "embed": target_params["embed_tokens"]}
    size = getattr(config, "draft_vocab_size", 0)
    if size:
        params["d2t"] = jax.ShapeDtypeStruct((size,), jnp.int32)
        params["t2d"] = jax.ShapeDtypeStruct((config.vocab_size,), jnp.int32)
    if preset.extra_params is not None:
        params.update(preset.extra_params(config, target_params))
    return params


def _size(preset: AotPreset, nodes: int | None, block: int | None) -> int | None:
    """The value of the preset's size knob that `nodes` / `block` ask for (`AotPreset.size_knob`)."""
    return (block or nodes) if preset.size_knob == "block_size" else nodes


def released_drafter(method: str, cfg: ModelConfig, nodes: int | None = None,
                     block: int | None = None) -> tuple[Any, Any]:
    """(Drafter or None, abstract decoding params) for `method`: one of `methods()` (ar,
    prompt_lookup, eagle3, specblock, dflash, blockpilot) or a drafter folder, each with optional
    ':key=value' decoding overrides. nodes: the tree's node budget (a kind sized by "num_nodes");
    block: the block size of a kind sized by "block_size" (DFlash, BlockPilot; `nodes` if not
    given)."""
    base, overrides = parse_method(method)
    if base == AR:
        if overrides:
            raise ValueError(f"method {method!r}: ar takes no settings")
        return None, ()
    _, target_params = abstract_target(cfg)
    if base in registry.kinds() and registry.get(base).aot is not None:
        kind = base
        preset = registry.get(base).aot
        overrides = registry.get(kind).decoding_settings(overrides, method)
        if preset.model is None:  # no network (prompt lookup): its settings alone
            size = _size(preset, nodes, block)
            return preset.drafter(**{**({preset.size_knob: size} if size else {}), **overrides}), ()
        config = preset.released(cfg)
    elif (Path(base) / "config.json").is_file():
        meta = json.loads((Path(base) / "config.json").read_text())
        kind = meta.get("kind")
        if kind not in _folder_kinds():
            raise ValueError(f"{base}: drafter kind {kind!r} cannot be priced (kinds: {', '.join(_folder_kinds())})")
        preset = registry.get(kind).aot
        config = config_from_meta(preset.config, meta, cfg.dtype)
        overrides = {**meta.get("decoding", {}), **registry.get(kind).decoding_settings(overrides, method)}
    else:
        raise ValueError(f"method {method!r}: expected one of {methods()} or a drafter folder")
    overrides = {**preset.decoding, **overrides}
    size = _size(preset, nodes, block)
    if size:
        overrides[preset.size_knob] = size
    graphdef, _ = abstract_model(preset.model, config)
    overrides = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}
    drafter = preset.drafter(config=config, graphdef=graphdef, **overrides)
    return drafter, _abstract_drafter_params(preset, config, target_params)


def for_layers(drafter: Any, layers: int) -> Any:
    """`drafter` re-pointed at a `layers`-deep truncation of its target (layer-cost pricing,
    price.py): feature layers i -> min(i, layers - 1), DFlash's target depth -> layers; the
    number of features, and so every shape, is unchanged."""
    if drafter is None or not hasattr(drafter, "config") or not hasattr(drafter.config, "feature_layers"):
        return drafter
    c = drafter.config
    changes: dict[str, Any] = {"feature_layers": tuple(min(i, layers - 1) for i in c.feature_layers)}
    if hasattr(c, "target_layers"):
        changes["target_layers"] = layers
    config = dataclasses.replace(c, **changes)
    model = registry.get(drafter.kind).aot.model
    return dataclasses.replace(drafter, config=config, graphdef=abstract_model(model, config)[0])
