"""Static-shape draft trees and lossless verification."""

from specblock_jax.trees.tree import DraftTree, ancestor_mask, chain_parents, child_table, depths, select_tree
from specblock_jax.trees.verify import VerifyResult, verify_greedy, verify_sampling, verify_sampling_with_uniforms
