"""DFlash as released, for ahead-of-time pricing (specblock_jax/aot): z-lab's DFlash for Qwen3-8B
(z-lab/Qwen3-8B-DFlash-b16; SpecForge configs/qwen3-8b-dflash.json): 5 layers at the target's
widths, block 16, target_layer_ids evenly from 1 to L-3 ([1, 9, 17, 25, 33] for 36 layers; our HF
hidden_states indices are those + 1); the target's embedding and head."""

from __future__ import annotations

import dataclasses

import jax

from specblock_jax.drafters.dflash._model import DFlashConfig, DFlashDrafter, DFlashModel
from specblock_jax.drafters.registry import AotPreset


def layer_ids(num_layers: int, count: int = 5) -> tuple[int, ...]:
    """z-lab's DFlash feature layers as our HF hidden_states indices: `count` decoder-layer
    outputs evenly spaced from layer 1 to L-3 (z-lab's ids), + 1."""
    last = max(num_layers - 3, 1)
    ids = sorted({1 + round(i * (last - 1) / max(count - 1, 1)) for i in range(count)})
    return tuple(i + 1 for i in ids)


def released(cfg) -> DFlashConfig:
    return DFlashConfig.for_target(cfg, num_layers=5, feature_layers=layer_ids(cfg.num_layers), block_size=16)


def head_param(config: DFlashConfig, target_params: dict) -> dict:
    """The target's head among the decoding params (`load_dflash`): its lm_head, or the tied
    embedding's shape transposed."""
    emb = target_params["embed_tokens"]
    head = target_params.get("lm_head")
    return {"head": head if head is not None else jax.ShapeDtypeStruct(emb.shape[::-1], emb.dtype)}


def train_settings(drafter: DFlashDrafter, folder) -> dict:
    c = drafter.config
    return {"num_layers": c.num_layers, "feature_layers": tuple(c.feature_layers),
            "block_size": c.block_size, "mask_token_id": c.mask_token_id}


def abstract_task(builder, settings: dict, target):
    """The task on an abstract target: it reads the target's head when built, so it is built under
    eval_shape, its head and target then set to the abstract ones."""
    made = {}

    def build(params):
        made["task"] = builder(settings, dataclasses.replace(target, params=params))
        return made["task"].head

    head = jax.eval_shape(build, target.params)
    task = made["task"]
    task.head, task.target = head, target
    return task


PRESET = AotPreset(DFlashDrafter, "block_size", DFlashConfig, DFlashModel, released,
                   decoding={"block_size": 16, "draft_mode": "auto", "draft_temperature": 1.0},
                   extra_params=head_param, train_settings=train_settings, abstract_task=abstract_task)
