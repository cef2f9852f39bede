"""Decoding: the target's sampling distribution and batched generation."""

from specblock_jax.decoding.compiled import compilation_count
from specblock_jax.decoding.generate import GenerationResult, generate
from specblock_jax.decoding.sampling import SamplingParams, sample, sampling_logprobs
