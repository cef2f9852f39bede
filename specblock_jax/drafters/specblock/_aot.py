"""SpecBlock as released, for ahead-of-time pricing (specblock_jax/aot): 2 layers, block 4, a
32,000-token draft vocabulary, rank head 256 wide; decoding: the shipped tree
(assets/drafters/specblock; the reference's ~90-node tree is `specblock:num_nodes=90:root_topk=10`);
training: the public recipe's 3 blocks."""

from __future__ import annotations

from specblock_jax.drafters import draft_vocab
from specblock_jax.drafters.registry import AotPreset
from specblock_jax.drafters.specblock._model import SpecBlockConfig, SpecBlockDrafter, SpecBlockModel
from specblock_jax.drafters.specblock._released import RANK_HIDDEN

DRAFT_VOCAB = 32000  # the released draft vocabulary
NUM_BLOCKS = 3  # blocks per training sequence in the public recipe


def released(cfg) -> SpecBlockConfig:
    return SpecBlockConfig.for_target(cfg, num_layers=2, block_size=4, draft_vocab_size=min(DRAFT_VOCAB, cfg.vocab_size),
                                      rank_hidden=RANK_HIDDEN)


def train_settings(drafter: SpecBlockDrafter, folder) -> dict:
    c = drafter.config
    return {"feature_layers": tuple(c.feature_layers), **draft_vocab.placeholder_settings(c, folder),
            "drafter_layers": c.num_layers, "block_size": c.block_size, "rank_hidden": c.rank_hidden,
            "num_blocks": NUM_BLOCKS}


# the shipped drafter's tree (assets/drafters/specblock/config.json "decoding", copied so an
# installed package needs no assets folder)
PRESET = AotPreset(SpecBlockDrafter, "num_nodes", SpecBlockConfig, SpecBlockModel, released,
                   decoding={"num_nodes": 16, "max_blocks": 2, "beam": 1, "slot_topk": (2, 4, 10, 0),
                             "root_topk": 4, "rank_tree": True, "fixed_branch": 2},
                   train_settings=train_settings)
