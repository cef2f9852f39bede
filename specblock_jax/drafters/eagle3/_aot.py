"""EAGLE-3 as released, for ahead-of-time pricing (specblock_jax/aot): one decoder layer at the
target's widths, a 32,000-token draft vocabulary (d2t/t2d), features {2, L/2, L-3}; decoding: the
shipped tree (assets/drafters/eagle3: 16 nodes, top-k 4, depth 5); training: 7 TTT steps."""

from __future__ import annotations

from specblock_jax.drafters import draft_vocab
from specblock_jax.drafters.eagle3._model import Eagle3Config, Eagle3Drafter, Eagle3Model
from specblock_jax.drafters.registry import AotPreset

DRAFT_VOCAB = 32000  # the released draft vocabulary
TTT_STEPS = 7  # the released training's test-time-training steps


def released(cfg) -> Eagle3Config:
    return Eagle3Config.for_target(cfg, draft_vocab_size=min(DRAFT_VOCAB, cfg.vocab_size))


def train_settings(drafter: Eagle3Drafter, folder) -> dict:
    c = drafter.config
    return {"feature_layers": tuple(c.feature_layers), **draft_vocab.placeholder_settings(c, folder),
            "ttt_steps": TTT_STEPS}


PRESET = AotPreset(Eagle3Drafter, "num_nodes", Eagle3Config, Eagle3Model, released,
                   decoding={"num_nodes": 16, "top_k": 4, "depth": 5}, priced_settings=("top_k", "depth"),
                   train_settings=train_settings)
