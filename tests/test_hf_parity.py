"""Logit and hidden-state parity with transformers (PyTorch, CPU, fp32) and HF export round trips."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import specblock_jax as sbj

KINDS = ("qwen3", "qwen3-untied", "llama3", "llama-bias")


def _padded_batch():
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 128, (3, 12))
    mask = np.ones((3, 12), np.int64)
    mask[1, :4] = 0  # left padding
    mask[2, 9:] = 0  # right padding
    pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
    return ids, mask, pos


def _torch_forward(model, ids, mask, pos):
    with torch.no_grad():
        out = model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                    position_ids=torch.tensor(pos), output_hidden_states=True)
    return out.logits.numpy(), [h.numpy() for h in out.hidden_states]


@pytest.mark.parametrize("kind", KINDS)
def test_logits_and_hidden_match_transformers_on_padded_batch(hf_dirs, kind):
    path, model = hf_dirs[kind]
    target = sbj.load_target(path)
    assert target.config.dtype == "float32"
    ids, mask, pos = _padded_batch()
    ref_logits, ref_hidden = _torch_forward(model, ids, mask, pos)
    layers = target.config.num_layers
    logits, hidden = sbj.forward(target, ids, mask, hidden_ids=tuple(range(layers + 1)))
    real = mask.astype(bool)
    assert np.abs(np.asarray(logits) - ref_logits)[real].max() <= 1e-4
    for j in range(layers + 1):
        assert np.abs(np.asarray(hidden[:, :, j]) - ref_hidden[j])[real].max() <= 1e-4, j


def test_llama3_rope_scaling_at_long_positions(hf_dirs):
    """Positions far past original_max_position_embeddings exercise every scaled frequency band."""
    path, model = hf_dirs["llama3"]
    target = sbj.load_target(path)
    ids = np.random.default_rng(2).integers(0, 128, (1, 8))
    mask = np.ones_like(ids)
    pos = np.arange(8)[None] + 400
    ref, _ = _torch_forward(model, ids, mask, pos)
    ours = sbj.forward(target, ids, mask, positions=pos)
    assert np.abs(np.asarray(ours) - ref).max() <= 1e-4
    from specblock_jax.models.layers import rope_inv_freq

    np.testing.assert_allclose(rope_inv_freq(target.config.rope, target.config.head_dim),
                               model.model.rotary_emb.inv_freq.numpy(), rtol=1e-6)
    # the scaling matters: unscaled rope gives visibly different logits
    plain = target.replace(config=target.config.replace(rope=sbj.RopeConfig(theta=500000.0)))
    plain = plain.replace(graphdef=sbj.models.abstract_target(plain.config)[0])
    assert np.abs(np.asarray(sbj.forward(plain, ids, mask, positions=pos)) - ref).max() > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_export_reloads_in_transformers_with_same_logits(hf_dirs, kind, tmp_path):
    path, model = hf_dirs[kind]
    target = sbj.load_target(path)
    sbj.save_target(target, tmp_path)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    ids, mask, pos = _padded_batch()
    a, _ = _torch_forward(model, ids, mask, pos)
    b, _ = _torch_forward(reloaded, ids, mask, pos)
    np.testing.assert_array_equal(a, b)
    again = sbj.load_target(tmp_path)
    for x, y in zip(jax_leaves(target.params), jax_leaves(again.params)):
        np.testing.assert_array_equal(x, y)


def jax_leaves(tree):
    import jax

    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_bf16_export_stores_rounded_weights_and_loads_in_both_dtypes(hf_dirs, tmp_path):
    import ml_dtypes

    target = sbj.load_target(hf_dirs["qwen3"][0])
    sbj.save_target(target, tmp_path, dtype="bfloat16")
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    fp32 = sbj.load_target(tmp_path, dtype="float32")
    bf16 = sbj.load_target(tmp_path, dtype="bfloat16")
    for x, y, z in zip(jax_leaves(target.params), jax_leaves(fp32.params), jax_leaves(bf16.params)):
        np.testing.assert_array_equal(x.astype(ml_dtypes.bfloat16).astype(np.float32), y)
        assert z.dtype == ml_dtypes.bfloat16
    ids = np.arange(10)[None]
    logits = sbj.forward(bf16, ids)
    assert logits.dtype == np.float32 and np.isfinite(np.asarray(logits)).all()
    # transformers reads the bf16 folder too
    from transformers import Qwen3ForCausalLM

    assert Qwen3ForCausalLM.from_pretrained(tmp_path).lm_head.weight.dtype == torch.bfloat16


def test_sharded_export_writes_an_index_and_loads(hf_dirs, tmp_path):
    target = sbj.load_target(hf_dirs["qwen3-untied"][0])
    sbj.save_target(target, tmp_path, max_shard_bytes=64 * 1024)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    again = sbj.load_target(tmp_path)
    ids = np.arange(6)[None]
    np.testing.assert_array_equal(np.asarray(sbj.forward(target, ids)), np.asarray(sbj.forward(again, ids)))
    from transformers import Qwen3ForCausalLM

    ref, _ = _torch_forward(Qwen3ForCausalLM.from_pretrained(tmp_path).eval(), ids, np.ones_like(ids),
                            np.arange(6)[None])
    assert np.abs(np.asarray(sbj.forward(again, ids)) - ref).max() <= 1e-4
