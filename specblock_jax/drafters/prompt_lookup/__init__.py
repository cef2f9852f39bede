"""Prompt lookup (n-gram) drafting, the training-free baseline: the kind "prompt_lookup", with no
weights and no folder (`load_drafter("prompt_lookup", target, num_nodes=6)` builds it)."""

from specblock_jax.drafters.prompt_lookup._model import PromptLookup
from specblock_jax.drafters.registry import AotPreset, DrafterKind, register


def load_prompt_lookup(path, meta, target, dtype, decoding):
    """(PromptLookup with the decoding settings, no params); `path` is None (no folder)."""
    return PromptLookup(**decoding), ()


KIND = register(DrafterKind(PromptLookup.kind, load=load_prompt_lookup, weights=False, budget_knob="num_nodes",
                            grid={"num_nodes": (4, 8, 16)}, aot=AotPreset(PromptLookup, "num_nodes")))
