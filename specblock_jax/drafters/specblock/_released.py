"""The released SpecBlock layout (shiweijiezero/SpecBlock, a SpecForge fork; the checkpoints
weijiezz/SpecBlock-Qwen3-8B and weijiezz/SpecBlock-Llama-3.1-8B-Instruct): read into our SpecBlock
drafter and written back.

    drafter, params = sbj.load_drafter("SpecBlock-Qwen3-8B", target)       # read (detected)
    sbj.save_drafter(drafter, params, "out", format="specblock_hf")         # written back

Read from the public code (`specforge/modeling/draft/_llama3_specblock_base.py`,
`llama3_specblock.py`, `scripts/train_specblock.py` `save_checkpoints`,
`benchmarks_hf/algorithms/_specblock_base.py` `load_model`). A folder holds config.json (a
LlamaConfig with `architectures` naming a SpecBlock class, `diffspec_draft_token_num` = K,
`rank_classes`, `draft_vocab_size`), model.safetensors (the drafter's state dict without the
embedding) and, with a reduced draft vocabulary, vocab_mapping.pt ({"d2t", "t2d"}, torch). HF
Linear weights are [out, in]; ours [in, ...]:

  input_layer.condition_proj.weight [H, 3H]   fc            (target features -> condition)
  input_layer.{condition,token,query}_norm.weight [H]       cond_norm / token_norm / query_norm
  input_layer.position_queries.weight [K, H]  slot_queries
  input_layer.fuse.weight [H, 3H]             fuse          over [condition; token; query]
  layers.N.{input_layernorm, post_attention_layernorm}.weight, layers.N.self_attn.{q,k,v,o}_proj
  .weight, layers.N.mlp.{gate,up,down}_proj.weight          layers/N/... (Llama layers, no q/k norm)
  shift_proj.N.weight [H, 2H]                 shift[N]      layer-wise shift before layer N + 1:
                                                            W [h_k; h_{k-1}], slot 0 with itself
  norm.weight, lm_head.weight [V', H]         norm, lm_head
  rank_head.0.weight [256, H + 15]            rank_in       (no bias: ours stay zero)
  rank_head.2.weight [4, 256]                 rank_out
  d2t int64 [V'] (target id = draft id + d2t), t2d bool [V]   buffers of the state dict

Their forward: slot k of position i sits at RoPE position i + 1 + k; attention sees every slot of
earlier positions and slots <= k of its own; head_dim = hidden_size // num_attention_heads; RoPE
plain or llama3-scaled (any other `rope_scaling` type is computed as plain); the rank head reads
[norm(h); 15 features of the top-20 logits] whose top-1 probability is normalised over the top 20
(our `rank_top1="top20"`). The target features are HF hidden_states [2, L/2, L-3] (their serving
code), or `eagle_config.eagle_aux_hidden_state_layer_ids` + 1 when the config names the layers it
was trained on (decoder-layer outputs). Every field their code reads is checked at import with an
error naming the field; what we cannot represent is refused with the reason.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
from safetensors.numpy import load_file, save_file

from specblock_jax.drafters import draft_vocab
from specblock_jax.models.config import RopeConfig
from specblock_jax.models.hf_io import HFWeight

FORMAT = "specblock_hf"
ARCH = "LlamaForCausalLMSpecBlock"  # their loader takes any architecture name containing "SpecBlock"
RANK_CLASSES, RANK_HIDDEN, DEFAULT_K = 4, 256, 7


# The config.json of the released checkpoints (weijiezz/SpecBlock-Qwen3-8B and
# weijiezz/SpecBlock-Llama-3.1-8B-Instruct), by the target preset they serve: with the presets of
# specblock_jax.aot they load abstractly, no weights, at deployment shapes.
RELEASED_CONFIGS = {
    "qwen3-8b": {"architectures": ["LlamaForCausalLMSpecBlockShift"], "bos_token_id": 151643,
                 "eos_token_id": 151645, "pad_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
                 "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
                 "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 32,
                 "num_key_value_heads": 8, "num_hidden_layers": 2, "rms_norm_eps": 1e-06, "rope_scaling": None,
                 "rope_theta": 1000000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                 "transformers_version": "4.51.0", "use_cache": True, "vocab_size": 151936,
                 "draft_vocab_size": 32000, "diffspec_draft_token_num": 4, "rank_classes": 4},
    "llama-3.1-8b": {"architectures": ["LlamaForCausalLMSpecBlock"], "bos_token_id": 128000,
                     "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
                     "intermediate_size": 14336, "max_position_embeddings": 2048, "model_type": "llama",
                     "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 2,
                     "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
                     "torch_dtype": "float16", "transformers_version": "4.28.1", "use_cache": True,
                     "vocab_size": 128256, "draft_vocab_size": 32000, "diffspec_draft_token_num": 4,
                     "rank_classes": 4},
}


def is_released(hf: dict) -> bool:
    return any("SpecBlock" in a for a in hf.get("architectures") or [])


def tensor_names(c) -> dict[str, HFWeight]:
    """Our flat param name -> its released tensor (`shift` [L-1, 2H, H] is stacked: `_shift_name`)."""
    h, n, k, d, f = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size
    nf = len(c.feature_layers)
    out = {"fc": HFWeight("input_layer.condition_proj.weight", (h, nf * h), True),
           "cond_norm/weight": HFWeight("input_layer.condition_norm.weight", (h,), False),
           "token_norm/weight": HFWeight("input_layer.token_norm.weight", (h,), False),
           "query_norm/weight": HFWeight("input_layer.query_norm.weight", (h,), False),
           "slot_queries": HFWeight("input_layer.position_queries.weight", (c.block_size, h), False),
           "fuse": HFWeight("input_layer.fuse.weight", (h, 3 * h), True),
           "norm/weight": HFWeight("norm.weight", (h,), False),
           "lm_head": HFWeight("lm_head.weight", (c.head_size, h), True),
           "rank_in": HFWeight("rank_head.0.weight", (RANK_HIDDEN, h + 15), True),
           "rank_out": HFWeight("rank_head.2.weight", (RANK_CLASSES, RANK_HIDDEN), True)}
    for i in range(c.num_layers):
        o, p = f"layers/{i}/", f"layers.{i}."
        out.update({
            f"{o}input_layernorm/weight": HFWeight(f"{p}input_layernorm.weight", (h,), False),
            f"{o}post_attention_layernorm/weight": HFWeight(f"{p}post_attention_layernorm.weight", (h,), False),
            f"{o}self_attn/q_proj": HFWeight(f"{p}self_attn.q_proj.weight", (n * d, h), True),
            f"{o}self_attn/k_proj": HFWeight(f"{p}self_attn.k_proj.weight", (k * d, h), True),
            f"{o}self_attn/v_proj": HFWeight(f"{p}self_attn.v_proj.weight", (k * d, h), True),
            f"{o}self_attn/o_proj": HFWeight(f"{p}self_attn.o_proj.weight", (h, n * d), True),
            f"{o}mlp/gate_proj": HFWeight(f"{p}mlp.gate_proj.weight", (f, h), True),
            f"{o}mlp/up_proj": HFWeight(f"{p}mlp.up_proj.weight", (f, h), True),
            f"{o}mlp/down_proj": HFWeight(f"{p}mlp.down_proj.weight", (h, f), True)})
    return out


def _our_shape(name: str, w: HFWeight, c) -> tuple[int, ...]:
    if name.endswith(("q_proj", "k_proj", "v_proj")):
        return (c.hidden_size, c.num_heads if name.endswith("q_proj") else c.num_kv_heads, c.head_dim)
    if name.endswith("o_proj"):
        return (c.num_heads, c.head_dim, c.hidden_size)
    return w.hf_shape[::-1] if w.transposed else w.hf_shape


def _shift_name(i: int) -> str:
    return f"shift_proj.{i}.weight"  # [H, 2H]: our shift[i] [2H, H] transposed


# ------------------------------------------------------------------------------------ import


def _fail(path, field, msg):
    raise ValueError(f"{path}: config field {field!r}: {msg}")


def _rope(path, hf: dict) -> RopeConfig:
    """The RoPE their attention computes: plain with rope_theta (default 10000), or llama3-scaled
    (a transformers-5 `rope_parameters` alone is read as those two)."""
    if "rope_theta" not in hf and "rope_scaling" not in hf and hf.get("rope_parameters"):
        params = hf["rope_parameters"]
        hf = {"rope_theta": params.get("rope_theta", 10000.0), "rope_scaling": params}
    scaling = hf.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    theta = float(hf.get("rope_theta", 10000.0))
    if kind != "llama3":
        if kind not in (None, "default"):
            _fail(path, "rope_scaling", f"type {kind!r}: their drafter ignores it and rotates plainly, "
                                        "which the field contradicts; drop the field to import it as plain RoPE")
        return RopeConfig(theta)
    missing = [f for f in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
               if scaling.get(f) is None]
    if missing:
        _fail(path, "rope_scaling", f"llama3 without {missing}: their drafter then rotates plainly")
    return RopeConfig.from_hf({"rope_scaling": scaling, "rope_theta": theta})


def _feature_layers(path, hf: dict, tc) -> tuple[int, ...]:
    ids = (hf.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    n = tc.num_layers
    layers = (2, n // 2, n - 3) if ids is None else tuple(int(i) + 1 for i in ids)
    if len(layers) != 3 or min(layers) < 1 or max(layers) > n:
        _fail(path, "eagle_config.eagle_aux_hidden_state_layer_ids",
              f"{ids}: need 3 decoder layers of the {n}-layer target (their condition_proj reads 3 x H)")
    return layers


def import_meta(path: Path, hf: dict, tc) -> dict[str, Any]:
    """Our drafter meta of a released SpecBlock config.json, every field their code reads checked
    (against the target's ModelConfig `tc` where the drafter shares it)."""
    if hf.get("model_type", "llama") != "llama":
        _fail(path, "model_type", f"{hf['model_type']!r}: SpecBlock's drafter is a LlamaConfig model")
    for field, mine in (("vocab_size", tc.vocab_size), ("hidden_size", tc.hidden_size)):
        if hf.get(field) != mine:
            _fail(path, field, f"{hf.get(field)} != the target's {mine}")
    if hf.get("target_hidden_size", tc.hidden_size) != tc.hidden_size:
        _fail(path, "target_hidden_size", f"{hf['target_hidden_size']}: our drafter's width is the target's")
    if hf.get("hidden_act", "silu") != "silu":
        _fail(path, "hidden_act", f"{hf['hidden_act']!r}: our drafter layers use silu")
    if hf.get("rank_classes", RANK_CLASSES) != RANK_CLASSES:
        _fail(path, "rank_classes", f"{hf['rank_classes']}: our rank head has {RANK_CLASSES} classes "
                                    "(rank 1, 2-4, 5-10, give up) and the tree reads them so")
    h, heads = hf["hidden_size"], hf.get("num_attention_heads", 0)
    kv = hf.get("num_key_value_heads", heads)
    if heads < 1 or h % heads or kv < 1 or heads % kv:
        _fail(path, "num_attention_heads", f"{heads} heads / {kv} kv heads do not split width {h}")
    if hf.get("head_dim", h // heads) != h // heads:
        _fail(path, "head_dim", f"{hf['head_dim']}: their attention uses hidden_size // "
                                f"num_attention_heads = {h // heads}")
    layers, k = hf.get("num_hidden_layers", 1), hf.get("diffspec_draft_token_num", DEFAULT_K)
    if not isinstance(layers, int) or layers < 1:
        _fail(path, "num_hidden_layers", f"{layers!r} is not a layer count")
    if not isinstance(k, int) or k < 1:
        _fail(path, "diffspec_draft_token_num", f"{k!r} is not a slot count")
    for field in ("intermediate_size", "draft_vocab_size"):  # their loaders default them differently
        if not isinstance(hf.get(field), int):
            _fail(path, field, f"{hf.get(field)!r}: required")
    draft = hf["draft_vocab_size"]
    if not 20 <= draft <= tc.vocab_size:
        _fail(path, "draft_vocab_size", f"{draft}: between 20 (the rank head's top-20) and the "
                                        f"target's {tc.vocab_size}")
    rope = _rope(path, hf)
    ours = hf.get("specblock") or {}
    if ours.get("kind", "specblock") != "specblock":
        _fail(path, "specblock.kind", f"{ours['kind']!r} but the layout holds a specblock drafter")
    config = {"hidden_size": h, "intermediate_size": hf["intermediate_size"], "num_heads": heads,
              "num_kv_heads": kv, "head_dim": h // heads, "vocab_size": tc.vocab_size,
              "feature_layers": list(_feature_layers(path, hf, tc)),
              "rms_norm_eps": float(hf.get("rms_norm_eps", 1e-6)), "rope": dataclasses.asdict(rope),
              "dtype": tc.dtype, "draft_vocab_size": 0 if draft == tc.vocab_size else draft,
              "num_layers": layers, "block_size": k, "layer_shift": True, "rank_hidden": RANK_HIDDEN,
              "rank_top1": "top20"}
    return {"kind": "specblock", "config": config, "decoding": ours.get("decoding") or {},
            "chat": ours.get("chat"), "hf_format": FORMAT}


def _vocab_mapping(path: Path, raw: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """(d2t, t2d) their serving code uses: vocab_mapping.pt when present (read with torch, checked
    against the state dict's buffers), else the buffers of model.safetensors."""
    buffers = (raw.pop("d2t"), raw.pop("t2d")) if "d2t" in raw and "t2d" in raw else None
    file = path / "vocab_mapping.pt"
    if not file.exists():
        return buffers
    try:
        import torch
    except ImportError:
        if buffers is None:
            raise ValueError(f"{path}: vocab_mapping.pt holds the draft vocabulary and model.safetensors "
                             "has no d2t/t2d buffers: reading it needs torch (pip install torch)") from None
        return buffers  # the state dict's buffers were loaded from this same file in training
    mapping = torch.load(str(file), map_location="cpu", weights_only=True)
    pt = (mapping["d2t"].numpy(), mapping["t2d"].numpy())
    if buffers is not None and not (np.array_equal(pt[0], buffers[0]) and np.array_equal(pt[1], buffers[1])):
        raise ValueError(f"{path}: vocab_mapping.pt disagrees with the d2t/t2d buffers of model.safetensors")
    return pt


def read_weights(path: Path, meta: dict, config, target) -> tuple[dict[str, np.ndarray], Any]:
    """(our flat params, DraftVocab or None) of a released folder's model.safetensors."""
    file = path / "model.safetensors"
    if not file.exists():
        raise ValueError(f"{path}: no model.safetensors")
    raw = {k: np.asarray(v) for k, v in load_file(str(file)).items()}
    flat = {}
    for name, w in tensor_names(config).items():
        if w.name not in raw:
            raise ValueError(f"{path}: tensor {w.name!r} is missing")
        x = raw.pop(w.name)
        if tuple(x.shape) != w.hf_shape:
            raise ValueError(f"{path}: tensor {w.name!r} has shape {tuple(x.shape)}, expected {w.hf_shape}")
        flat[name] = w.to_ours(x.astype(np.float32), _our_shape(name, w, config))
    h = config.hidden_size
    shifts = []
    for i in range(config.num_layers - 1):
        name = _shift_name(i)
        if name not in raw:
            raise ValueError(f"{path}: tensor {name!r} is missing (their drafter shifts before every layer "
                             "after the first)")
        x = raw.pop(name)
        if x.shape != (h, 2 * h):
            raise ValueError(f"{path}: tensor {name!r} has shape {tuple(x.shape)}, expected {(h, 2 * h)}")
        shifts.append(x.astype(np.float32).T)
    if shifts:
        flat["shift"] = np.stack(shifts)
    flat["rank_in_bias"] = np.zeros((RANK_HIDDEN,), np.float32)
    flat["rank_out_bias"] = np.zeros((RANK_CLASSES,), np.float32)
    mapping = _vocab_mapping(path, raw)
    vocab = None
    if config.draft_vocab_size:
        if mapping is None:
            raise ValueError(f"{path}: draft_vocab_size is {config.draft_vocab_size} but there is no d2t "
                             "(model.safetensors buffers or vocab_mapping.pt)")
        d2t = mapping[0].astype(np.int64)
        vocab = draft_vocab.make(d2t + np.arange(d2t.shape[0]), config.vocab_size)
        if not np.array_equal(mapping[1].astype(bool), vocab.t2d >= 0):
            raise ValueError(f"{path}: tensor 't2d' does not mark the ids d2t maps to")
    elif mapping is not None and np.any(mapping[0]):
        raise ValueError(f"{path}: tensor 'd2t' maps a full-size draft vocabulary to other ids")
    embed = raw.pop("input_layer.embed_tokens.weight", None)
    if embed is not None:
        mine = np.asarray(target.params["embed_tokens"], np.float32)
        if embed.shape != mine.shape or not np.allclose(embed.astype(np.float32), mine, rtol=1e-2, atol=1e-3):
            raise ValueError(f"{path}: tensor 'input_layer.embed_tokens.weight' is not the target's embedding")
    if raw:
        raise ValueError(f"{path}: unexpected tensors {sorted(raw)} (not in SpecBlock's drafter)")
    return flat, vocab


# ------------------------------------------------------------------------------------ export


def _refuse(drafter, flat: dict) -> None:
    """ValueError with the reason when `drafter` has what their model cannot hold."""
    c = drafter.config
    why = []
    if c.num_layers > 1 and not c.layer_shift:
        why.append("layer_shift is off (their drafter shifts before every layer after the first)")
    if len(c.feature_layers) != 3:
        why.append(f"{len(c.feature_layers)} feature layers (their condition_proj reads 3)")
    if c.head_dim * c.num_heads != c.hidden_size:
        why.append(f"head_dim {c.head_dim} != hidden_size // heads (their attention derives it)")
    if c.rank_hidden != RANK_HIDDEN:
        why.append(f"rank_hidden {c.rank_hidden} (their rank head is {RANK_HIDDEN} wide)")
    if c.rank_top1 != "top20":
        why.append("rank_top1 'vocab' (their rank head's top-1 probability is over the top 20)")
    if c.rope.kind not in ("default", "llama3"):
        why.append(f"RoPE {c.rope.kind!r} (their drafter computes plain or llama3 RoPE only)")
    if c.head_size < 20:
        why.append(f"a {c.head_size}-token head (their rank features read the top 20)")
    for name in ("rank_in_bias", "rank_out_bias"):
        if np.any(flat[name]):
            why.append(f"a non-zero {name} (their rank head has no biases)")
    if why:
        raise ValueError("format 'specblock_hf' cannot hold this drafter: " + "; ".join(why))


def hf_config(drafter, max_positions: int, dtype: str, chat: dict | None = None) -> dict[str, Any]:
    """The released config.json of `drafter` (our settings in "specblock", which they ignore)."""
    c = drafter.config
    settings = {f.name: getattr(drafter, f.name) for f in dataclasses.fields(drafter)
                if f.name not in ("config", "graphdef")}
    return {"architectures": [ARCH], "model_type": "llama", "torch_dtype": dtype,
            "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
            "num_hidden_layers": c.num_layers, "rms_norm_eps": c.rms_norm_eps, "hidden_act": "silu",
            "vocab_size": c.vocab_size, "draft_vocab_size": c.head_size, "tie_word_embeddings": False,
            "max_position_embeddings": max_positions, "rope_theta": c.rope.theta,
            "rope_scaling": None if c.rope.kind == "default" else c.rope.to_hf(),
            "diffspec_draft_token_num": c.block_size, "rank_classes": RANK_CLASSES,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in c.feature_layers]},
            "specblock": {"kind": "specblock", "decoding": settings, "chat": chat}}


def export(drafter, flat: dict, vocab, path: str | Path, dtype: str = "bfloat16", max_positions: int = 0,
           chat: dict | None = None, **_engine) -> Path:
    """Writes `drafter` (flat trainable params, `io.flatten_params`; `vocab` its DraftVocab or None)
    as config.json + model.safetensors in the released layout: the d2t/t2d buffers are written
    into model.safetensors, which their loader reads (no torch here, so no vocab_mapping.pt); a
    reduced vocabulary is reordered by target id, as their d2t offsets assume."""
    if drafter.kind != "specblock":
        raise ValueError(f"format 'specblock_hf' holds specblock drafters, not {drafter.kind!r}")
    c = drafter.config
    flat = {k: np.asarray(jax.device_get(v), np.float32) for k, v in flat.items()}
    _refuse(drafter, flat)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    np_dtype = np.dtype(jax.numpy.dtype(dtype))
    tensors = {w.name: w.to_hf(flat.pop(name)).astype(np_dtype) for name, w in tensor_names(c).items()}
    for i, w in enumerate(flat.pop("shift", [])):
        tensors[_shift_name(i)] = np.ascontiguousarray(w.T).astype(np_dtype)
    flat.pop("rank_in_bias"), flat.pop("rank_out_bias")
    if flat:
        raise ValueError(f"export specblock_hf: parameters without a tensor name: {sorted(flat)}")
    if vocab is not None:
        tensors.update(draft_vocab.released_vocab_tensors(vocab, tensors["lm_head.weight"]))
    else:
        tensors["d2t"] = np.zeros((c.vocab_size,), np.int64)
        tensors["t2d"] = np.ones((c.vocab_size,), bool)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = hf_config(drafter, max(max_positions, 1), dtype, chat)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path
