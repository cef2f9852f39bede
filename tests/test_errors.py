"""Bad input gets a clear exception that names the problem."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import specblock_jax as sbj


@pytest.fixture
def ckpt(hf_dirs, tmp_path):
    src = hf_dirs["qwen3-untied"][0]
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def test_not_a_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        sbj.load_target(tmp_path / "nope")


def test_missing_config(ckpt):
    (ckpt / "config.json").unlink()
    with pytest.raises(sbj.CheckpointError, match="config.json is missing"):
        sbj.load_target(ckpt)


def test_missing_weights(ckpt):
    for f in ckpt.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(sbj.CheckpointError, match="no \\*.safetensors"):
        sbj.load_target(ckpt)


def _rewrite(ckpt, edit):
    f = ckpt / "model.safetensors"
    tensors = load_file(f)
    edit(tensors)
    save_file(tensors, f, metadata={"format": "pt"})


def test_mismatched_shape_names_the_tensor(ckpt):
    _rewrite(ckpt, lambda t: t.update({"model.layers.1.mlp.up_proj.weight": np.zeros((3, 3), np.float32)}))
    with pytest.raises(sbj.CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight: \(3, 3\) != expected \(128, 64\)"):
        sbj.load_target(ckpt)


def test_missing_and_unexpected_tensors_are_all_named(ckpt):
    def edit(t):
        del t["model.layers.0.self_attn.k_norm.weight"]
        del t["lm_head.weight"]
        t["model.layers.0.extra.weight"] = np.zeros(2, np.float32)

    _rewrite(ckpt, edit)
    with pytest.raises(sbj.CheckpointError) as err:
        sbj.load_target(ckpt)
    msg = str(err.value)
    assert "missing tensors (2)" in msg and "lm_head.weight" in msg and "k_norm.weight" in msg
    assert "unexpected tensors (1)" in msg and "model.layers.0.extra.weight" in msg


@pytest.mark.parametrize("arch,model_type", [("MistralForCausalLM", "mistral"), ("GPT2LMHeadModel", "gpt2")])
def test_unknown_architecture(ckpt, arch, model_type):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(architectures=[arch], model_type=model_type)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(sbj.UnsupportedModelError, match=f"architectures=\\['{arch}'\\], model_type='{model_type}'"):
        sbj.load_target(ckpt)


def test_unsupported_options(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}))
    with pytest.raises(sbj.UnsupportedModelError, match="rope_type='yarn'"):
        sbj.load_target(ckpt)
    (ckpt / "config.json").write_text(json.dumps({**cfg, "use_sliding_window": True}))
    with pytest.raises(sbj.UnsupportedModelError, match="use_sliding_window"):
        sbj.load_target(ckpt)


def test_generate_rejects_bad_prompts(hf_dirs):
    target = sbj.load_target(hf_dirs["qwen3"][0])
    with pytest.raises(ValueError, match="prompt 1: 500 prompt tokens \\+ max_new_tokens=20 exceed the cache limit of 512"):
        sbj.generate(target, [[1, 2], [3] * 500], max_new_tokens=20)
    with pytest.raises(ValueError, match="prompt 2: 10 prompt tokens \\+ max_new_tokens=8 exceed the cache limit of 16"):
        sbj.generate(target, [[1], [2], [3] * 10], max_new_tokens=8, options=sbj.DecodeOptions(max_cache_len=16))
    with pytest.raises(ValueError, match="prompt 0: empty prompt"):
        sbj.generate(target, [[]])
    with pytest.raises(ValueError, match="prompt 1: token ids \\[128\\] outside \\[0, 128\\)"):
        sbj.generate(target, [[1], [128]])
    with pytest.raises(ValueError, match="prompt 0: a text prompt needs a tokenizer"):
        sbj.generate(target, ["hello"])


def test_forward_rejects_bad_token_ids(hf_dirs):
    target = sbj.load_target(hf_dirs["qwen3"][0])
    with pytest.raises(ValueError, match="must be \\[batch, length\\]"):
        sbj.forward(target, [1, 2, 3])
    with pytest.raises(ValueError, match="token ids must lie in"):
        sbj.forward(target, [[1, 999]])
