"""What `generate` returns per prompt: the new tokens, their text and the decoding statistics."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class GenerationStats:
    """Statistics of one prompt's decoding. tau = tokens committed per decoding forward of the
    target, the bonus token included (the prefill's token and forward are not counted): exactly 1
    for target-only decoding, None when no decoding forward ran (a one-token budget or a stop
    token first)."""

    prompt_tokens: int
    new_tokens: int
    target_forwards: int  # decoding forwards + the prefill
    tau: float | None
    finish_reason: str  # "stop" (a stop token) | "length" (the token budget)
    draft_time_s: float | None  # estimated drafting time, propose + update (decoding/step_profile.py);
    # None under a mesh or with generate(profile="off")
    total_time_s: float  # the batch's decode-loop wall time (compilation excluded); with refill,
    # the wall time of the segment the row finished in (generate's `refill`)
    compile_s: float  # compilation time spent for this batch (0 once warm)
    batch_size: int
    batch: int  # index of the batch in decoding order
    adapt: dict | None = None  # the batch's serving-time adaptation event, if an adapter ran
    # with generate(profile="all"): the batch's step profile, {"<phase>_ms": ..., shape}
    # (decoding/step_profile.py)
    step_profile: dict | None = None
    # estimated drafting time of the whole batch (or refill segment): its decoding steps x one
    # batched propose + update; None when draft_time_s is
    batch_draft_time_s: float | None = None
    batch_steps: int | None = None  # decoding steps (target forwards) its batch or refill segment ran
    auto: dict | None = None  # with auto serving (serving/auto.py): its chunk's decision and measurement
    # with a drafter whose requests each choose a size at the prefill (BlockPilot): the block size
    # this request chose, which it drafted and verified at (decoding/sized.py)
    block_size: int | None = None
    # speculative decoding: commit_hist[c] = decoding steps this row ran in which the most tokens any
    # row of its batch committed was c (what a row-switched update such as SpecBlock's runs at)
    commit_hist: list[int] | None = None
    # step sizing (decoding/sizing.py): {"sizes": the menu, "step_ms": the cost model, "chosen":
    # steps at each size, "accepted": steps at a size > 0 by the row's accepted draft tokens (0..N),
    # "predicted": the expected committed tokens of the chosen sizes summed (its committed tokens
    # are sum((a + 1) x accepted[a]) + chosen[0])}
    sizing: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (without `adapt`, `step_profile`, `auto`, `block_size`, `commit_hist` or
        `sizing` when they are None)."""
        out = dataclasses.asdict(self)
        for name in ("adapt", "step_profile", "auto", "block_size", "commit_hist", "sizing"):
            if out[name] is None:
                del out[name]
        return out


@dataclasses.dataclass
class GenerationResult:
    text: str | None  # decoded new tokens (special tokens skipped), None without a tokenizer
    token_ids: list[int]  # new tokens, including the stop token if one ended the sequence
    stats: GenerationStats
    index: int = -1  # the prompt's position in `generate`'s prompts
