"""Drafter folders in the layouts serving engines load: EAGLE-3 (SafeAILab/EAGLE and SGLang),
`speculators` EAGLE-3 (vLLM), and DFlash (z-lab/dflash's release); SpecBlock's released layout
lives in drafters/specblock/_released.py ("specblock_hf") and is dispatched from here.

    sbj.save_drafter(drafter, params, "out", format="speculators")   # or "eagle3", "dflash", "specblock_hf"
    drafter, params = sbj.load_drafter("out", target)                # any of them, or ours

Layouts (HF Linear weights are [out, in]; ours are [in, ...]):
  eagle3       fc.weight [H, n*H], midlayer.{input_layernorm, hidden_norm, post_attention_layernorm}
               .weight [H], midlayer.self_attn.{q,k,v}_proj.weight [heads*D, 2H], o_proj [H, N*D],
               midlayer.mlp.{gate,up,down}_proj.weight, norm.weight, lm_head.weight [V', H],
               d2t int64 [V'] (target id = draft id + d2t), t2d bool [V]; config.json
               "LlamaForCausalLMEagle3" with draft_vocab_size and the target's auxiliary layers.
  speculators  the same tensors with "layers.0." for "midlayer.", and the speculators config
               (speculators_model_type "eagle3", transformer_layer_config, speculators_config).
  dflash       fc.weight, hidden_norm.weight, layers.N.{input_layernorm, post_attention_layernorm}
               .weight, layers.N.self_attn.{q,k,v,o}_proj.weight, {q,k}_norm.weight,
               layers.N.mlp.*, norm.weight (no embedding or head: the target's); config.json
               "DFlashDraftModel" with block_size and dflash_config {mask_token_id, target_layer_ids}.

Auxiliary layer ids. Ours (`feature_layers`) index HF `hidden_states` (0 = the embeddings).
vLLM reads the top-level `eagle_aux_hidden_state_layer_ids` the same way; SGLang reads
`eagle_config.eagle_aux_hidden_state_layer_ids` as decoder-layer outputs (ours - 1), as DFlash's
`target_layer_ids` are. Export writes both; import checks they agree.

Every field an engine would trip on (vocabulary, widths, auxiliary layers, RoPE, position limit,
residual/norm variants we do not implement, a stored embedding that is not the target's, the chat
format) is checked at import with an error naming the field. Our own settings (kind, decoding
settings, chat format) travel in the config's "specblock" entry, which the engines ignore.
BlockPilot's released policy converts with `specblock-convert blockpilot` (drafters/blockpilot/_released.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import load_file, save_file

from specblock_jax.drafters import draft_vocab
from specblock_jax.drafters import registry
from specblock_jax.models.config import RopeConfig
from specblock_jax.models.hf_io import HFWeight

ENGINE_FORMATS = ("eagle3", "speculators", "dflash")  # the layouts this module reads and writes


def formats() -> tuple[str, ...]:
    """Every layout `save_drafter` writes: ours ("specblock"), the engines' and those the kinds
    register (`registry.ReleasedFormat`, e.g. SpecBlock's "specblock_hf")."""
    return ("specblock", *ENGINE_FORMATS, *registry.released_formats())
EAGLE3_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
SPECULATORS_ARCHS = ("Eagle3Speculator", "Eagle3DraftModel")
DFLASH_ARCHS = ("DFlashDraftModel",)
UNSUPPORTED_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def _mlp(ours: str, hf: str, h: int, f: int) -> dict[str, HFWeight]:
    return {f"{ours}/gate_proj": HFWeight(f"{hf}gate_proj.weight", (f, h), True),
            f"{ours}/up_proj": HFWeight(f"{hf}up_proj.weight", (f, h), True),
            f"{ours}/down_proj": HFWeight(f"{hf}down_proj.weight", (h, f), True)}


def eagle3_weights(c, prefix: str) -> dict[str, HFWeight]:
    """Our flat param name -> its tensor in the EAGLE-3 layout (prefix "midlayer." or "layers.0.")."""
    h, n, k, d = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    p = prefix
    return {"fc": HFWeight("fc.weight", (h, len(c.feature_layers) * h), True),
            "layer/emb_norm/weight": HFWeight(f"{p}input_layernorm.weight", (h,), False),
            "layer/hidden_norm/weight": HFWeight(f"{p}hidden_norm.weight", (h,), False),
            "layer/q_proj": HFWeight(f"{p}self_attn.q_proj.weight", (n * d, 2 * h), True),
            "layer/k_proj": HFWeight(f"{p}self_attn.k_proj.weight", (k * d, 2 * h), True),
            "layer/v_proj": HFWeight(f"{p}self_attn.v_proj.weight", (k * d, 2 * h), True),
            "layer/o_proj": HFWeight(f"{p}self_attn.o_proj.weight", (h, n * d), True),
            "layer/post_norm/weight": HFWeight(f"{p}post_attention_layernorm.weight", (h,), False),
            **_mlp("layer/mlp", f"{p}mlp.", h, c.intermediate_size),
            "norm/weight": HFWeight("norm.weight", (h,), False),
            "lm_head": HFWeight("lm_head.weight", (c.head_size, h), True)}


def dflash_weights(c) -> dict[str, HFWeight]:
    """Our flat param name -> its tensor in z-lab's DFlash layout."""
    h, n, k, d = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    out = {"fc": HFWeight("fc.weight", (h, len(c.feature_layers) * h), True),
           "hidden_norm/weight": HFWeight("hidden_norm.weight", (h,), False),
           "norm/weight": HFWeight("norm.weight", (h,), False)}
    for i in range(c.num_layers):
        o, p = f"layers/{i}/", f"layers.{i}."
        out.update({f"{o}input_layernorm/weight": HFWeight(f"{p}input_layernorm.weight", (h,), False),
                    f"{o}post_attention_layernorm/weight": HFWeight(f"{p}post_attention_layernorm.weight", (h,), False),
                    f"{o}q_proj": HFWeight(f"{p}self_attn.q_proj.weight", (n * d, h), True),
                    f"{o}k_proj": HFWeight(f"{p}self_attn.k_proj.weight", (k * d, h), True),
                    f"{o}v_proj": HFWeight(f"{p}self_attn.v_proj.weight", (k * d, h), True),
                    f"{o}o_proj": HFWeight(f"{p}self_attn.o_proj.weight", (h, n * d), True),
                    f"{o}q_norm/weight": HFWeight(f"{p}self_attn.q_norm.weight", (d,), False),
                    f"{o}k_norm/weight": HFWeight(f"{p}self_attn.k_norm.weight", (d,), False),
                    **_mlp(f"{o}mlp", f"{p}mlp.", h, c.intermediate_size)})
    return out


def _weights_of(fmt: str, config) -> dict[str, HFWeight]:
    if fmt == "dflash":
        return dflash_weights(config)
    return eagle3_weights(config, "midlayer." if fmt == "eagle3" else "layers.0.")


# ------------------------------------------------------------------------------------ export


def _layer_fields(c, max_positions: int) -> dict[str, Any]:
    return {"hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
            "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, "vocab_size": c.vocab_size,
            "max_position_embeddings": max_positions, "hidden_act": "silu", "attention_bias": False,
            "mlp_bias": False, "tie_word_embeddings": False, "rope_theta": c.rope.theta,
            "rope_scaling": None if c.rope.kind == "default" else c.rope.to_hf()}


def hf_config(fmt: str, drafter, max_positions: int, dtype: str, verifier: str = "",
              chat: dict | None = None, verifier_architectures: tuple[str, ...] = ()) -> dict[str, Any]:
    """The config.json of `drafter` in layout `fmt` (see the module docstring)."""
    c = drafter.config
    settings = {f.name: getattr(drafter, f.name) for f in dataclasses.fields(drafter)
                if f.name not in ("config", "graphdef")}
    ours = {"kind": drafter.kind, "decoding": settings, "chat": chat}
    if fmt == "dflash":
        return {"architectures": list(DFLASH_ARCHS), "model_type": "qwen3", "torch_dtype": dtype, "dtype": dtype,
                **_layer_fields(c, max_positions), "num_hidden_layers": c.num_layers,
                "block_size": c.block_size, "num_target_layers": c.target_layers,
                "dflash_config": {"mask_token_id": c.mask_token_id,
                                  "target_layer_ids": [i - 1 for i in c.feature_layers]},
                "specblock": ours}
    aux = list(c.feature_layers)
    common = {"draft_vocab_size": c.head_size, "target_hidden_size": c.hidden_size,
              "eagle_aux_hidden_state_layer_ids": aux, "norm_before_residual": False}
    if fmt == "eagle3":
        return {"architectures": [EAGLE3_ARCHS[0]], "model_type": "llama", "torch_dtype": dtype, "dtype": dtype,
                **_layer_fields(c, max_positions), "num_hidden_layers": 1, **common,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in aux],
                                 "use_aux_hidden_state": True},
                "specblock": ours}
    return {"architectures": [SPECULATORS_ARCHS[0]], "speculators_model_type": "eagle3",
            "speculators_version": "0.9.0", **common,
            "norm_before_fc": False, "fc_norm": False, "norm_output": False, "embed_requires_grad": False,
            "transformer_layer_config": {"model_type": "llama", "num_hidden_layers": 1, "torch_dtype": dtype, "dtype": dtype,
                                         **_layer_fields(c, max_positions)},
            "speculators_config": {
                "algorithm": "eagle3", "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": drafter.depth,
                                      "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                "verifier": {"name_or_path": verifier or "target",
                             "architectures": list(verifier_architectures)}},
            "specblock": ours}


def export(drafter, flat: dict, vocab, path: str | Path, fmt: str, dtype: str = "bfloat16",
           max_positions: int = 0, verifier: str = "", chat: dict | None = None,
           verifier_architectures: tuple[str, ...] = ()) -> Path:
    """Writes `drafter` (its trainable params flattened to {"a/b": array}, `io.flatten_params`;
    `vocab` its DraftVocab or None) as `model.safetensors`
    + `config.json` in layout `fmt`. A reduced draft vocabulary is reordered by target id, as
    EAGLE-3's d2t/t2d pair assumes (the head's rows follow). max_positions: the target's position
    limit (engines check it); verifier, verifier_architectures: the target's name and HF
    architectures (speculators); chat: the chat format trained on (`ChatFormat.record`)."""
    released = registry.released_formats()
    if fmt in released:
        return released[fmt].export(drafter, flat, vocab, path, dtype, max_positions, chat)
    if fmt == "dflash" and drafter.kind != "dflash" or fmt in ("eagle3", "speculators") and drafter.kind != "eagle3":
        raise ValueError(f"format {fmt!r} holds {'dflash' if fmt == 'dflash' else 'eagle3'} drafters, "
                         f"not {drafter.kind!r} (SpecBlock saves in 'specblock_hf' or 'specblock', "
                         "BlockPilot in 'specblock')")
    c = drafter.config
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    np_dtype = np.dtype(jax.numpy.dtype(dtype))
    flat = {k: np.asarray(jax.device_get(v), np.float32) for k, v in flat.items()}
    tensors = {}
    for name, w in _weights_of(fmt, c).items():
        tensors[w.name] = w.to_hf(flat.pop(name)).astype(np_dtype)
    if flat:
        raise ValueError(f"export {fmt}: parameters without a tensor name: {sorted(flat)}")
    if vocab is not None:
        tensors.update(draft_vocab.eagle3_tensors(vocab, tensors["lm_head.weight"]))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = hf_config(fmt, drafter, max(max_positions, 1), dtype, verifier, chat, verifier_architectures)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


# ------------------------------------------------------------------------------------ import


def detect(hf: dict) -> str | None:
    """The layout of a config.json ("eagle3", "speculators", "dflash", "specblock_hf"), or None."""
    for name, fmt in registry.released_formats().items():
        if fmt.detect(hf):
            return name
    archs = set(hf.get("architectures") or [])
    if hf.get("speculators_model_type") == "eagle3" or archs & set(SPECULATORS_ARCHS):
        return "speculators"
    if archs & set(EAGLE3_ARCHS):
        return "eagle3"
    if archs & set(DFLASH_ARCHS):
        return "dflash"
    return None


def _fail(path, field, msg):
    raise ValueError(f"{path}: config field {field!r}: {msg}")


def _check_rope(path, layer: dict, target_rope: RopeConfig) -> RopeConfig:
    rope = RopeConfig.from_hf(layer)
    for field in ("theta", "kind", "factor"):
        if getattr(rope, field) != getattr(target_rope, field):
            name = "rope_theta" if field == "theta" else "rope_scaling"
            _fail(path, name, f"{field} {getattr(rope, field)!r} differs from the target's "
                              f"{getattr(target_rope, field)!r}")
    return target_rope


def _aux_ids(path, hf: dict, layer: dict, tc) -> tuple[int, ...]:
    """The auxiliary layers as HF hidden_states indices (checked against each other and the target)."""
    top = hf.get("eagle_aux_hidden_state_layer_ids")
    sg = (hf.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if top is not None and sg is not None and [i + 1 for i in sg] != list(top):
        _fail(path, "eagle_config.eagle_aux_hidden_state_layer_ids",
              f"{sg} (decoder-layer outputs) disagree with eagle_aux_hidden_state_layer_ids {top}")
    ids = tuple(top) if top is not None else tuple(i + 1 for i in sg) if sg is not None else None
    if ids is None:  # the engines' default
        n = tc.num_layers
        ids = (2, n // 2, n - 3)
    if min(ids) < 0 or max(ids) > tc.num_layers:
        _fail(path, "eagle_aux_hidden_state_layer_ids", f"{list(ids)} outside the target's "
                                                        f"{tc.num_layers} layers")
    return ids


def _check_widths(path, layer: dict, tc) -> None:
    if layer.get("vocab_size") != tc.vocab_size:
        _fail(path, "vocab_size", f"{layer.get('vocab_size')} != the target's {tc.vocab_size}")
    if layer.get("hidden_size") != tc.hidden_size:
        _fail(path, "hidden_size", f"{layer.get('hidden_size')} != the target's {tc.hidden_size}")
    limit = layer.get("max_position_embeddings", 0)
    if limit < tc.max_position_embeddings:
        _fail(path, "max_position_embeddings", f"{limit} < the target's {tc.max_position_embeddings}: "
                                               "engines would refuse or mis-rotate long sequences")


def import_meta(path: Path, hf: dict, tc) -> dict[str, Any]:
    """Our drafter meta ({"kind", "config", "decoding", "chat", "hf_format"}) of an engine-layout
    config.json, every field an engine would trip on checked against the target's config `tc`
    (a ModelConfig: no weights are needed, so an abstract target serves)."""
    fmt = detect(hf)
    if fmt is None:
        raise ValueError(f"{path}: config.json has no 'kind' and its architectures "
                         f"{hf.get('architectures')} are not a drafter layout we read ({formats()[1:]})")
    released = registry.released_formats()
    if fmt in released:
        return released[fmt].import_meta(path, hf, tc)
    layer = hf.get("transformer_layer_config", hf) if fmt == "speculators" else hf
    _check_widths(path, layer, tc)
    if hf.get("target_hidden_size") not in (None, tc.hidden_size):
        _fail(path, "target_hidden_size", f"{hf['target_hidden_size']} != the target's {tc.hidden_size}")
    for flag in UNSUPPORTED_FLAGS:
        if hf.get(flag):
            _fail(path, flag, "true is not implemented (our EAGLE-3 layer adds the raw feature as residual)")
    ours = hf.get("specblock") or {}
    head_dim = layer.get("head_dim") or layer["hidden_size"] // layer["num_attention_heads"]
    config = {"hidden_size": layer["hidden_size"], "intermediate_size": layer["intermediate_size"],
              "num_heads": layer["num_attention_heads"], "num_kv_heads": layer.get(
                  "num_key_value_heads", layer["num_attention_heads"]), "head_dim": head_dim,
              "vocab_size": layer["vocab_size"], "rms_norm_eps": layer.get("rms_norm_eps", 1e-6),
              "rope": dataclasses.asdict(_check_rope(path, layer, tc.rope))}
    if fmt == "dflash":
        dc = hf.get("dflash_config") or {}
        block = dc.get("block_size", hf.get("block_size"))
        mask = dc.get("mask_token_id", hf.get("mask_token_id"))
        if not isinstance(block, int) or block < 2:
            _fail(path, "block_size", f"{block!r}: DFlash drafts blocks of at least 2 tokens")
        if hf.get("num_target_layers", tc.num_layers) != tc.num_layers:
            _fail(path, "num_target_layers", f"{hf['num_target_layers']} != the target's {tc.num_layers}")
        if not isinstance(mask, int) or not 0 <= mask < tc.vocab_size:
            _fail(path, "dflash_config.mask_token_id", f"{mask!r} is not a token id of the target")
        ids = [i + 1 for i in dc.get("target_layer_ids", [])]
        if not ids or max(ids) > tc.num_layers or min(ids) < 1:
            _fail(path, "dflash_config.target_layer_ids", f"{dc.get('target_layer_ids')} do not name "
                                                          f"layers of the {tc.num_layers}-layer target")
        config.update(num_layers=hf["num_hidden_layers"], feature_layers=ids, target_layers=tc.num_layers,
                      block_size=block, mask_token_id=mask)
        kind = "dflash"
    else:
        if layer.get("model_type", "llama") != "llama":  # a Qwen3 layer adds q/k norms
            _fail(path, "model_type", f"{layer['model_type']!r}: our EAGLE-3 layer is the Llama layer "
                                      "(no q/k norms) that vLLM's and SGLang's EAGLE-3 run")
        if layer.get("num_hidden_layers", 1) != 1:
            _fail(path, "num_hidden_layers", f"{layer['num_hidden_layers']}: our EAGLE-3 drafter has one layer")
        draft = hf.get("draft_vocab_size") or layer["vocab_size"]
        config.update(feature_layers=list(_aux_ids(path, hf, layer, tc)),
                      draft_vocab_size=0 if draft == layer["vocab_size"] else draft)
        kind = "eagle3"
    if ours.get("kind", kind) != kind:
        _fail(path, "specblock.kind", f"{ours['kind']!r} but the layout holds a {kind} drafter")
    decoding = ours.get("decoding") or ({"block_size": config["block_size"]} if kind == "dflash" else {})
    return {"kind": kind, "config": config, "decoding": decoding,
            "chat": ours.get("chat"), "hf_format": fmt}


def read_weights(path: Path, meta: dict, config, target) -> tuple[dict[str, np.ndarray], Any]:
    """(our flat params, DraftVocab or None) of an engine-layout folder's model.safetensors."""
    released = registry.released_formats()
    if meta["hf_format"] in released:
        return released[meta["hf_format"]].read_weights(path, meta, config, target)
    file = path / "model.safetensors"
    if not file.exists():
        raise ValueError(f"{path}: no model.safetensors (convert pytorch_model.bin with "
                         "safetensors' convert script first)")
    raw = {k: np.asarray(v) for k, v in load_file(str(file)).items()}
    fmt = meta["hf_format"]
    flat = {}
    weights = _weights_of(fmt, config)
    if "lm_head.weight" not in raw and "lm_head" in weights and not config.draft_vocab_size:
        head = nnx.merge(target.graphdef, target.params).head_weight()  # the target's, shared
        raw["lm_head.weight"] = np.asarray(head, np.float32).T
    for name, w in weights.items():
        if w.name not in raw:
            raise ValueError(f"{path}: tensor {w.name!r} is missing")
        x = raw.pop(w.name)
        if tuple(x.shape) != w.hf_shape:
            raise ValueError(f"{path}: tensor {w.name!r} has shape {tuple(x.shape)}, expected {w.hf_shape}")
        flat[name] = w.to_ours(x.astype(np.float32), _our_shape(w, config))
    vocab = None
    if not getattr(config, "draft_vocab_size", 0) and "d2t" in raw:  # a full draft vocabulary
        if np.any(raw.pop("d2t")):
            raise ValueError(f"{path}: tensor 'd2t' maps a full-size draft vocabulary to other ids")
        raw.pop("t2d", None)
    if "d2t" in raw or "t2d" in raw or getattr(config, "draft_vocab_size", 0):
        if "d2t" not in raw:
            raise ValueError(f"{path}: draft_vocab_size is {config.draft_vocab_size} but tensor 'd2t' is missing")
        offsets = raw.pop("d2t").astype(np.int64)
        vocab = draft_vocab.make(offsets + np.arange(offsets.shape[0]), config.vocab_size)
        t2d = raw.pop("t2d", None)
        if t2d is not None and not np.array_equal(t2d.astype(bool), vocab.t2d >= 0):
            raise ValueError(f"{path}: tensor 't2d' does not mark the ids d2t maps to")
    embed = raw.pop("embed_tokens.weight", None)
    if embed is not None:
        mine = np.asarray(target.params["embed_tokens"], np.float32)
        if embed.shape != mine.shape or not np.allclose(embed.astype(np.float32), mine, rtol=1e-2, atol=1e-3):
            raise ValueError(f"{path}: tensor 'embed_tokens.weight' is not the target's embedding "
                             "(the drafter was trained for another target)")
    if raw:
        raise ValueError(f"{path}: unexpected tensors {sorted(raw)}")
    return flat, vocab


def _our_shape(w: HFWeight, config) -> tuple[int, ...]:
    """Our shape of an HF tensor: [in, heads, D] projections, [heads, D, H] output, else [in, out]."""
    n, k, d, h = config.num_heads, config.num_kv_heads, config.head_dim, config.hidden_size
    name = w.name
    if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
        heads = n if "q_proj" in name else k
        return (w.hf_shape[1], heads, d)
    if name.endswith("o_proj.weight"):
        return (n, d, h)
    return w.hf_shape[::-1] if w.transposed else w.hf_shape
