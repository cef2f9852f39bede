"""Drafters: each proposes static-shape draft trees for the target to verify.

`registry` maps a kind name (a drafter folder's "kind") to its loader, training task and
adaptation objective; a new kind is one module and one `register(DrafterKind(...))` call.
"""

from specblock_jax.drafters import registry
from specblock_jax.drafters.base import DraftContext, Drafter, LoadedDrafter, Prefill
from specblock_jax.drafters.prompt_lookup._model import PromptLookup
from specblock_jax.drafters.registry import DrafterKind, register
