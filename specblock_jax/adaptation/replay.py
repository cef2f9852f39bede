"""Exact paired acceptance: the tau a drafter's weights would have had on sequences already served.

Greedy decoding commits the target's choices, whatever the drafter proposes, so a served sequence
(its tokens and the target's hidden states at the drafter's feature layers, which the decode loop
collects for free) is all the verifier would say again. `replay_tau` runs the drafter's real
`init_state` / `propose` / `update` over such sequences and accepts with the greedy rule against
the committed continuation (`trees.verify.accept_greedy`), with no target forward: it returns,
per sequence, the decoding steps and committed tokens the drafter would have had, so that
tau = committed / steps is the tau greedy decoding with those weights measures on that sequence
(tested against real decoding). Scoring two weight sets on the same sequences gives their exact
paired gain on them.

A sequence is a row of tokens [W] with hidden [W, n, H]: positions [0, start) are the context the
drafter is prefilled with (the prompt), token `start` is the first generated one, and positions
< end are valid. Rows cut by the replay buffer's window start at the window (their context is
what the window kept). Sampled decoding commits draws, not the target's argmax: there the replay
measures how often the drafter's tree holds the sampled continuation, the greedy-rule acceptance
of those tokens; it ranks weight sets on the same rows but is not the sampled tau.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from specblock_jax.decoding.loop_core import step_keys
from specblock_jax.drafters.base import DraftContext, Prefill
from specblock_jax.trees.tree import ancestor_mask, depths
from specblock_jax.trees.verify import accept_greedy


class ReplayState(NamedTuple):
    drafter: Any
    cache_len: jax.Array  # [R] committed tokens before the root (the root's index)
    root: jax.Array  # [R]
    steps: jax.Array  # [R] decoding steps (verification forwards) so far
    committed: jax.Array  # [R] tokens committed by them
    done: jax.Array  # [R]


def replay_tau(drafter, vocab_size: int, params, tokens, hidden, start, end, key=None
               ) -> tuple[jax.Array, jax.Array]:
    """(steps [R], committed [R]) of greedy decoding with `drafter` and `params` over tokens [R, W]
    (hidden [R, W, n, H] at drafter.hidden_ids), generated from index start [R] (>= 1) to end [R]
    (exclusive); vocab_size: the target's. Pure: jit it with drafter and vocab_size static."""
    r, w = tokens.shape
    keys = jax.random.split(jax.random.key(0) if key is None else key, r)  # [R] as the loop's
    rows = jnp.arange(r)[:, None]
    root = tokens[jnp.arange(r), start]
    logits = jax.nn.one_hot(root, vocab_size, dtype=jnp.float32)  # the prefill's argmax is the root
    dstate = drafter.init_state(params, Prefill(tokens, start, hidden, logits, root), w + drafter.num_nodes + 1)

    def body(s: ReplayState) -> ReplayState:
        ctx = DraftContext(tokens, s.cache_len + 1, s.root, s.cache_len)
        tree, dstate = drafter.propose(params, s.drafter, ctx, step_keys(step_keys(keys, s.steps + 1), 1))
        tree = tree._replace(tokens=tree.tokens.at[:, 0].set(s.root), draft_probs=None)
        anc = ancestor_mask(tree.parents)
        at = s.cache_len[:, None] + depths(anc)  # the index of each node's token if it was accepted
        want = jnp.where(at + 1 < end[:, None], tokens[rows, jnp.minimum(at + 1, w - 1)], -1)
        res = accept_greedy(tree, want, anc)
        node_hidden = hidden[rows, jnp.minimum(at, w - 1)]  # right on the accepted path
        take = jnp.where(s.done, 0, jnp.minimum(res.num_accepted + 1, end - 1 - s.cache_len))
        cache_len = s.cache_len + take
        ctx = DraftContext(tokens, cache_len + 1, res.bonus, cache_len)
        dstate = drafter.update(params, dstate, ctx, res, node_hidden)
        return ReplayState(dstate, cache_len, jnp.where(s.done, s.root, res.bonus), s.steps + ~s.done,
                           s.committed + take, s.done | (cache_len + 1 >= end))

    zero = jnp.zeros((r,), jnp.int32)
    state = ReplayState(dstate, start.astype(jnp.int32), root, zero, zero, start + 1 >= end)
    state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
    return state.steps, state.committed


def buffer_spans(valid: jax.Array, loss_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(start [R], end [R]) of replay-buffer rows: `start` the window index of the first generated
    token (>= 1: a window that kept no prompt starts with one token of context), `end` the
    valid length."""
    w = valid.shape[1]
    first = jnp.argmax(loss_mask, axis=1) + 1  # position i is scored when token i + 1 was generated
    first = jnp.where(jnp.any(loss_mask > 0, axis=1), first, w)
    return jnp.maximum(first, 1).astype(jnp.int32), jnp.sum(valid, axis=1).astype(jnp.int32)
