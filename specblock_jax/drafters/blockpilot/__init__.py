"""BlockPilot: a policy MLP on the target's next-token distribution after prefill picks each
request's DFlash block size.

The kind "blockpilot": `_model.py` (features, policy, routing drafter, loader), `_train.py`
(the policy's training task), `_labels.py` (per-request labels from measured tables),
`_released.py` (the public `model.pt` layout)."""

from specblock_jax.drafters.blockpilot._model import (BlockPilotDrafter, PolicyConfig, choose, features,
                                                      init_policy, load_blockpilot, save_blockpilot)
from specblock_jax.drafters.blockpilot._train import BlockPilotTask, BlockPilotTrainConfig
from specblock_jax.drafters.registry import DrafterKind, register

KIND = register(DrafterKind("blockpilot", load=load_blockpilot, task=BlockPilotTask))
