"""Deployment presets: target configs from the models' public `config.json` (no weights), and
drafters sized as the released ones for a target.

    cfg = load_preset("qwen3-8b")                       # a ModelConfig in bf16
    cfg = load_target_config("path/to/hf_dir")          # or a config.json, or a preset name
    drafter, params = released_drafter("eagle3", cfg)   # params: jax.ShapeDtypeStruct leaves

Target presets copy the fields of the Hugging Face `config.json` of Qwen/Qwen3-{0.6B,1.7B,4B,8B,32B}
and meta-llama/Llama-3.1-{8B,70B} that `ModelConfig.from_hf` reads.

Drafters, as released for an 8B-scale target (/work/shared/METHODS.md, read from the public code):
  eagle3     1 decoder layer at the target's widths, a 32,000-token draft vocabulary (d2t/t2d),
             features {2, L/2, L-3}; decoding: the shipped tree (assets/drafters/eagle3: 16 nodes,
             top-k 4, depth 5)
  specblock  2 layers, block 4, 32,000-token draft vocabulary, rank head 256 wide; decoding: the
             shipped tree (assets/drafters/specblock); the reference's ~90-node tree is
             `specblock:num_nodes=90:root_topk=10`
  dflash     z-lab's DFlash for Qwen3-8B (z-lab/Qwen3-8B-DFlash-b16; SpecForge
             configs/qwen3-8b-dflash.json): 5 layers at the target's widths, block 16,
             target_layer_ids evenly from 1 to L-3 ([1, 9, 17, 25, 33] for 36 layers; our HF
             hidden_states indices are those + 1); the target's embedding and head
  blockpilot the DFlash drafter drafting at the block size given (its policy MLP runs once per
             request, after the prefill: not a step phase)
  prompt_lookup, ar: no network
A method may carry ':key=value' decoding overrides (`serving/methods.py` syntax), e.g.
`eagle3:top_k=1:depth=5:num_nodes=6` (a chain of 5), or be a drafter folder (its config.json is
read, no weights).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from specblock_jax.serving.methods import parse_method
from specblock_jax.drafters.common import abstract_model, config_from_meta
from specblock_jax.drafters.dflash._model import DFlashConfig, DFlashDrafter, DFlashModel
from specblock_jax.drafters.eagle3._model import Eagle3Config, Eagle3Drafter, Eagle3Model
from specblock_jax.drafters.prompt_lookup._model import PromptLookup
from specblock_jax.drafters.specblock._model import SpecBlockConfig, SpecBlockDrafter, SpecBlockModel
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
DRAFT_VOCAB = 32000  # EAGLE-3's and SpecBlock's released draft vocabulary
METHODS = ("ar", "prompt_lookup", "eagle3", "specblock", "dflash", "blockpilot")
# decoding settings: the shipped drafters' trees (assets/drafters/{eagle3,specblock}/config.json
# "decoding", copied so an installed package needs no assets folder) and z-lab's DFlash block 16
RELEASED_DECODING = {
    "eagle3": {"num_nodes": 16, "top_k": 4, "depth": 5},
    "specblock": {"num_nodes": 16, "max_blocks": 2, "beam": 1, "slot_topk": (2, 4, 10, 0),
                  "root_topk": 4, "rank_tree": True, "fixed_branch": 2},
    "dflash": {"block_size": 16, "draft_mode": "auto", "draft_temperature": 1.0},
}
_KINDS = {"eagle3": (Eagle3Config, Eagle3Model, Eagle3Drafter),
          "specblock": (SpecBlockConfig, SpecBlockModel, SpecBlockDrafter),
          "dflash": (DFlashConfig, DFlashModel, DFlashDrafter)}


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


def dflash_layer_ids(num_layers: int, count: int = 5) -> tuple[int, ...]:
    """z-lab's DFlash feature layers as our HF hidden_states indices: `count` decoder-layer
    outputs evenly spaced from layer 1 to L-3 (z-lab's ids), + 1."""
    last = max(num_layers - 3, 1)
    ids = sorted({1 + round(i * (last - 1) / max(count - 1, 1)) for i in range(count)})
    return tuple(i + 1 for i in ids)


def _abstract_drafter_params(kind: str, config: Any, target_params: dict) -> dict:
    """The decoding params' shapes: {"draft", "embed"} (+ d2t/t2d of a draft vocabulary, + the
    target's head for DFlash), as `load_model` / `load_dflash` build them."""
    _, template = abstract_model(_KINDS[kind][1], config)
    params = {"draft": template, "embed": target_params["embed_tokens"]}
    size = getattr(config, "draft_vocab_size", 0)
    if size:
        params["d2t"] = jax.ShapeDtypeStruct((size,), jnp.int32)
        params["t2d"] = jax.ShapeDtypeStruct((config.vocab_size,), jnp.int32)
    if kind == "dflash":
        emb = target_params["embed_tokens"]
        head = target_params.get("lm_head")
        params["head"] = head if head is not None else jax.ShapeDtypeStruct(emb.shape[::-1], emb.dtype)
    return params


def released_config(kind: str, cfg: ModelConfig) -> Any:
    """The drafter config of kind `kind` sized as released for target `cfg`."""
    vocab = min(DRAFT_VOCAB, cfg.vocab_size)
    if kind == "eagle3":
        return Eagle3Config.for_target(cfg, draft_vocab_size=vocab)
    if kind == "specblock":
        return SpecBlockConfig.for_target(cfg, num_layers=2, block_size=4, draft_vocab_size=vocab,
                                          rank_hidden=256)
    if kind == "dflash":
        return DFlashConfig.for_target(cfg, num_layers=5, feature_layers=dflash_layer_ids(cfg.num_layers),
                                       block_size=16)
    raise ValueError(f"no released drafter of kind {kind!r}")


def released_drafter(method: str, cfg: ModelConfig, nodes: int | None = None,
                     block: int | None = None) -> tuple[Any, Any]:
    """(Drafter or None, abstract decoding params) for `method`: ar, prompt_lookup, eagle3,
    specblock, dflash, blockpilot, or a drafter folder, each with optional ':key=value' decoding
    overrides. nodes: the tree's node budget (eagle3, specblock, prompt_lookup); block: DFlash's
    block size (nodes for dflash/blockpilot = block)."""
    base, overrides = parse_method(method)
    if base == "ar":
        if overrides:
            raise ValueError(f"method {method!r}: ar takes no settings")
        return None, ()
    _, target_params = abstract_target(cfg)
    if base == "prompt_lookup":
        return PromptLookup(**{**({"num_nodes": nodes} if nodes else {}), **overrides}), ()
    if base in ("dflash", "blockpilot"):
        kind, config = "dflash", released_config("dflash", cfg)
    elif base in ("eagle3", "specblock"):
        kind, config = base, released_config(base, cfg)
    elif (Path(base) / "config.json").is_file():
        meta = json.loads((Path(base) / "config.json").read_text())
        kind = meta.get("kind")
        if kind not in _KINDS:
            raise ValueError(f"{base}: drafter kind {kind!r} cannot be priced (kinds: {', '.join(_KINDS)})")
        config = config_from_meta(_KINDS[kind][0], meta, cfg.dtype)
        overrides = {**meta.get("decoding", {}), **overrides}
    else:
        raise ValueError(f"method {method!r}: expected one of {METHODS} or a drafter folder")
    if kind == "dflash":
        overrides = {**RELEASED_DECODING["dflash"], **overrides}
        if block or nodes:
            overrides["block_size"] = block or nodes
    else:
        overrides = {**RELEASED_DECODING[kind], **overrides}
        if nodes:
            overrides["num_nodes"] = nodes
    graphdef, _ = abstract_model(_KINDS[kind][1], config)
    overrides = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}
    drafter = _KINDS[kind][2](config=config, graphdef=graphdef, **overrides)
    return drafter, _abstract_drafter_params(kind, config, target_params)


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
    kind = drafter.kind
    return dataclasses.replace(drafter, config=config, graphdef=abstract_model(_KINDS[kind][1], config)[0])
