"""Independent writers and reference forwards of the released SpecBlock and BlockPilot formats,
written (torch, tests only) from the public code, not from our importers:

- shiweijiezero/SpecBlock `specforge/modeling/draft/_llama3_specblock_base.py` (input layer, Llama
  decoder layer, rank head, `save_pretrained` without the embedding, d2t/t2d buffers),
  `llama3_specblock.py` (`forward_parallel` with the shift before layers >= 1),
  `scripts/train_specblock.py` `save_checkpoints` (model.safetensors + vocab_mapping.pt);
- AMAP-ML/BlockPilot `utils/predict.py` (the MLP, `pred + 14`) and `dataset.py` (its input: the
  prefill's `output.logits`, raw).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from specblock_jax.drafters.specblock import _released as specblock_released


# ------------------------------------------------------------------------------------ SpecBlock

# The released drafters' configs (shiweijiezero/SpecBlock configs/specblock/{qwen3,llama3}-8B-specblock.json,
# which `save_pretrained` writes back as config.json), with the target preset each was trained for.
PUBLIC_CONFIGS = specblock_released.RELEASED_CONFIGS  # plain data, kept in the library for specblock-aot


def specblock_config(h, inter, heads, kv, layers, vocab, draft_vocab, k, aux_ids, theta=10000.0, eps=1e-6,
                     **extra) -> dict:
    """A released config.json (LlamaConfig fields + SpecBlock's), as `save_pretrained` writes it."""
    return {"architectures": ["LlamaForCausalLMSpecBlock"], "model_type": "llama", "hidden_size": h,
            "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv,
            "head_dim": h // heads, "num_hidden_layers": layers, "rms_norm_eps": eps, "rope_theta": theta,
            "rope_scaling": None, "hidden_act": "silu", "vocab_size": vocab, "draft_vocab_size": draft_vocab,
            "max_position_embeddings": 2048, "tie_word_embeddings": False, "torch_dtype": "float32",
            "initializer_range": 0.02, "use_cache": True, "bos_token_id": 1, "eos_token_id": 2,
            "transformers_version": "4.51.0", "diffspec_draft_token_num": k, "rank_classes": 4,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_ids)}, **extra}


def random_specblock_state(cfg: dict, draft_ids: list[int] | None, seed: int = 0) -> dict[str, torch.Tensor]:
    """The drafter's state dict without the embedding (their checkpoint's tensors), random."""
    g = torch.Generator().manual_seed(seed)
    h, f, k = cfg["hidden_size"], cfg["intermediate_size"], cfg["diffspec_draft_token_num"]
    nh, nkv, vd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["draft_vocab_size"]
    d = h // nh
    rnd = lambda *s, scale=0.15: torch.randn(*s, generator=g) * scale  # noqa: E731
    norm = lambda: 1.0 + 0.1 * torch.randn(h, generator=g)  # noqa: E731
    w = {"input_layer.condition_proj.weight": rnd(h, 3 * h), "input_layer.condition_norm.weight": norm(),
         "input_layer.token_norm.weight": norm(), "input_layer.position_queries.weight": rnd(k, h, scale=1.0),
         "input_layer.query_norm.weight": norm(), "input_layer.fuse.weight": rnd(h, 3 * h),
         "norm.weight": norm(), "lm_head.weight": rnd(vd, h, scale=0.5),
         "rank_head.0.weight": rnd(256, h + 15, scale=0.2), "rank_head.2.weight": rnd(4, 256, scale=0.2)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        w.update({p + "input_layernorm.weight": norm(), p + "post_attention_layernorm.weight": norm(),
                  p + "self_attn.q_proj.weight": rnd(nh * d, h, scale=0.4),
                  p + "self_attn.k_proj.weight": rnd(nkv * d, h, scale=0.4),
                  p + "self_attn.v_proj.weight": rnd(nkv * d, h), p + "self_attn.o_proj.weight": rnd(h, nh * d),
                  p + "mlp.gate_proj.weight": rnd(f, h), p + "mlp.up_proj.weight": rnd(f, h),
                  p + "mlp.down_proj.weight": rnd(h, f)})
    for i in range(cfg["num_hidden_layers"] - 1):
        w[f"shift_proj.{i}.weight"] = rnd(h, 2 * h, scale=0.1)
    v = cfg["vocab_size"]
    if draft_ids is None:  # their buffers' defaults: identity mapping
        w["d2t"], w["t2d"] = torch.zeros(vd, dtype=torch.long), torch.ones(v, dtype=torch.bool)
    else:  # SpecForge's process_token_dict_to_mappings: sorted ids, offsets
        ids = torch.tensor(sorted(draft_ids), dtype=torch.long)
        w["d2t"] = ids - torch.arange(len(ids))
        w["t2d"] = torch.zeros(v, dtype=torch.bool)
        w["t2d"][ids] = True
    return w


def write_specblock(path: Path, cfg: dict, state: dict[str, torch.Tensor], vocab_mapping: bool = False) -> Path:
    """A released folder: config.json, model.safetensors (+ vocab_mapping.pt, as training copies it)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    if vocab_mapping:
        torch.save({"d2t": state["d2t"].clone(), "t2d": state["t2d"].clone()}, str(path / "vocab_mapping.pt"))
    return path


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta):  # x [heads, L, D], rotate-half (their LlamaRotaryEmbedding, no scaling)
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    ang = torch.cat([pos.float()[:, None] * inv[None]] * 2, -1)
    rot = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * ang.cos() + rot * ang.sin()


def specblock_forward(w: dict, cfg: dict, aux: torch.Tensor, embeds: torch.Tensor):
    """`forward_parallel` of block 1 (no caches): aux [S, 3H] target features, embeds [S, H] of the
    next tokens -> (logits [S, K, V'], rank logits [S, K, 4])."""
    eps, nh, nkv = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    h, k = cfg["hidden_size"], cfg["diffspec_draft_token_num"]
    d, s = h // nh, aux.shape[0]
    cond = _rms(aux @ w["input_layer.condition_proj.weight"].T, w["input_layer.condition_norm.weight"], eps)
    tok = _rms(embeds, w["input_layer.token_norm.weight"], eps)
    query = _rms(w["input_layer.position_queries.weight"], w["input_layer.query_norm.weight"], eps)
    fw = w["input_layer.fuse.weight"]
    x = (cond @ fw[:, :h].T)[:, None] + (tok @ fw[:, h:2 * h].T)[:, None] + (query @ fw[:, 2 * h:].T)[None]
    x = x.reshape(s * k, h)
    pos = (torch.arange(1, s + 1)[:, None] + torch.arange(k)[None]).reshape(-1)
    qi = torch.arange(s * k)
    q_pos, q_slot = qi // k, qi % k
    same = q_pos[None, :] == q_pos[:, None]  # [query, key]: every slot of earlier positions, own slots <= k
    allowed = (q_pos[None, :] < q_pos[:, None]) | (same & (q_slot[None, :] <= q_slot[:, None]))
    for i in range(cfg["num_hidden_layers"]):
        if i > 0:  # llama3_specblock.py: slot k gets slot k-1's hidden, slot 0 itself
            hh = x.view(s, k, h)
            shifted = torch.cat([hh[:, :1], hh[:, :-1]], 1).reshape(s * k, h)
            sw = w[f"shift_proj.{i - 1}.weight"]
            x = x @ sw[:, :h].T + shifted @ sw[:, h:].T
        p = f"layers.{i}."
        y = _rms(x, w[p + "input_layernorm.weight"], eps)
        q = _rope((y @ w[p + "self_attn.q_proj.weight"].T).view(s * k, nh, d).transpose(0, 1), pos, cfg["rope_theta"])
        kk = _rope((y @ w[p + "self_attn.k_proj.weight"].T).view(s * k, nkv, d).transpose(0, 1), pos, cfg["rope_theta"])
        v = (y @ w[p + "self_attn.v_proj.weight"].T).view(s * k, nkv, d).transpose(0, 1)
        kk, v = kk.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
        scores = (q @ kk.transpose(1, 2)) / d ** 0.5
        att = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v
        x = x + att.transpose(0, 1).reshape(s * k, nh * d) @ w[p + "self_attn.o_proj.weight"].T
        y = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + (torch.nn.functional.silu(y @ w[p + "mlp.gate_proj.weight"].T)
                 * (y @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    normed = _rms(x.view(s, k, h), w["norm.weight"], eps)
    logits = normed @ w["lm_head.weight"].T
    top20 = logits.topk(20, dim=-1).values.float()
    lse = torch.logsumexp(top20, -1, keepdim=True)
    lp10 = top20[..., :10] - lse
    gaps = torch.cat([top20[..., :1] - top20[..., 1:2], top20[..., :1] - top20[..., 2:3],
                      top20[..., :1] - top20[..., 4:5]], -1)
    lp20 = top20 - lse
    entropy = -(lp20.exp() * lp20).nan_to_num(0.0).sum(-1, keepdim=True)
    feats = torch.cat([lp10, gaps, lp10[..., :1].exp(), entropy], -1)
    r = torch.nn.functional.silu(torch.cat([normed, feats], -1) @ w["rank_head.0.weight"].T)
    return logits, r @ w["rank_head.2.weight"].T


# ------------------------------------------------------------------------------------ BlockPilot


class BlockPilotMLP(torch.nn.Module):
    """utils/predict.py's MLP: Linear -> ReLU -> dropout per layer, residual after it for layers >= 1."""

    def __init__(self, input_dim, hidden_dim=2048, num_classes=5, n_layers=2):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(input_dim, hidden_dim)] + [
            torch.nn.Linear(hidden_dim, hidden_dim) for _ in range(n_layers - 1)])
        self.act, self.dropout = torch.nn.ReLU(), torch.nn.Dropout(0.2)
        self.fc_out = torch.nn.Linear(hidden_dim, num_classes)

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            residual = x
            x = self.dropout(self.act(layer(x)))
            if i > 0:
                x = x + residual
        return self.fc_out(x)


def write_blockpilot(file: Path, input_dim: int, hidden_dim: int, num_classes: int = 5, n_layers: int = 2,
                     seed: int = 0) -> BlockPilotMLP:
    """A random policy saved as the release is (bfloat16 state dict); returns the bf16 model."""
    torch.manual_seed(seed)
    model = BlockPilotMLP(input_dim, hidden_dim, num_classes, n_layers)
    with torch.no_grad():  # biases matter; the residual branch matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model = model.to(torch.bfloat16).eval()
    torch.save(model.state_dict(), str(file))
    return model


def blockpilot_predict(model: BlockPilotMLP, logits: np.ndarray, dtype=torch.bfloat16) -> np.ndarray:
    """predict.py: block = argmax(model(prefill logits)) + 14, in `dtype` (theirs: bfloat16)."""
    m = BlockPilotMLP(model.layers[0].in_features, model.fc_out.in_features, model.fc_out.out_features,
                      len(model.layers))
    m.load_state_dict(model.state_dict())
    m = m.to(dtype).eval()
    with torch.no_grad():
        return (m(torch.from_numpy(logits).to(dtype)).argmax(-1) + 14).numpy()
