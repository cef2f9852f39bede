"""What `generate` accepts as a drafter, resolved to a `LoadedDrafter`, and its kind."""

from __future__ import annotations

from typing import Any

from specblock_jax.drafters.base import LoadedDrafter
from specblock_jax.drafters.prompt_lookup import PromptLookup


def drafter_kind(drafter) -> str:
    """The registry kind of a drafter ("prompt_lookup" for `PromptLookup`)."""
    if isinstance(drafter, PromptLookup):
        return "prompt_lookup"
    return str(getattr(type(drafter), "kind", type(drafter).__name__))


def resolve_drafter(drafter: Any) -> LoadedDrafter | None:
    """None | "ar" -> None (autoregressive); "prompt_lookup" | a Drafter (no weights) | a
    LoadedDrafter -> a LoadedDrafter."""
    if drafter is None or drafter == "ar":
        return None
    if drafter == "prompt_lookup":
        return LoadedDrafter(PromptLookup(), ())
    if isinstance(drafter, LoadedDrafter):
        return drafter
    if isinstance(drafter, tuple):
        raise ValueError("a drafter with its weights is a LoadedDrafter(drafter, params) "
                         "(`load_drafter` returns one), not a plain tuple")
    if hasattr(drafter, "propose"):
        return LoadedDrafter(drafter, ())
    raise ValueError(f"unknown drafter {drafter!r}: use None, 'ar', 'prompt_lookup', a Drafter "
                     "or a LoadedDrafter")
