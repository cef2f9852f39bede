"""The one trainer (targets, drafter kinds, BlockPilot's policy): resumable, sharded, evaluated by
decoding (tau on held-out prompts); and the target's own training task."""

from specblock_jax.trainer.trainer import TRAINER_DEFAULTS, train
