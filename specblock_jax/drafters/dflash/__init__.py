"""DFlash-style block-diffusion drafter: one forward drafts a block of B - 1 tokens from
[last token, MASK x (B - 1)] with the target's context features injected as keys and values.

The kind "dflash": `_model.py` (model, decoding drafter, loader), `_tree.py` (draft trees from one
forward: the best prefixes of per-offset top-k tokens, `:num_nodes=N`), `_train.py` (training task and
adaptation objective), `_formats.py` (z-lab's released layout "dflash"), `_aot.py` (the released
drafter, for ahead-of-time pricing)."""

from specblock_jax.drafters.dflash import _aot, _formats
from specblock_jax.drafters.dflash._model import DFlashConfig, DFlashDrafter, DFlashModel, load_dflash
from specblock_jax.drafters.dflash._train import DFlashTask, DFlashTrainConfig, dflash_objective
from specblock_jax.drafters.registry import DrafterKind, register


def block_sizes(drafter: DFlashDrafter, knob: str) -> tuple[int, int]:
    """Calibration's block sizes: 2 up to the size the drafter was trained at."""
    return 2, int(drafter.config.block_size)


KIND = register(DrafterKind(DFlashDrafter.kind, load=load_dflash, task=DFlashTask, objective=dflash_objective,
                            budget_knob="block_size", grid={"block_size": (4, 8, 16)}, knob_range=block_sizes,
                            formats=(_formats.RELEASED,), aot=_aot.PRESET))
