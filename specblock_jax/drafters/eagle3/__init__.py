"""EAGLE-3-style drafter: one decoder layer over [token embedding; fused target hidden states of 3
layers], an EAGLE-2 dynamic top-k tree, training-time test over several steps.

The kind "eagle3": `_model.py` (model, decoding drafter, loader), `_train.py` (training task and
serving-time adaptation objective), `_formats.py` (the engines' layouts "eagle3" and
"speculators"), `_aot.py` (the released drafter, for ahead-of-time pricing)."""

from specblock_jax.drafters.eagle3 import _aot, _formats
from specblock_jax.drafters.eagle3._model import Eagle3Config, Eagle3Drafter, Eagle3Model, load_eagle3
from specblock_jax.drafters.eagle3._train import Eagle3Task, Eagle3TrainConfig, eagle3_objective
from specblock_jax.drafters.registry import DrafterKind, register

# The EAGLE-3 paper's baseline tree (SafeAILab/EAGLE: depth 7, top-k 10, total_token 60): EAGLE's
# depth counts the expansions after the first forward, ours counts draft levels (one forward each,
# the first fused with the update), so its 8 forwards a step are depth 8 here; 60 drafted tokens
# and the root are 61 nodes.
PAPER_TREE = {"depth": 8, "top_k": 10, "num_nodes": 61}

KIND = register(DrafterKind(Eagle3Drafter.kind, load=load_eagle3, task=Eagle3Task, objective=eagle3_objective,
                            budget_knob="num_nodes", grid={"num_nodes": (8, 16, 32), "depth": (3, 5, 7)},
                            formats=_formats.FORMATS, aot=_aot.PRESET,
                            presets={"paper": PAPER_TREE}))
