"""Prompt lookup (n-gram) drafting: the training-free baseline.

Find an earlier occurrence of the last n committed tokens (n from max_ngram down to min_ngram) in
prompt + output and propose the tokens that followed it, as a chain: the most recent occurrence
that is followed by a full proposal (num_nodes - 1 tokens), else the most recent one.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from specblock_jax.drafters.base import DraftContext, Prefill
from specblock_jax.trees.tree import DraftTree, chain_parents
from specblock_jax.trees.verify import VerifyResult


@dataclasses.dataclass(frozen=True)
class PromptLookup:
    kind: ClassVar[str] = "prompt_lookup"
    num_nodes: int = 8  # root + up to 7 proposed tokens
    max_ngram: int = 3
    min_ngram: int = 1
    max_children: int = 1
    hidden_ids: tuple[int, ...] = ()
    sizing: str = "fixed"  # "auto": step sizing (decoding/sizing.py); "fixed": always num_nodes

    forwards_per_step = property(lambda self: 0)  # no network forwards

    def init_state(self, params, prefill: Prefill, max_len: int):
        return ()

    def continuation_start(self, history: jax.Array, hist_len: jax.Array) -> jax.Array:
        """[B] index in history where the proposal starts, or -1 when no n-gram matches."""
        b, s = history.shape
        full_len = self.num_nodes - 1
        start = jnp.full((b,), -1, jnp.int32)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if n >= s:
                continue
            idx = hist_len[:, None] - n + jnp.arange(n)[None, :]
            suffix = jnp.take_along_axis(history, jnp.maximum(idx, 0), axis=1)  # [B, n]
            m = s - n  # candidate window starts 0 .. m - 1
            match = jnp.ones((b, m), bool)
            for k in range(n):
                match = match & (history[:, k:k + m] == suffix[:, k:k + 1])
            i = jnp.arange(m)[None, :]
            match = match & (i + n < hist_len[:, None]) & (hist_len[:, None] > n)  # not the suffix itself
            full = match & (i + n + full_len <= hist_len[:, None])
            pick = jnp.where(jnp.any(full, axis=1, keepdims=True), full, match)
            latest = m - 1 - jnp.argmax(pick[:, ::-1], axis=1)
            found = jnp.any(match, axis=1)
            start = jnp.where((start < 0) & found, latest + n, start)
        return start

    def propose(self, params, state, ctx: DraftContext, key):
        b = ctx.history.shape[0]
        k = self.num_nodes - 1
        start = self.continuation_start(ctx.history, ctx.hist_len)
        pos = start[:, None] + jnp.arange(k)[None, :]
        cont = jnp.take_along_axis(ctx.history, jnp.clip(pos, 0, ctx.history.shape[1] - 1), axis=1)
        ok = (start[:, None] >= 0) & (pos < ctx.hist_len[:, None])
        tokens = jnp.concatenate([ctx.root[:, None], jnp.where(ok, cont, 0)], axis=1)
        valid = jnp.concatenate([jnp.ones((b, 1), bool), ok], axis=1)
        return DraftTree(tokens.astype(jnp.int32), chain_parents(b, self.num_nodes), valid), state

    def update(self, params, state, ctx: DraftContext, result: VerifyResult, hidden):
        return state
