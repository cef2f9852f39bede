"""The target's sampling distribution: temperature, top-k and top-p, applied per sequence.

The same `sampling_logprobs` serves autoregressive and speculative decoding, so both sample from
exactly one distribution. Settings are arrays (one value per sequence), never Python ints, so new
values do not recompile. temperature 0 means greedy (argmax).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp

from specblock_jax import checks


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How `generate` draws new tokens. Temperature 0 is greedy (the target's argmax, token-identical
    to target-only decoding with any drafter); above 0 every method samples the target's exact
    distribution (speculative decoding by rejection sampling)."""

    temperature: float | tuple[float, ...] = 0.0
    """One temperature for every prompt, or one per prompt (a sequence as long as the prompts)."""
    top_k: int = 0
    """Keep the k most likely tokens (0: all)."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens whose probability reaches p (1: all)."""

    def __post_init__(self):
        try:
            temps = self.temperature
            if isinstance(temps, Sequence) and not isinstance(temps, str):
                object.__setattr__(self, "temperature", tuple(
                    checks.temperature(t, f"temperature[{i}]") for i, t in enumerate(temps)))
            else:
                object.__setattr__(self, "temperature", checks.temperature(temps))
            checks.top_k(self.top_k)
            checks.top_p(self.top_p)
        except ValueError as e:
            raise ValueError(f"sampling: {e}") from None


GREEDY = Sampling()


class SamplingParams(NamedTuple):
    temperature: jax.Array  # [B] float32, 0 = greedy
    top_k: jax.Array  # [B] int32, 0 = off
    top_p: jax.Array  # [B] float32, 1 = off

    @classmethod
    def make(cls, batch: int, temperature=0.0, top_k=0, top_p=1.0) -> "SamplingParams":
        def arr(x, dtype):
            return jnp.broadcast_to(jnp.asarray(x, dtype), (batch,))

        return cls(arr(temperature, jnp.float32), arr(top_k, jnp.int32), arr(top_p, jnp.float32))


def _per_row(x: jax.Array, ndim: int) -> jax.Array:
    return x.reshape(x.shape + (1,) * (ndim - 1))


def sampling_logprobs(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """Log-probabilities of the sampling distribution, [B, ..., V] -> [B, ..., V] fp32.

    Order as in HF: temperature, then top-k, then top-p (the smallest set of most likely tokens
    whose mass reaches p; tokens tied with its last member are kept too). Rows with temperature 0
    get a one-hot distribution on the argmax (log 0 = -inf elsewhere).
    """
    logits = logits.astype(jnp.float32)
    nd = logits.ndim
    temp = _per_row(params.temperature, nd)
    greedy = temp <= 0
    scaled = logits / jnp.where(greedy, 1.0, temp)
    vocab = logits.shape[-1]

    def filtered(scaled):
        desc = -jnp.sort(-scaled, axis=-1)  # descending
        k = _per_row(jnp.where(params.top_k > 0, jnp.minimum(params.top_k, vocab), vocab), nd)
        kth = jnp.take_along_axis(desc, jnp.broadcast_to(k - 1, desc.shape[:-1] + (1,)), axis=-1)
        scaled = jnp.where(scaled >= kth, scaled, -jnp.inf)
        desc = jnp.where(desc >= kth, desc, -jnp.inf)
        probs_desc = jax.nn.softmax(desc, axis=-1)
        mass_before = jnp.cumsum(probs_desc, axis=-1) - probs_desc
        keep_desc = mass_before < _per_row(params.top_p, nd)  # always keeps the first token
        threshold = jnp.min(jnp.where(keep_desc, desc, jnp.inf), axis=-1, keepdims=True)
        return jax.nn.log_softmax(jnp.where(scaled >= threshold, scaled, -jnp.inf), axis=-1)

    # a full-vocabulary sort costs ~1.5 ms per row on CPU: run it only when some row filters
    needs_filter = jnp.any(params.top_k > 0) | jnp.any(params.top_p < 1)
    logp = jax.lax.cond(needs_filter, filtered, lambda x: jax.nn.log_softmax(x, axis=-1), scaled)
    onehot = jnp.where(
        jax.nn.one_hot(jnp.argmax(logits, axis=-1), vocab, dtype=bool), 0.0, -jnp.inf
    )
    return jnp.where(greedy, onehot, logp)


def sample(keys: jax.Array, logits: jax.Array, params: SamplingParams) -> jax.Array:
    """One token per row: keys [B] (one PRNG key per sequence), logits [B, V] -> [B] int32."""
    logp = sampling_logprobs(logits, params)
    drawn = jax.vmap(jax.random.categorical)(keys, logp)
    greedy = params.temperature <= 0
    return jnp.where(greedy, jnp.argmax(logits, axis=-1), drawn).astype(jnp.int32)
