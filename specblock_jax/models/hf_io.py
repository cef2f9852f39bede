"""Hugging Face checkpoint folders <-> `Target`, with no torch at run time.

Every weight is described once in `hf_weights`: our parameter path, its HF name, its HF shape and
whether HF stores it as a transposed Linear ([out, in]). Loading asserts each HF shape before
converting and fails naming every parameter left unloaded and every unexpected tensor; saving
runs the same map backwards and writes a folder `transformers` loads. `random_target`: a random
tiny target over a tokenizer folder (smoke tests of the tools); `load_text_target`: either kind,
with a tokenizer.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from specblock_jax import writing
from specblock_jax.models.config import ModelConfig, tiny
from specblock_jax.models.target import Target, abstract_target, init_target

# Tensors some checkpoints carry that the model recomputes; never an error.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class CheckpointError(ValueError):
    """A checkpoint folder is missing files or its tensors do not match the config."""


@dataclasses.dataclass(frozen=True)
class HFWeight:
    name: str  # HF tensor name
    hf_shape: tuple[int, ...]
    transposed: bool  # HF stores [out, in]; we store [in, ...]

    def to_ours(self, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return (x.T if self.transposed else x).reshape(shape)

    def to_hf(self, x: np.ndarray) -> np.ndarray:
        if self.transposed:
            return np.ascontiguousarray(x.reshape(self.hf_shape[::-1]).T)
        return x.reshape(self.hf_shape)


def hf_weights(cfg: ModelConfig) -> dict[tuple, HFWeight]:
    """Our param path (tuple of keys) -> its HF tensor. Layer i's weights are ("layers", i, ...):
    slice i of the stacked ("layers", ...) parameter (see `_stacked_path`)."""
    h, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    out = {("embed_tokens",): HFWeight("model.embed_tokens.weight", (v, h), False),
           ("norm", "weight"): HFWeight("model.norm.weight", (h,), False)}
    if not cfg.tie_word_embeddings:
        out[("lm_head",)] = HFWeight("lm_head.weight", (v, h), True)
    for i in range(cfg.num_layers):
        p, n = ("layers", i), f"model.layers.{i}."
        layer = {
            ("input_layernorm", "weight"): (n + "input_layernorm.weight", (h,), False),
            ("post_attention_layernorm", "weight"): (n + "post_attention_layernorm.weight", (h,), False),
            ("self_attn", "q_proj"): (n + "self_attn.q_proj.weight", (q, h), True),
            ("self_attn", "k_proj"): (n + "self_attn.k_proj.weight", (kv, h), True),
            ("self_attn", "v_proj"): (n + "self_attn.v_proj.weight", (kv, h), True),
            ("self_attn", "o_proj"): (n + "self_attn.o_proj.weight", (h, q), True),
            ("mlp", "gate_proj"): (n + "mlp.gate_proj.weight", (f, h), True),
            ("mlp", "up_proj"): (n + "mlp.up_proj.weight", (f, h), True),
            ("mlp", "down_proj"): (n + "mlp.down_proj.weight", (h, f), True),
        }
        if cfg.qk_norm:
            layer[("self_attn", "q_norm", "weight")] = (n + "self_attn.q_norm.weight", (cfg.head_dim,), False)
            layer[("self_attn", "k_norm", "weight")] = (n + "self_attn.k_norm.weight", (cfg.head_dim,), False)
        if cfg.attention_bias:
            for ours, hf, size in (("q_bias", "q_proj", q), ("k_bias", "k_proj", kv),
                                   ("v_bias", "v_proj", kv), ("o_bias", "o_proj", h)):
                layer[("self_attn", ours)] = (n + f"self_attn.{hf}.bias", (size,), False)
        out.update({p + k: HFWeight(*w) for k, w in layer.items()})
    return out


def _flatten(tree: dict, prefix=()) -> dict[tuple, object]:
    flat = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            flat.update(_flatten(v, prefix + (k,)))
        else:
            flat[prefix + (k,)] = v
    return flat


def _unflatten(flat: dict[tuple, object]) -> dict:
    tree: dict = {}
    for path, v in flat.items():
        node = tree
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = v
    return tree


def _stacked_path(path: tuple) -> tuple[tuple, int | None]:
    """("layers", i, *rest) -> (("layers", *rest), i); any other path -> (path, None)."""
    if path[0] == "layers":
        return ("layers",) + path[2:], path[1]
    return path, None


def _tensor_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (path / n).exists()]
        if missing:
            raise CheckpointError(f"{path}: shards listed in {index.name} are missing: {missing}")
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors weights found")
    return files


def _default_dtype(checkpoint_dtype: str) -> str:
    # bf16 matmuls are several times slower than fp32 on XLA:CPU; keep bf16 for accelerators.
    return "float32" if jax.default_backend() == "cpu" else checkpoint_dtype


def load_target(path: str | os.PathLike, dtype: str | None = None, tokenizer: bool = True) -> Target:
    """Loads an HF folder (config.json, *.safetensors shards, tokenizer files) into a `Target`.

    dtype: "float32" | "bfloat16"; default float32 on CPU, the checkpoint's dtype elsewhere.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a directory (expected an HF checkpoint folder)")
    if not (path / "config.json").exists():
        raise CheckpointError(f"{path}: config.json is missing")
    hf_cfg = json.loads((path / "config.json").read_text())
    cfg = ModelConfig.from_hf(hf_cfg)
    cfg = cfg.replace(dtype=dtype or _default_dtype(cfg.dtype))
    graphdef, abstract = abstract_target(cfg)
    wanted = hf_weights(cfg)
    by_name = {w.name: p for p, w in wanted.items()}
    shapes = {p: x.shape for p, x in _flatten(abstract).items()}
    loaded, unexpected, bad_shapes, bad_names = {}, [], [], set()
    for file in _tensor_files(path):
        with safe_open(str(file), framework="numpy") as f:
            for name in f.keys():
                if name not in by_name:
                    tied_head = name == "lm_head.weight" and cfg.tie_word_embeddings
                    if not (tied_head or name.endswith(_IGNORED_SUFFIXES)):
                        unexpected.append(name)
                    continue
                ours = by_name[name]
                x = f.get_tensor(name)
                if tuple(x.shape) != wanted[ours].hf_shape:
                    bad_shapes.append(f"{name}: {tuple(x.shape)} != expected {wanted[ours].hf_shape}")
                    bad_names.add(name)
                    continue
                stacked, layer = _stacked_path(ours)
                shape = shapes[stacked] if layer is None else shapes[stacked][1:]
                loaded[ours] = wanted[ours].to_ours(x, shape).astype(cfg.dtype)
    missing = sorted(w.name for p, w in wanted.items() if p not in loaded and w.name not in bad_names)
    problems = []
    if bad_shapes:
        problems.append("shape mismatches: " + "; ".join(bad_shapes))
    if missing:
        problems.append(f"missing tensors ({len(missing)}): {missing}")
    if unexpected:
        problems.append(f"unexpected tensors ({len(unexpected)}): {sorted(unexpected)}")
    if problems:
        raise CheckpointError(f"{path}: " + " | ".join(problems))
    params = {}
    for p in shapes:  # stack the layers' slices in layer order
        if p[0] == "layers":
            params[p] = jnp.asarray(np.stack([loaded[(p[0], i) + p[1:]] for i in range(cfg.num_layers)]))
        else:
            params[p] = jnp.asarray(loaded[p])
    tok = load_tokenizer(path) if tokenizer else None
    return Target(cfg, graphdef, _unflatten(params), tok)


def load_tokenizer(path: str | os.PathLike):
    """The folder's transformers tokenizer (offline), or None if it has no tokenizer files."""
    path = Path(path)
    if not any((path / n).exists() for n in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def random_target(tokenizer_dir: str | os.PathLike = "assets/tokenizer", seed: int = 0, **changes) -> Target:
    """A randomly initialised tiny Qwen3 (`config.tiny`, 4096 positions) over the tokenizer in
    `tokenizer_dir`: its vocabulary, BOS and EOS ids. `changes`: config fields to override. For
    smoke tests of the tools, no checkpoint needed."""
    tok = load_tokenizer(tokenizer_dir)
    if tok is None:
        raise FileNotFoundError(f"{tokenizer_dir}: no tokenizer files")
    cfg = tiny(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_ids=(tok.eos_token_id,),
               max_position_embeddings=4096).replace(**changes)
    return init_target(cfg, seed=seed, tokenizer=tok)


def load_text_target(path: str | os.PathLike | None, seed: int = 0) -> Target:
    """A target with a tokenizer, for text prompts: the checkpoint at `path` (CheckpointError when
    it has no tokenizer files), or for `path` None a random tiny one (`random_target(seed=seed)`)."""
    if path is None:
        return random_target(seed=seed)
    target = load_target(path)
    if target.tokenizer is None:
        raise CheckpointError(f"{path}: the checkpoint has no tokenizer files; text prompts need one")
    return target


def save_target(
    target: Target,
    path: str | os.PathLike,
    dtype: str | None = None,
    max_shard_bytes: int = 4 << 30,
    *,
    overwrite: bool = False,
) -> Path:
    """Writes an HF folder: config.json, generation_config.json, safetensors shards (+ index),
    and the tokenizer if the target has one. dtype defaults to the target's dtype. A folder under
    the shipped assets/ is refused unless `overwrite` (writing.py); files get the user's umask."""
    writing.check_writable(path, overwrite)
    cfg = target.config
    dtype = dtype or cfg.dtype
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    flat = {p: np.asarray(jax.device_get(x)) for p, x in _flatten(target.params).items()}
    np_dtype = jnp.dtype(dtype)

    def ours(p):
        stacked, layer = _stacked_path(p)
        return flat[stacked] if layer is None else flat[stacked][layer]

    tensors = {w.name: w.to_hf(ours(p).astype(np_dtype)) for p, w in hf_weights(cfg).items()}
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, x in tensors.items():
        if shards[-1] and size + x.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = x
        size += x.nbytes
    for old in path.glob("*.safetensors"):
        old.unlink()
    (path / "model.safetensors.index.json").unlink(missing_ok=True)
    if len(shards) == 1:
        save_file(shards[0], str(path / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(path / fname), metadata={"format": "pt"})
            weight_map.update({name: fname for name in shard})
        index = {"metadata": {"total_size": sum(x.nbytes for x in tensors.values())},
                 "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (path / "config.json").write_text(json.dumps(cfg.replace(dtype=dtype).to_hf(), indent=2))
    gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.to_hf()["eos_token_id"],
           "pad_token_id": cfg.pad_token_id}
    (path / "generation_config.json").write_text(json.dumps(gen, indent=2))
    if target.tokenizer is not None:
        target.tokenizer.save_pretrained(str(path))
    writing.follow_umask(path)
    return path
