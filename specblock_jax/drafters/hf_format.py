"""Drafter folders in layouts other than ours: serving engines' and public releases'. Each layout
is a `registry.ReleasedFormat` its kind registers (the kind's `_formats.py` or `_released.py`);
this module dispatches to them and holds what the engine layouts share.

    sbj.save_drafter(drafter, params, "out", format="speculators", target=target)  # formats() lists them
    drafter, params = sbj.load_drafter("out", target)                # any of them (detected), or ours

A layout holds one kind's drafters; saving another kind's in it is refused. HF Linear weights are
[out, in]; ours are [in, ...] (`models.hf_io.HFWeight` converts). Every field an engine would trip
on (vocabulary, widths, auxiliary layers, RoPE, position limit, residual/norm variants we do not
implement, a stored embedding that is not the target's, the chat format) is checked at import with
an error naming the field. Our own settings (kind, decoding settings, chat format) travel in the
config's `NATIVE` entry, which the engines ignore. Auxiliary layer ids: ours (`feature_layers`)
index HF `hidden_states` (0 = the embeddings); engines that count decoder-layer outputs read ours - 1.
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
from specblock_jax.models.config import ModelConfig, RopeConfig
from specblock_jax.models.hf_io import HFWeight

# Our own folder layout (every kind saves in it: drafters/io.py), and the config.json entry our
# settings travel in within the other layouts: the project's name, not a drafter kind's.
NATIVE = "specblock"
UNSUPPORTED_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def formats() -> tuple[str, ...]:
    """Every layout `save_drafter` writes: ours (`NATIVE`), then those the kinds register."""
    return (NATIVE, *registry.released_formats())


def formats_of(kind: str) -> tuple[str, ...]:
    """The layouts a drafter of `kind` saves in: ours and its kind's."""
    return (NATIVE, *(name for name, f in registry.released_formats().items() if f.kind == kind))


# ------------------------------------------------------------------------------------ dispatch


def export(drafter, flat: dict, vocab, path: str | Path, fmt: str, dtype: str = "bfloat16",
           max_positions: int = 0, verifier: str = "", chat: dict | None = None,
           verifier_architectures: tuple[str, ...] = ()) -> Path:
    """Writes `drafter` (its trainable params flattened to {"a/b": array}, `io.flatten_params`;
    `vocab` its DraftVocab or None) in layout `fmt` (one of `formats()` but ours). max_positions:
    the target's position limit (engines check it); verifier, verifier_architectures: the target's
    name and HF architectures (speculators); chat: the chat format trained on (`ChatFormat.record`)."""
    released = registry.released_formats()
    if fmt not in released:
        raise ValueError(f"format {fmt!r}: choose from {formats()}")
    layout = released[fmt]
    if drafter.kind != layout.kind:
        theirs = " or ".join(repr(f) for f in formats_of(drafter.kind))
        raise ValueError(f"format {fmt!r} holds {layout.kind} drafters, not {drafter.kind!r} "
                         f"(a {drafter.kind} drafter saves in {theirs})")
    if max_positions < 1:
        raise ValueError(f"format {fmt!r} records the target's position limit, which engines check: "
                         "pass target=TARGET (the Target the drafter serves, or its HF folder), as "
                         "in sbj.save_drafter(*drafter, path, format=..., target=target)")
    return layout.export(drafter, flat, vocab, path, dtype=dtype, max_positions=max_positions,
                         verifier=verifier, chat=chat, verifier_architectures=verifier_architectures)


def target_fields(target, verifier: str = "") -> dict[str, Any]:
    """What an engine layout records of the target a drafter serves, as `export`'s keywords:
    max_positions (its position limit), verifier (`verifier` if given, else the folder the
    target was read from; "" when neither says: a target without a tokenizer) and
    verifier_architectures (its HF architectures). target: a Target (`sbj.load_target`'s: its
    tokenizer names the folder it was read from) or the path of its HF folder (only config.json
    is read). `sbj.save_drafter(..., target=)` and `specblock-export`
    both take these fields from here."""
    if isinstance(target, (str, Path)):
        file = Path(target) / "config.json"
        if not file.is_file():
            raise ValueError(f"target {target}: not an HF folder (config.json is missing)")
        config, name = ModelConfig.from_hf(json.loads(file.read_text())), str(target)
    else:
        config = target.config
        name = getattr(getattr(target, "tokenizer", None), "name_or_path", "") or ""
    return {"max_positions": config.max_position_embeddings, "verifier": verifier or name,
            "verifier_architectures": (config.to_hf()["architectures"][0],)}


def detect(hf: dict) -> str | None:
    """The registered layout a config.json is in (e.g. "speculators"), or None."""
    for name, fmt in registry.released_formats().items():
        if fmt.detect(hf):
            return name
    return None


def import_meta(path: Path, hf: dict, tc) -> dict[str, Any]:
    """Our drafter meta ({"kind", "config", "decoding", "chat", "hf_format"}) of a config.json in
    another layout, every field an engine would trip on checked against the target's config `tc`
    (a ModelConfig: no weights are needed, so an abstract target serves)."""
    fmt = detect(hf)
    if fmt is None:
        raise ValueError(f"{path}: config.json has no 'kind' and its architectures "
                         f"{hf.get('architectures')} are not a drafter layout we read ({formats()[1:]})")
    return registry.released_formats()[fmt].import_meta(path, hf, tc)


def read_weights(path: Path, meta: dict, config, target) -> tuple[dict[str, np.ndarray], Any]:
    """(our flat params, DraftVocab or None) of a folder in layout meta["hf_format"]."""
    return registry.released_formats()[meta["hf_format"]].read_weights(path, meta, config, target)


# ------------------------------------------------------------------------------------ shared by the engine layouts


def mlp_weights(ours: str, hf: str, h: int, f: int) -> dict[str, HFWeight]:
    """A gated MLP's three projections: our names under `ours`, theirs under the prefix `hf`."""
    return {f"{ours}/gate_proj": HFWeight(f"{hf}gate_proj.weight", (f, h), True),
            f"{ours}/up_proj": HFWeight(f"{hf}up_proj.weight", (f, h), True),
            f"{ours}/down_proj": HFWeight(f"{hf}down_proj.weight", (h, f), True)}


def layer_fields(c, max_positions: int) -> dict[str, Any]:
    """The HF config fields of a decoder layer at the widths of drafter config `c`."""
    return {"hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
            "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, "vocab_size": c.vocab_size,
            "max_position_embeddings": max_positions, "hidden_act": "silu", "attention_bias": False,
            "mlp_bias": False, "tie_word_embeddings": False, "rope_theta": c.rope.theta,
            "rope_scaling": None if c.rope.kind == "default" else c.rope.to_hf()}


def our_entry(drafter, chat: dict | None) -> dict[str, Any]:
    """The config.json entry (under `NATIVE`) holding our settings: kind, decoding settings, chat."""
    settings = {f.name: getattr(drafter, f.name) for f in dataclasses.fields(drafter)
                if f.name not in ("config", "graphdef")}
    return {"kind": drafter.kind, "decoding": settings, "chat": chat}


def write(path: str | Path, fmt: str, weights: dict[str, HFWeight], flat: dict, vocab, config: dict,
          dtype: str) -> Path:
    """Writes a folder in layout `fmt`: model.safetensors (each of our params `flat` as its tensor
    in `weights`, in `dtype`; a reduced draft vocabulary as EAGLE-3's d2t/t2d, reordered by target
    id as that pair assumes, the head's rows following) and config.json `config`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    np_dtype = np.dtype(jax.numpy.dtype(dtype))
    flat = {k: np.asarray(jax.device_get(v), np.float32) for k, v in flat.items()}
    tensors = {}
    for name, w in weights.items():
        tensors[w.name] = w.to_hf(flat.pop(name)).astype(np_dtype)
    if flat:
        raise ValueError(f"export {fmt}: parameters without a tensor name: {sorted(flat)}")
    if vocab is not None:
        tensors.update(draft_vocab.released_vocab_tensors(vocab, tensors["lm_head.weight"]))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def fail(path, field, msg):
    """ValueError naming the config field."""
    raise ValueError(f"{path}: config field {field!r}: {msg}")


def _check_rope(path, layer: dict, target_rope: RopeConfig) -> RopeConfig:
    rope = RopeConfig.from_hf(layer)
    for field in ("theta", "kind", "factor"):
        if getattr(rope, field) != getattr(target_rope, field):
            name = "rope_theta" if field == "theta" else "rope_scaling"
            fail(path, name, f"{field} {getattr(rope, field)!r} differs from the target's "
                             f"{getattr(target_rope, field)!r}")
    return target_rope


def _check_widths(path, layer: dict, tc) -> None:
    if layer.get("vocab_size") != tc.vocab_size:
        fail(path, "vocab_size", f"{layer.get('vocab_size')} != the target's {tc.vocab_size}")
    if layer.get("hidden_size") != tc.hidden_size:
        fail(path, "hidden_size", f"{layer.get('hidden_size')} != the target's {tc.hidden_size}")
    limit = layer.get("max_position_embeddings", 0)
    if limit < tc.max_position_embeddings:
        fail(path, "max_position_embeddings", f"{limit} < the target's {tc.max_position_embeddings}: "
                                              "engines would refuse or mis-rotate long sequences")


def layer_config(path: Path, hf: dict, layer: dict, tc) -> dict[str, Any]:
    """Our config fields of an engine layout's decoder layer (`layer`: the config.json's, or the
    entry holding it), checked against the target's config `tc`: widths, vocabulary, position
    limit, RoPE, and no residual/norm variant we do not implement."""
    _check_widths(path, layer, tc)
    if hf.get("target_hidden_size") not in (None, tc.hidden_size):
        fail(path, "target_hidden_size", f"{hf['target_hidden_size']} != the target's {tc.hidden_size}")
    for flag in UNSUPPORTED_FLAGS:
        if hf.get(flag):
            fail(path, flag, "true is not implemented (our EAGLE-3 layer adds the raw feature as residual)")
    head_dim = layer.get("head_dim") or layer["hidden_size"] // layer["num_attention_heads"]
    return {"hidden_size": layer["hidden_size"], "intermediate_size": layer["intermediate_size"],
            "num_heads": layer["num_attention_heads"], "num_kv_heads": layer.get(
                "num_key_value_heads", layer["num_attention_heads"]), "head_dim": head_dim,
            "vocab_size": layer["vocab_size"], "rms_norm_eps": layer.get("rms_norm_eps", 1e-6),
            "rope": dataclasses.asdict(_check_rope(path, layer, tc.rope))}


def our_meta(path: Path, hf: dict, kind: str, fmt: str, config: dict, decoding: dict | None = None) -> dict[str, Any]:
    """Our drafter meta of a folder in layout `fmt` holding a `kind` drafter: the settings of our
    entry (its kind checked), `decoding` when it has none."""
    ours = hf.get(NATIVE) or {}
    if ours.get("kind", kind) != kind:
        fail(path, f"{NATIVE}.kind", f"{ours['kind']!r} but the layout holds a {kind} drafter")
    return {"kind": kind, "config": config, "decoding": ours.get("decoding") or decoding or {},
            "chat": ours.get("chat"), "hf_format": fmt}


def read(path: Path, weights: dict[str, HFWeight], config, target) -> tuple[dict[str, np.ndarray], Any]:
    """(our flat params, DraftVocab or None) of an engine-layout folder's model.safetensors, whose
    tensors are `weights` (a head missing from the file and not reduced is the target's), plus a
    reduced draft vocabulary's d2t/t2d and an embedding checked to be the target's."""
    file = path / "model.safetensors"
    if not file.exists():
        raise ValueError(f"{path}: no model.safetensors (convert pytorch_model.bin with "
                         "safetensors' convert script first)")
    raw = {k: np.asarray(v) for k, v in load_file(str(file)).items()}
    flat = {}
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
