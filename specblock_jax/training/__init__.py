"""Training: drafter training data (target regeneration as a TFDS dataset, batch iterator) and
the prompt sets cut from source files (`source_prompts`)."""

from specblock_jax.training import source_prompts

from specblock_jax.training.regen_dataset import (
    BatchIterator,
    RegenDataset,
    build_tfds,
    pack_example,
    read_records,
)

__all__ = ["source_prompts", "BatchIterator", "RegenDataset", "build_tfds", "pack_example", "read_records"]
