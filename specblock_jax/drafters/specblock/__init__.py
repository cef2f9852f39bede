"""SpecBlock drafter: block-iterative drafting (K dependent slots a forward, layer-wise shift), a
rank head that sizes the tree per token, valid-prefix curriculum training.

The kind "specblock": `_model.py` (model, decoding drafter, loader), `_train.py` (training task and
adaptation objective), `_released.py` (the public release's layout, "specblock_hf"), `_convert.py`
(`specblock-convert specblock`), `_aot.py` (the released drafter, for ahead-of-time pricing)."""

from specblock_jax.drafters.registry import DrafterKind, ReleasedFormat, register
from specblock_jax.drafters.specblock import _aot, _convert, _released
from specblock_jax.drafters.specblock._model import (SpecBlockConfig, SpecBlockDecoding, SpecBlockDrafter,
                                                     SpecBlockModel, load_specblock)
from specblock_jax.drafters.specblock._train import SpecBlockTask, SpecBlockTrainConfig, specblock_objective

KIND = register(DrafterKind(SpecBlockDrafter.kind, load=load_specblock, task=SpecBlockTask,
                            objective=specblock_objective, budget_knob="num_nodes",
                            grid={"num_nodes": (8, 16, 32), "max_blocks": (2, 3)},
                            formats=(ReleasedFormat(_released.FORMAT, SpecBlockDrafter.kind, _released.is_released,
                                                    _released.import_meta, _released.read_weights,
                                                    _released.export),),
                            aot=_aot.PRESET, convert=_convert.CONVERTER))
