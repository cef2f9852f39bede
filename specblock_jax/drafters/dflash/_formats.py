"""DFlash drafters in z-lab/dflash's released layout, registered as the kind's `ReleasedFormat`
"dflash" (drafters/hf_format.py dispatches to it):

  fc.weight, hidden_norm.weight, layers.N.{input_layernorm, post_attention_layernorm}.weight,
  layers.N.self_attn.{q,k,v,o}_proj.weight, {q,k}_norm.weight, layers.N.mlp.*, norm.weight (no
  embedding or head: the target's); config.json "DFlashDraftModel" with block_size and
  dflash_config {mask_token_id, target_layer_ids} (decoder-layer outputs: our feature layers - 1).

The draft tree's settings (`_tree.py`) ride in dflash_config as "tree": {"num_nodes", "candidates"}
(z-lab's loader reads only its own keys); a folder without them drafts the chain. Our own settings
entry (`hf_format.NATIVE`), when present, holds them too and wins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specblock_jax.drafters import hf_format
from specblock_jax.drafters.dflash._model import DFlashDrafter
from specblock_jax.drafters.registry import ReleasedFormat
from specblock_jax.models.hf_io import HFWeight

KIND = FORMAT = DFlashDrafter.kind  # the layout's name is the kind's
ARCHS = ("DFlashDraftModel",)


def weights(c) -> dict[str, HFWeight]:
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
                    **hf_format.mlp_weights(f"{o}mlp", f"{p}mlp.", h, c.intermediate_size)})
    return out


def detect(hf: dict) -> bool:
    return bool(set(hf.get("architectures") or []) & set(ARCHS))


def hf_config(drafter, max_positions: int, dtype: str, chat: dict | None = None) -> dict[str, Any]:
    """The config.json of `drafter` in z-lab's layout."""
    c = drafter.config
    return {"architectures": list(ARCHS), "model_type": "qwen3", "torch_dtype": dtype, "dtype": dtype,
            **hf_format.layer_fields(c, max_positions), "num_hidden_layers": c.num_layers,
            "block_size": c.block_size, "num_target_layers": c.target_layers,
            "dflash_config": {"mask_token_id": c.mask_token_id,
                              "target_layer_ids": [i - 1 for i in c.feature_layers],
                              "tree": {"num_nodes": drafter.num_nodes, "candidates": drafter.candidates}},
            hf_format.NATIVE: hf_format.our_entry(drafter, chat)}


def export(drafter, flat: dict, vocab, path: str | Path, *, dtype: str = "bfloat16", max_positions: int = 0,
           chat: dict | None = None, **_engine) -> Path:
    """Writes `drafter` in z-lab's layout (`hf_format.export` has the arguments)."""
    config = hf_config(drafter, max(max_positions, 1), dtype, chat)
    return hf_format.write(path, FORMAT, weights(drafter.config), flat, vocab, config, dtype)


def import_meta(path: Path, hf: dict, tc) -> dict[str, Any]:
    """Our drafter meta of a z-lab DFlash config.json (`hf_format.import_meta`)."""
    config = hf_format.layer_config(path, hf, hf, tc)
    dc = hf.get("dflash_config") or {}
    block = dc.get("block_size", hf.get("block_size"))
    mask = dc.get("mask_token_id", hf.get("mask_token_id"))
    if not isinstance(block, int) or block < 2:
        hf_format.fail(path, "block_size", f"{block!r}: DFlash drafts blocks of at least 2 tokens")
    if hf.get("num_target_layers", tc.num_layers) != tc.num_layers:
        hf_format.fail(path, "num_target_layers", f"{hf['num_target_layers']} != the target's {tc.num_layers}")
    if not isinstance(mask, int) or not 0 <= mask < tc.vocab_size:
        hf_format.fail(path, "dflash_config.mask_token_id", f"{mask!r} is not a token id of the target")
    ids = [i + 1 for i in dc.get("target_layer_ids", [])]
    if not ids or max(ids) > tc.num_layers or min(ids) < 1:
        hf_format.fail(path, "dflash_config.target_layer_ids", f"{dc.get('target_layer_ids')} do not name "
                                                               f"layers of the {tc.num_layers}-layer target")
    tree = dc.get("tree") or {}
    for key, low in (("num_nodes", 2), ("candidates", 1)):
        if key in tree and (not isinstance(tree[key], int) or tree[key] < low):
            hf_format.fail(path, f"dflash_config.tree.{key}", f"{tree[key]!r}: expected an integer >= {low}")
    config.update(num_layers=hf["num_hidden_layers"], feature_layers=ids, target_layers=tc.num_layers,
                  block_size=block, mask_token_id=mask)
    decoding = {"block_size": block, **{k: tree[k] for k in ("num_nodes", "candidates") if k in tree}}
    return hf_format.our_meta(path, hf, KIND, FORMAT, config, decoding)


def read_weights(path: Path, meta: dict, config, target) -> tuple[dict, Any]:
    """(our flat params, None) of a z-lab DFlash folder."""
    return hf_format.read(path, weights(config), config, target)


RELEASED = ReleasedFormat(FORMAT, KIND, detect, import_meta, read_weights, export)
