"""specblock-jax: speculative decoding for LLMs in JAX/Flax.

The public API (functional): load a target, run it, generate from it, save it.

    import specblock_jax as sbj
    target = sbj.load_target("path/to/hf_dir")
    logits = sbj.forward(target, token_ids)            # [B, T] -> [B, T, V]
    results = sbj.generate(target, ["def f(x):"], max_new_tokens=64)            # target only
    drafter = sbj.load_drafter("assets/drafters/eagle3", target)   # a LoadedDrafter(drafter, params)
    results = sbj.generate(target, ["def f(x):"], drafter, sampling=sbj.Sampling(temperature=1.0))
    auto = sbj.serving.AutoServe(drafter)                # target-only or speculation, by measured speed
    results = auto.generate(target, ["def f(x):"])
    adapter = sbj.adaptation.Adapter(drafter)                                   # serving-time
    results = sbj.generate(target, prompts, drafter, adapter=adapter)           # adaptation
    sbj.save_target(target, "out_dir")
"""

from specblock_jax import _quiet  # noqa: F401  (first: transformers' no-PyTorch advisory, libtpu's probe)

# Subpackages, one concept each, in import order (docs/architecture.md): target models, device
# meshes, draft trees, drafters (and their registry), the decoding loops, serving-time adaptation,
# serving policies (auto, routing, calibration). `training` (data, losses), `trainer` and `aot` are
# imported on demand.
from specblock_jax import adaptation, decoding, drafters, models, parallel, serving, trees

# Decoding: batched generation, autoregressive or speculative, what it returns, prompt files.
from specblock_jax.decoding import DecodeOptions, GenerationResult, GenerationStats, Sampling, generate
from specblock_jax.prompts import read_prompts

# Drafters: folders of any registered kind, loaded with their weights.
from specblock_jax.drafters.base import LoadedDrafter
from specblock_jax.drafters.io import load_drafter, save_drafter

# Targets: Qwen3 / Llama-3 decoders, their KV cache and Hugging Face checkpoints.
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
    "adaptation", "decoding", "drafters", "models", "parallel", "serving", "trees",
    "DecodeOptions", "GenerationResult", "GenerationStats", "Sampling", "generate", "read_prompts",
    "LoadedDrafter", "load_drafter", "save_drafter",
    "CheckpointError", "KVCache", "ModelConfig", "RopeConfig", "Target", "UnsupportedModelError",
    "forward", "init_cache", "init_target", "load_target", "save_target",
]
__version__ = "0.1.0"
