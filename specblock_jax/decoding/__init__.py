"""Decoding: the target-only and speculative loops, batched generation, method names, and tree
calibration for the machine at hand (`calibrate`)."""

from specblock_jax.decoding import calibrate
from specblock_jax.decoding.autoregressive import ar_loop
from specblock_jax.decoding.compiled import compilation_count
from specblock_jax.decoding.generate import generate
from specblock_jax.decoding.methods import parse_method, resolve_drafter, resolve_method
from specblock_jax.decoding.prefill import LoopOutput
from specblock_jax.decoding.results import GenerationResult, GenerationStats
from specblock_jax.decoding.sampling import SamplingParams, sample, sampling_logprobs
from specblock_jax.decoding.speculative import spec_loop
