"""Training objectives for serving-time adaptation, one per drafter kind.

An objective scores a drafter on served sequences with the loss its kind trains on offline, with
the verifier's committed tokens as labels and the target's hidden states collected by the decode
loop as features (no target forward). It also returns a proxy of the acceptance length that the
controller uses to compare parameters (before / after an update) on the same fresh data:

    objective(drafter, params, hidden, tokens, loss_mask, valid, key, depth) -> (loss, tau_proxy)

params: the drafter's full decoding params (e.g. {"draft", "embed"}); hidden [B, T, n, H];
tokens/loss_mask/valid [B, T] int32 (loss_mask[i] = 1: the prediction made at position i, of token
i + 1, is scored); depth: how far ahead the loss drafts (EAGLE-3 training-time-test steps,
SpecBlock blocks; 0 = the kind's default), the main lever on an update's cost. Each kind names
its objective in its drafter registry entry (`specblock_jax.drafters.registry`); the objectives
build on the loss pieces of `specblock_jax.training.losses` (`label_logits`, `chain_tau`).
"""

from __future__ import annotations

from typing import Any, Callable

import jax

from specblock_jax.drafters import registry

Objective = Callable[..., tuple[jax.Array, jax.Array]]


def objective_for(drafter: Any) -> Objective:
    """The registered objective of `drafter`'s kind; a clear error for a kind that cannot adapt."""
    kind = registry.kind_of(drafter)
    if kind.objective is None:
        adaptable = [k for k in registry.kinds() if registry.get(k).objective is not None]
        raise ValueError(f"drafter kind {kind.name} cannot adapt at serving time (no registered "
                         f"objective; adaptable kinds: {adaptable})")
    return kind.objective
