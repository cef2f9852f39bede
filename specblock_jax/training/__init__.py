"""Training: drafter training data (target regeneration as a TFDS dataset, batch iterator)."""

from specblock_jax.training.regen_dataset import (
    BatchIterator,
    RegenDataset,
    build_tfds,
    pack_example,
    read_records,
)

__all__ = ["BatchIterator", "RegenDataset", "build_tfds", "pack_example", "read_records"]
