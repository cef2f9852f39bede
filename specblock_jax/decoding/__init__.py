"""Decoding: batched generation (`generate`) over the target-only and speculative loops
(`LoopSpec`: a loop's static settings and its start/run/output stages), method names, JSONL prompt
files (`read_prompts`), tree calibration for the machine at hand (`calibrate`) and the per-phase
step profile (`step_profile`, a module like `calibrate`: `step_profile.step_profile(...)`)."""

from specblock_jax.decoding import calibrate, step_profile
from specblock_jax.decoding.auto import AutoServe
from specblock_jax.decoding.compiled import compilation_count
from specblock_jax.decoding.generate import generate
from specblock_jax.decoding.job import DecodeOptions, Request, cache_length, encode_prompts, length_bucket
from specblock_jax.decoding.loop import LoopSpec
from specblock_jax.decoding.methods import parse_method, resolve_drafter, resolve_method
from specblock_jax.decoding.prefill import LoopInputs, LoopOutput
from specblock_jax.decoding.prompts import read_prompts
from specblock_jax.decoding.results import GenerationResult, GenerationStats
from specblock_jax.decoding.sampling import SamplingParams, sample, sampling_logprobs
