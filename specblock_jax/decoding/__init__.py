"""Decoding: the front door `generate` (typed: `Sampling`, `DecodeOptions`), the target-only and
speculative loops (`make_loop` picks `TargetLoop` or `SpeculativeLoop`: static settings with
start/step/run/output stages), prompt
batching and continuous batching, and the per-phase step profile."""

from specblock_jax.decoding import step_profile
from specblock_jax.decoding.compiled import compilation_count, on_compile, use_compile_cache
from specblock_jax.decoding.generate import generate
from specblock_jax.decoding.job import Request
from specblock_jax.decoding.loop import DecodeLoop, SpeculativeLoop, TargetLoop, decode_loop, make_loop
from specblock_jax.decoding.options import DecodeOptions
from specblock_jax.prompts import encode_prompts, read_prompts
from specblock_jax.decoding.loop_core import LoopInputs, LoopOutput
from specblock_jax.decoding.results import GenerationResult, GenerationStats
from specblock_jax.decoding.sampling import Sampling, SamplingParams, sample, sampling_logprobs
