"""The step profile of a method over a prompt set: the median of each phase over prompts, at batch 1.

Each prompt runs at its own length bucket with the cache length `generate` gives it, so the
phases are timed at the shapes a batch-1 decode of that prompt compiles (decoding/step_profile.py).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specblock_jax.models.kv_cache import cache_length, length_bucket
from specblock_jax.decoding.loop import make_loop
from specblock_jax.decoding.step_profile import default_inputs, step_profile


def median_step_profile(target, drafter, drafter_params, token_lists: Sequence[Sequence[int]], *,
                        max_new: int, reps: int = 7) -> dict[str, float]:
    """{"<phase>_ms": median over prompts of that phase's batch-1 time} for the prompts' token ids
    (drafter None: target-only, "forward_1_ms" only), plus "prompts" (how many were timed)."""
    if not token_lists:
        raise ValueError("median_step_profile needs at least one prompt")
    n = drafter.num_nodes if drafter is not None else 0
    per = []
    for toks in token_lists:
        bucket = length_bucket(len(toks))
        tokens = np.zeros((1, bucket), np.int32)
        tokens[0, :len(toks)] = toks
        loop = make_loop(graphdef=target.graphdef, cfg=target.config, drafter=drafter,
                         cache_len=cache_length(bucket, max_new, n), max_new=max_new, greedy=True)
        per.append(step_profile(loop, target.params, drafter_params,
                                default_inputs(tokens, [len(toks)], max_new=max_new), reps=reps))
    keys = [k for k in per[0] if k.endswith("_ms")]
    return {**{k: float(np.median([p[k] for p in per])) for k in keys}, "prompts": len(per)}
