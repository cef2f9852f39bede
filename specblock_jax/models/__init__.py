"""Target decoders (Qwen3, Llama-3), the static KV cache and Hugging Face checkpoint I/O."""

from specblock_jax.models.config import ModelConfig, RopeConfig, UnsupportedModelError
from specblock_jax.models.hf_io import (CheckpointError, load_target, load_text_target, load_tokenizer, random_target,
                                        save_target)
from specblock_jax.models.kv_cache import KVCache, cache_length, cache_mask, init_cache
from specblock_jax.models.target import Target, abstract_target, count_params, forward, init_target
from specblock_jax.models.transformer import ForwardOutput, apply, causal_mask, positions_from_valid
