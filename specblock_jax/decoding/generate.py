"""`generate`: the front door. Batched decoding of prompts, target-only or speculative.

It checks and encodes the prompts into `Request`s and the call's settings into `JobSettings`
(`prepare`, decoding/job.py) and hands them to `run_requests` (decoding/runner.py: static batches or a
continuous-batching stream). Auto serving (`serving.AutoServe(...).generate`) is its own entry
point above this one.
"""

from __future__ import annotations

from typing import Sequence

from specblock_jax.decoding.runner import OnBatch, run_requests
from specblock_jax.decoding.job import prepare
from specblock_jax.decoding.options import DEFAULTS, DecodeOptions
from specblock_jax.decoding.results import GenerationResult
from specblock_jax.decoding.sampling import GREEDY, Sampling
from specblock_jax.drafters.base import LoadedDrafter
from specblock_jax.models.target import Target


def generate(target: Target, prompts: str | Sequence[str] | Sequence[Sequence[int]],
             drafter: LoadedDrafter | None = None, *, sampling: Sampling = GREEDY,
             max_new_tokens: int | Sequence[int] = 256, seed: int = 0, options: DecodeOptions = DEFAULTS,
             adapter=None, on_batch: OnBatch | None = None) -> list[GenerationResult]:
    """One result per prompt, in order (a bare string is one prompt; an empty list gives [], except
    that under a multi-host mesh a host with no prompts still joins every batch).

    drafter: None decodes target-only; a `LoadedDrafter` (`sbj.load_drafter(folder or
    "prompt_lookup", target)`) decodes speculatively: greedy output is token-identical to
    target-only decoding, sampled output follows the target's distribution exactly.
    sampling: temperature (one, or one per prompt), top-k and top-p. max_new_tokens: one budget,
    or one per prompt. seed: sampling keys are fold_in(seed, prompt position), so results do not
    depend on batching. options: batch size, stop tokens, mesh, profiling, continuous batching
    (`DecodeOptions`). adapter: a `specblock_jax.adaptation.Adapter` built for `drafter`: it learns
    from the verified tokens after each batch and may update the drafter (outputs unchanged).
    on_batch: called with each batch's results as they finish (e.g. a progress bar).
    """
    if drafter is not None and not isinstance(drafter, LoadedDrafter):
        raise TypeError(f"drafter: expected a LoadedDrafter or None (got {type(drafter).__name__}); "
                        "sbj.load_drafter(a drafter folder or a kind without one, target) returns one")
    if adapter is not None:
        if drafter is None or drafter.drafter is not adapter.drafter:
            raise ValueError("adapter: pass the drafter the adapter was built for as `drafter`")
        if options.mesh is not None:
            raise ValueError("adapter: serving-time adaptation does not run under a mesh yet")
    requests, job = prepare(target, prompts, sampling=sampling, max_new_tokens=max_new_tokens, seed=seed,
                            options=options)
    if not requests and options.mesh is None:  # under a mesh a host with no prompts still joins each batch
        return []
    return run_requests(target, requests, drafter, job, adapter=adapter, on_batch=on_batch)
