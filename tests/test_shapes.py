"""Real-size configs: abstract shapes and parameter counts via jax.eval_shape (no memory used)."""

from __future__ import annotations

import jax
import pytest

from specblock_jax.models import abstract_target, count_params
from specblock_jax.models import config as C

# Published parameter counts of the HF checkpoints (Qwen3-4B ties its embeddings).
EXPECTED = {"qwen3-4b": 4_022_468_096, "qwen3-8b": 8_190_735_360, "llama3.1-8b": 8_030_261_248}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_size_configs_have_the_published_parameter_counts(name):
    cfg = C.PRESETS[name]()
    _, params = abstract_target(cfg)
    assert count_params(params) == EXPECTED[name] == cfg.num_params()
    leaves = jax.tree.leaves(params)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)  # nothing was allocated
    assert all(x.dtype == jax.numpy.bfloat16 for x in leaves)
    q = params["layers"]["self_attn"]["q_proj"]  # stacked layers
    assert q.shape == (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.head_dim)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_presets_round_trip_through_hf_config(name):
    cfg = C.PRESETS[name]()
    assert C.ModelConfig.from_hf(cfg.to_hf()) == cfg
