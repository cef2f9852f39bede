"""What one `generate` call decodes: its requests and the settings they share, and the static
shapes they compile to (prompt length buckets, cache lengths).

Prompts are right-padded to a length bucket and a batch to a fixed size, so a job with many
prompts compiles once per (batch, prompt bucket, largest max_new_tokens, method).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

from specblock_jax import checks
from specblock_jax.decoding.options import DecodeOptions
from specblock_jax.decoding.sampling import Sampling
from specblock_jax.models.target import Target
from specblock_jax.prompts import prompt_ids

MAX_STOP_TOKENS = 8


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
class JobSettings:
    """What every request of one call shares, as the decoding functions read it (built by
    `prepare` from the call's `Sampling`, seed and `DecodeOptions`, which check the values)."""

    top_k: int = 0  # the call's Sampling.top_k
    top_p: float = 1.0  # the call's Sampling.top_p
    seed: int = 0  # base of every request's PRNG stream
    stop_ids: tuple[int, ...] = ()  # every stop token (`stop_token_ids`)
    batch_size: int | None = None  # the rest as `DecodeOptions` has them
    mesh: Any = None
    profile: str = "off"
    refill: bool | None = None
    refill_rows: int = 1
    queue: int = 0


def held(waiting: Sequence, in_flight: int, queue: int) -> list:
    """What a server holding `queue` waiting requests knows of a call's unserved requests
    `waiting` (serving order, the `in_flight` rows first): the first in_flight + queue; all of
    them for queue 0."""
    return list(waiting) if queue == 0 else list(waiting[:in_flight + queue])


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


def prompt_list(prompts) -> list:
    """The call's prompts as a list: a bare string is one prompt; a sequence of strings or of
    token-id sequences is taken as is. TypeError for anything else."""
    if isinstance(prompts, str):
        return [prompts]
    if not isinstance(prompts, Sequence) or isinstance(prompts, (bytes, dict)):
        raise TypeError(f"prompts: expected a string or a list of strings or token-id lists "
                        f"(got {type(prompts).__name__})")
    return list(prompts)


def prepare(target: Target, prompts, *, sampling: Sampling, max_new_tokens, seed: int,
            options: DecodeOptions) -> tuple[list[Request], JobSettings]:
    """The checked requests of one call and the settings they share: the front door's one
    validation of prompts, budgets and keys (`Sampling` and `DecodeOptions` check themselves)."""
    if not isinstance(sampling, Sampling):
        raise TypeError(f"sampling: expected a Sampling (got {type(sampling).__name__})")
    if not isinstance(options, DecodeOptions):
        raise TypeError(f"options: expected a DecodeOptions (got {type(options).__name__})")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: must be an integer (got {seed!r})")
    prompts = prompt_list(prompts)
    limit = options.max_cache_len or target.config.max_position_embeddings
    requests = make_requests(target, prompts, max_new_tokens=max_new_tokens, temperature=sampling.temperature,
                             key_index=options.key_index, limit=limit)
    job = JobSettings(top_k=sampling.top_k, top_p=sampling.top_p, seed=seed,
                      stop_ids=stop_token_ids(target, options.stop_tokens), batch_size=options.batch_size,
                      mesh=options.mesh, profile=options.profile, refill=options.refill,
                      refill_rows=options.refill_rows, queue=options.queue)
    return requests, job


def make_requests(target: Target, prompts: Sequence[str | Sequence[int]], *, max_new_tokens, temperature,
                  key_index: Sequence[int] | None, limit: int) -> list[Request]:
    """The call's requests, checked (`prompt_ids`: the one check `specblock-decode` also makes):
    no empty prompt, budgets >= 1, prompt + budget within the cache `limit`; ValueError naming the
    prompt's index otherwise. key_index defaults to the prompts' positions."""
    budget = per_prompt(max_new_tokens, len(prompts), "max_new_tokens")
    temps = per_prompt(temperature, len(prompts), "temperature")
    key_ids = list(range(len(prompts))) if key_index is None else [int(k) for k in key_index]
    if len(key_ids) != len(prompts):
        raise ValueError(f"key_index: got {len(key_ids)} values for {len(prompts)} prompts")
    ids = []
    for i, prompt in enumerate(prompts):
        try:  # (temperatures were checked by `Sampling`)
            checks.max_new_tokens(budget[i])
            ids.append(prompt_ids(target, prompt, budget[i], limit))
        except ValueError as e:
            raise ValueError(f"prompt {i}: {e}") from None
    return [Request(i, ids[i], budget[i], temps[i], key_ids[i]) for i in range(len(ids))]
