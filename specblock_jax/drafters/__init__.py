"""Drafters: each proposes static-shape draft trees for the target to verify.

`registry` maps a kind name (a drafter folder's "kind") to everything the framework asks of the
kind; a kind is one package (`eagle3/`, `specblock/`, `dflash/`, `blockpilot/`, `prompt_lookup/`)
with one `register(DrafterKind(...))` call (docs/architecture.md, "Adding a drafter kind").
"""

from specblock_jax.drafters import registry
from specblock_jax.drafters.base import DraftContext, Drafter, LoadedDrafter, Prefill
from specblock_jax.drafters.common import bucket_of
from specblock_jax.drafters.registry import DrafterKind, register
