"""What one `generate` call decodes: its requests and the settings they share, and the static
shapes they compile to (prompt length buckets, cache lengths).

Prompts are right-padded to a length bucket and a batch to a fixed size, so a job with many
prompts compiles once per (batch, prompt bucket, largest max_new_tokens, method).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

from specblock_jax.models.target import Target

MAX_STOP_TOKENS = 8
MIN_BUCKET = 16
PROFILES = ("off", "draft", "all")


def length_bucket(n: int, minimum: int = MIN_BUCKET) -> int:
    """Smallest power of two >= n (and >= minimum)."""
    return max(minimum, 1 << (max(n, 1) - 1).bit_length())


def cache_length(prompt_bucket: int, max_new_tokens: int, extra: int = 0) -> int:
    """Static cache size for a prompt bucket: room for the budget plus `extra` scratch slots,
    rounded up to a multiple of 64."""
    need = prompt_bucket + max_new_tokens + extra
    return -(-need // 64) * 64


class Request(NamedTuple):
    """One prompt to decode."""
    index: int  # its position among the call's requests (results come back in this order)
    tokens: list[int]  # the prompt's token ids
    budget: int  # max new tokens
    temperature: float
    key: int  # its PRNG stream is fold_in(base_key, key) (generate's key_index)


def renumber(requests: Sequence[Request], part: Sequence[int], keys: bool = False) -> list[Request]:
    """The requests at positions `part`, numbered 0.. in that order (a nested call's own
    positions); keys=True also gives them key streams 0.. (a call that draws its own keys)."""
    return [requests[i]._replace(index=j, **({"key": j} if keys else {})) for j, i in enumerate(part)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeOptions:
    """The settings every request of one `generate` call shares (see `generate`)."""

    top_k: int = 0
    """Sampling: keep the k most likely tokens (0: all)."""
    top_p: float = 1.0
    """Sampling: keep the smallest set of tokens with this much probability."""
    seed: int = 0
    """Base of every request's PRNG stream."""
    stop_ids: tuple[int, ...] = ()
    """Every stop token (`stop_token_ids`: the config's, the tokenizer's and the caller's)."""
    batch_size: int | None = None
    """Rows per compiled batch; None: min(8, requests)."""
    mesh: Any = None
    """None (one device) or a `jax.sharding.Mesh` / `ShardingPlan` ("data", "model")."""
    profile: str = "off"
    """How much of a decoding step to time apart: "off", "draft" or "all"."""
    refill: bool | None = None
    """Continuous batching; None: on for calls larger than one batch, off under a mesh."""
    refill_rows: int = 1
    """With refill, the loop returns to the host once this many rows are free."""
    queue: int = 0
    """Requests waiting to be served that the adapter and `auto` count as work still to do, besides
    the rows in flight: a server holding this many (`held`); 0: every request of the call."""

    def __post_init__(self):
        if self.profile not in PROFILES:
            raise ValueError(f"profile must be 'off', 'draft' or 'all', got {self.profile!r}")
        if self.refill_rows < 1:
            raise ValueError(f"refill_rows must be >= 1, got {self.refill_rows}")
        if self.queue < 0:
            raise ValueError(f"queue must be >= 0 (0: the whole call), got {self.queue}")


def held(waiting: Sequence, in_flight: int, queue: int) -> list:
    """What a server holding `queue` waiting requests knows of a call's unserved requests
    `waiting` (serving order, the `in_flight` rows first): the first in_flight + queue; all of
    them for queue 0."""
    return list(waiting) if queue == 0 else list(waiting[:in_flight + queue])


def encode_prompts(target: Target, prompts: Sequence[str | Sequence[int]]) -> list[list[int]]:
    """Token ids per prompt; strings need the target's tokenizer. Errors name the prompt index."""
    ids = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if target.tokenizer is None:
                raise ValueError(f"prompt {i}: a text prompt needs a tokenizer; the target has none "
                                 "(pass token ids instead)")
            toks = list(target.tokenizer(prompt)["input_ids"])
        else:
            toks = [int(t) for t in prompt]
        if not toks:
            raise ValueError(f"prompt {i}: empty prompt")
        bad = [t for t in toks if not 0 <= t < target.config.vocab_size]
        if bad:
            raise ValueError(f"prompt {i}: token ids {bad[:5]} outside [0, {target.config.vocab_size})")
        ids.append(toks)
    return ids


def stop_token_ids(target: Target, extra: Sequence[int] = ()) -> tuple[int, ...]:
    """The config's EOS ids, the tokenizer's EOS id and `extra`, deduplicated."""
    ids = list(target.config.eos_token_ids) + [int(t) for t in extra]
    tok = target.tokenizer
    if tok is not None and getattr(tok, "eos_token_id", None) is not None:
        ids.append(int(tok.eos_token_id))
    ids = list(dict.fromkeys(ids))
    if len(ids) > MAX_STOP_TOKENS:
        raise ValueError(f"at most {MAX_STOP_TOKENS} stop tokens are supported, got {ids}")
    return tuple(ids)


def per_prompt(value, n: int, name: str) -> list:
    """A setting given once or per prompt -> one value per prompt."""
    if isinstance(value, (int, float)):
        return [value] * n
    value = list(value)
    if len(value) != n:
        raise ValueError(f"{name}: got {len(value)} values for {n} prompts")
    return value


def make_requests(target: Target, prompts: Sequence[str | Sequence[int]], *, max_new_tokens, temperature,
                  key_index: Sequence[int] | None, limit: int) -> list[Request]:
    """The call's requests, checked: budgets >= 1, prompt + budget within the cache `limit`;
    key_index defaults to the prompts' positions."""
    ids = encode_prompts(target, prompts)
    budget = per_prompt(max_new_tokens, len(ids), "max_new_tokens")
    temps = per_prompt(temperature, len(ids), "temperature")
    key_ids = list(range(len(ids))) if key_index is None else [int(k) for k in key_index]
    if len(key_ids) != len(ids):
        raise ValueError(f"key_index: got {len(key_ids)} values for {len(ids)} prompts")
    for i, toks in enumerate(ids):
        if budget[i] < 1:
            raise ValueError(f"prompt {i}: max_new_tokens must be >= 1, got {budget[i]}")
        if len(toks) + budget[i] > limit:
            raise ValueError(f"prompt {i}: {len(toks)} prompt tokens + max_new_tokens={budget[i]} "
                             f"exceed the cache limit of {limit} tokens")
    return [Request(i, ids[i], budget[i], temps[i], key_ids[i]) for i in range(len(ids))]
