"""Drafters: each proposes static-shape draft trees for the target to verify."""

from specblock_jax.drafters.base import DraftContext, Drafter, Prefill
from specblock_jax.drafters.prompt_lookup import PromptLookup
