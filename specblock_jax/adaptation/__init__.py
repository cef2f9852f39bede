"""Cost-aware serving-time adaptation of drafters from verifier feedback (see adapter.py)."""

from specblock_jax.adaptation.adapter import AdaptConfig, Adapter
from specblock_jax.adaptation.controller import CostAwareController, Decision

__all__ = ["AdaptConfig", "Adapter", "CostAwareController", "Decision"]
