"""specblock-jax: speculative decoding for LLMs in JAX/Flax.

The public API (functional): load a target, run it, generate from it, save it.

    import specblock_jax as sbj
    target = sbj.load_target("path/to/hf_dir")
    logits = sbj.forward(target, token_ids)            # [B, T] -> [B, T, V]
    results = sbj.generate(target, ["def f(x):"], max_new_tokens=64)            # target only
    drafter = sbj.load_drafter("assets/drafters/eagle3", target)
    results = sbj.generate(target, ["def f(x):"], drafter=drafter)              # speculative
    adapter = sbj.adaptation.Adapter(*drafter)                                  # serving-time
    results = sbj.generate(target, prompts, drafter=drafter, adapter=adapter)   # adaptation
    sbj.save_target(target, "out_dir")
"""

from specblock_jax import _quiet  # noqa: F401  (first: silences transformers' no-PyTorch advisory)
from specblock_jax import adaptation
from specblock_jax.decoding import GenerationResult, SamplingParams, generate
from specblock_jax.drafters.io import load_drafter, save_drafter
from specblock_jax.models import (
    CheckpointError,
    KVCache,
    ModelConfig,
    RopeConfig,
    Target,
    UnsupportedModelError,
    forward,
    init_cache,
    init_target,
    load_target,
    save_target,
)

__all__ = [
    "CheckpointError", "GenerationResult", "KVCache", "ModelConfig", "RopeConfig", "SamplingParams",
    "Target", "UnsupportedModelError", "forward", "generate", "init_cache", "init_target",
    "adaptation", "load_drafter", "load_target", "save_drafter", "save_target",
]
__version__ = "0.1.0"
