"""BlockPilot: a policy MLP on the target's next-token distribution after prefill picks each
request's DFlash block size.

The kind "blockpilot": `_model.py` (features, policy, the drafter with per-row sizes, loader, pairing check), `_train.py`
(the policy's training task), `_labels.py` (per-request labels from measured tables), `_command.py`
(the flags of its training command), `_released.py` (the public `model.pt` layout), `_convert.py`
(`specblock-convert blockpilot`). It drives a DFlash drafter, and is priced ahead of time as that
drafter (a request's step is its DFlash step). Its training decodes (labels per block size), so
it is a command of its own: `specblock-train blockpilot` runs `_command.main`. A bench method's
`:oracle=LABELS_DIR` gives each request its label's best size (`_labels.oracle_drafter`)."""

from specblock_jax.drafters.blockpilot import _convert
from specblock_jax.drafters.blockpilot._command import (apply_config, label_dflash, label_source, main, parsers,
                                                        summarise, training_block_size, write_labels)
from specblock_jax.drafters.blockpilot._labels import oracle_drafter, oracle_labels, oracle_table, read_labels
from specblock_jax.drafters.blockpilot._model import (BlockPilotDrafter, PolicyConfig, choose, features,
                                                      init_policy, load_blockpilot, save_blockpilot)
from specblock_jax.drafters.blockpilot._train import BlockPilotTask, BlockPilotTrainConfig, PolicyData, prefill_features
from specblock_jax.drafters.dflash import KIND as DFLASH
from specblock_jax.drafters.registry import DrafterKind, register

KIND = register(DrafterKind(BlockPilotDrafter.kind, load=load_blockpilot, task=BlockPilotTask, aot=DFLASH.aot,
                            convert=_convert.CONVERTER,
                            train_command=main, method_settings={"oracle": oracle_drafter}))
