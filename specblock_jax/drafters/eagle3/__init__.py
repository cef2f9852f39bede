"""EAGLE-3-style drafter: one decoder layer over [token embedding; fused target hidden states of 3
layers], an EAGLE-2 dynamic top-k tree, training-time test over several steps.

The kind "eagle3": `_model.py` (model, decoding drafter, loader), `_train.py` (training task and
serving-time adaptation objective), `_formats.py` (the engines' layouts "eagle3" and
"speculators"), `_aot.py` (the released drafter, for ahead-of-time pricing)."""

from specblock_jax.drafters.eagle3 import _aot, _formats
from specblock_jax.drafters.eagle3._model import Eagle3Config, Eagle3Drafter, Eagle3Model, load_eagle3
from specblock_jax.drafters.eagle3._train import Eagle3Task, Eagle3TrainConfig, eagle3_objective
from specblock_jax.drafters.registry import DrafterKind, register

KIND = register(DrafterKind(Eagle3Drafter.kind, load=load_eagle3, task=Eagle3Task, objective=eagle3_objective,
                            budget_knob="num_nodes", grid={"num_nodes": (8, 16, 32), "depth": (3, 5, 7)},
                            formats=_formats.FORMATS, aot=_aot.PRESET, legacy_names=("Eagle3Drafter",)))
