"""`DecodeOptions`: the rarely changed settings of a `generate` call, in one frozen object."""

from __future__ import annotations

import dataclasses
from typing import Any

from specblock_jax import checks

PROFILES = ("off", "draft", "all")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeOptions:
    """Settings of a `generate` call beyond sampling and the token budget; the defaults suit most
    calls. Each field is checked when the object is built."""

    batch_size: int | None = None
    """Rows per compiled batch (the last batch is padded to it); None: min(8, prompts)."""
    stop_tokens: tuple[int, ...] = ()
    """Extra stop token ids, besides the target config's and tokenizer's EOS (at most 8 in all)."""
    max_cache_len: int | None = None
    """Bound on prompt + max_new_tokens per request; None: the target's max_position_embeddings."""
    mesh: Any = None
    """None (one device) or a `jax.sharding.Mesh` with axes ("data", "model"): batches split over
    "data", the target and its KV cache over "model"; token-identical output. In a multi-host run
    every host passes its own prompts and gets its own results (hosts run in lockstep)."""
    profile: str = "off"
    """Time the step's phases apart (decoding/step_profile.py; not under a mesh): "off"; "draft"
    (propose and update: `stats.draft_time_s`); "all" (every phase: `stats.step_profile`)."""
    refill: bool | None = None
    """Continuous batching: a finished row takes the next waiting request. None: on for calls
    larger than one batch, off under a mesh."""
    refill_rows: int = 1
    """With refill, the loop returns to the host once this many rows are free."""
    queue: int = 0
    """How many waiting requests the adapter and auto serving may count as work still to do (a
    server holding that many knows them); 0: every request of the call."""
    key_index: tuple[int, ...] | None = None
    """Each prompt's sampling stream is fold_in(seed, key_index[i]); None: the prompt's position.
    A caller that splits one job over several calls passes the prompts' positions in the job."""

    def __post_init__(self):
        try:
            for name, low in (("batch_size", 1), ("max_cache_len", 1)):
                if getattr(self, name) is not None:
                    checks.whole(getattr(self, name), name, low)
            checks.whole(self.refill_rows, "refill_rows", 1)
            checks.whole(self.queue, "queue", 0)
            if self.profile not in PROFILES:
                raise ValueError(f"profile: must be one of {PROFILES} (got {self.profile!r})")
            object.__setattr__(self, "stop_tokens", tuple(checks.whole(t, f"stop_tokens[{i}]", 0)
                                                          for i, t in enumerate(self.stop_tokens)))
            if self.key_index is not None:
                object.__setattr__(self, "key_index", tuple(checks.whole(k, f"key_index[{i}]", 0)
                                                            for i, k in enumerate(self.key_index)))
        except ValueError as e:
            raise ValueError(f"options: {e}") from None


DEFAULTS = DecodeOptions()
