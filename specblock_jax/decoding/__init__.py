"""Decoding: batched generation (`generate`) over the target-only and speculative loops
(`LoopSpec`: a loop's static settings and its start/run/output stages) and prompt batching."""

from specblock_jax.decoding import step_profile
from specblock_jax.decoding.compiled import compilation_count
from specblock_jax.decoding.generate import generate
from specblock_jax.decoding.job import DecodeOptions, Request
from specblock_jax.decoding.loop import LoopSpec
from specblock_jax.decoding.prefill import LoopInputs, LoopOutput
from specblock_jax.decoding.results import GenerationResult, GenerationStats
from specblock_jax.decoding.sampling import SamplingParams, sample, sampling_logprobs
