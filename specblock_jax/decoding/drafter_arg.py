"""What `generate` accepts as a drafter, resolved to a (Drafter, params) pair, and its kind."""

from __future__ import annotations

from typing import Any

from specblock_jax.drafters.prompt_lookup import PromptLookup


def drafter_kind(drafter) -> str:
    """The registry kind of a drafter ("prompt_lookup" for `PromptLookup`)."""
    if isinstance(drafter, PromptLookup):
        return "prompt_lookup"
    return str(getattr(type(drafter), "kind", type(drafter).__name__))


def resolve_drafter(drafter: Any) -> tuple[Any, Any] | None:
    """None | "ar" -> None (autoregressive); "prompt_lookup" | a Drafter | (Drafter, params)
    -> (drafter, params)."""
    if drafter is None or drafter == "ar":
        return None
    if drafter == "prompt_lookup":
        return PromptLookup(), ()
    if isinstance(drafter, tuple) and len(drafter) == 2:
        return drafter
    if hasattr(drafter, "propose"):
        return drafter, ()
    raise ValueError(f"unknown drafter {drafter!r}: use None, 'ar', 'prompt_lookup', a Drafter "
                     "or a (Drafter, params) pair")
