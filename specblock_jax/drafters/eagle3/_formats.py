"""EAGLE-3 drafters in the serving engines' layouts: "eagle3" (SafeAILab/EAGLE and SGLang) and
"speculators" (vLLM), registered as `ReleasedFormat`s of the kind (drafters/hf_format.py
dispatches to them).

  eagle3       fc.weight [H, n*H], midlayer.{input_layernorm, hidden_norm, post_attention_layernorm}
               .weight [H], midlayer.self_attn.{q,k,v}_proj.weight [heads*D, 2H], o_proj [H, N*D],
               midlayer.mlp.{gate,up,down}_proj.weight, norm.weight, lm_head.weight [V', H],
               d2t int64 [V'] (target id = draft id + d2t), t2d bool [V]; config.json
               "LlamaForCausalLMEagle3" with draft_vocab_size and the target's auxiliary layers.
  speculators  the same tensors with "layers.0." for "midlayer.", and the speculators config
               (speculators_model_type "eagle3", transformer_layer_config, speculators_config).

Auxiliary layer ids: vLLM reads the top-level `eagle_aux_hidden_state_layer_ids` as ours (HF
`hidden_states` indices); SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids` as
decoder-layer outputs (ours - 1). Export writes both; import checks they agree.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from specblock_jax.drafters import hf_format
from specblock_jax.drafters.eagle3._model import Eagle3Drafter
from specblock_jax.drafters.registry import ReleasedFormat
from specblock_jax.models.hf_io import HFWeight

KIND = Eagle3Drafter.kind
EAGLE3, SPECULATORS = "eagle3", "speculators"  # the layouts' names
EAGLE3_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
SPECULATORS_ARCHS = ("Eagle3Speculator", "Eagle3DraftModel")
PREFIX = {EAGLE3: "midlayer.", SPECULATORS: "layers.0."}


def weights(c, prefix: str) -> dict[str, HFWeight]:
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
            **hf_format.mlp_weights("layer/mlp", f"{p}mlp.", h, c.intermediate_size),
            "norm/weight": HFWeight("norm.weight", (h,), False),
            "lm_head": HFWeight("lm_head.weight", (c.head_size, h), True)}


def is_speculators(hf: dict) -> bool:
    archs = set(hf.get("architectures") or [])
    return hf.get("speculators_model_type") == KIND or bool(archs & set(SPECULATORS_ARCHS))


def is_eagle3(hf: dict) -> bool:
    return bool(set(hf.get("architectures") or []) & set(EAGLE3_ARCHS)) and not is_speculators(hf)


def hf_config(fmt: str, drafter, max_positions: int, dtype: str, verifier: str = "",
              chat: dict | None = None, verifier_architectures: tuple[str, ...] = ()) -> dict[str, Any]:
    """The config.json of `drafter` in layout `fmt` (see the module docstring)."""
    c = drafter.config
    ours = hf_format.our_entry(drafter, chat)
    aux = list(c.feature_layers)
    common = {"draft_vocab_size": c.head_size, "target_hidden_size": c.hidden_size,
              "eagle_aux_hidden_state_layer_ids": aux, "norm_before_residual": False}
    layer = hf_format.layer_fields(c, max_positions)
    if fmt == EAGLE3:
        return {"architectures": [EAGLE3_ARCHS[0]], "model_type": "llama", "torch_dtype": dtype, "dtype": dtype,
                **layer, "num_hidden_layers": 1, **common,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in aux],
                                 "use_aux_hidden_state": True},
                hf_format.NATIVE: ours}
    return {"architectures": [SPECULATORS_ARCHS[0]], "speculators_model_type": KIND,
            "speculators_version": "0.9.0", **common,
            "norm_before_fc": False, "fc_norm": False, "norm_output": False, "embed_requires_grad": False,
            "transformer_layer_config": {"model_type": "llama", "num_hidden_layers": 1, "torch_dtype": dtype,
                                         "dtype": dtype, **layer},
            "speculators_config": {
                "algorithm": KIND, "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": drafter.depth,
                                      "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                "verifier": {"name_or_path": verifier or "target",
                             "architectures": list(verifier_architectures)}},
            hf_format.NATIVE: ours}


def export(fmt: str, drafter, flat: dict, vocab, path: str | Path, *, dtype: str = "bfloat16",
           max_positions: int = 0, verifier: str = "", chat: dict | None = None,
           verifier_architectures: tuple[str, ...] = ()) -> Path:
    """Writes `drafter` in layout `fmt` (`hf_format.export` has the arguments)."""
    config = hf_config(fmt, drafter, max(max_positions, 1), dtype, verifier, chat, verifier_architectures)
    return hf_format.write(path, fmt, weights(drafter.config, PREFIX[fmt]), flat, vocab, config, dtype)


def _aux_ids(path, hf: dict, tc) -> tuple[int, ...]:
    """The auxiliary layers as HF hidden_states indices (checked against each other and the target)."""
    top = hf.get("eagle_aux_hidden_state_layer_ids")
    sg = (hf.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if top is not None and sg is not None and [i + 1 for i in sg] != list(top):
        hf_format.fail(path, "eagle_config.eagle_aux_hidden_state_layer_ids",
                       f"{sg} (decoder-layer outputs) disagree with eagle_aux_hidden_state_layer_ids {top}")
    ids = tuple(top) if top is not None else tuple(i + 1 for i in sg) if sg is not None else None
    if ids is None:  # the engines' default
        n = tc.num_layers
        ids = (2, n // 2, n - 3)
    if min(ids) < 0 or max(ids) > tc.num_layers:
        hf_format.fail(path, "eagle_aux_hidden_state_layer_ids", f"{list(ids)} outside the target's "
                                                                 f"{tc.num_layers} layers")
    return ids


def import_meta(fmt: str, path: Path, hf: dict, tc) -> dict[str, Any]:
    """Our drafter meta of a config.json in layout `fmt` (`hf_format.import_meta`)."""
    layer = hf.get("transformer_layer_config", hf) if fmt == SPECULATORS else hf
    config = hf_format.layer_config(path, hf, layer, tc)
    if layer.get("model_type", "llama") != "llama":  # a Qwen3 layer adds q/k norms
        hf_format.fail(path, "model_type", f"{layer['model_type']!r}: our EAGLE-3 layer is the Llama layer "
                                           "(no q/k norms) that vLLM's and SGLang's EAGLE-3 run")
    if layer.get("num_hidden_layers", 1) != 1:
        hf_format.fail(path, "num_hidden_layers", f"{layer['num_hidden_layers']}: our EAGLE-3 drafter has one layer")
    draft = hf.get("draft_vocab_size") or layer["vocab_size"]
    config.update(feature_layers=list(_aux_ids(path, hf, tc)),
                  draft_vocab_size=0 if draft == layer["vocab_size"] else draft)
    return hf_format.our_meta(path, hf, KIND, fmt, config)


def read_weights(path: Path, meta: dict, config, target) -> tuple[dict, Any]:
    """(our flat params, DraftVocab or None) of a folder in layout meta["hf_format"]."""
    return hf_format.read(path, weights(config, PREFIX[meta["hf_format"]]), config, target)


FORMATS = tuple(ReleasedFormat(fmt, KIND, detect, functools.partial(import_meta, fmt), read_weights,
                               functools.partial(export, fmt))
                for fmt, detect in ((EAGLE3, is_eagle3), (SPECULATORS, is_speculators)))
