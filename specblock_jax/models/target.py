"""The `Target` bundle (config, graphdef, params, tokenizer) and the no-cache `forward`."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specblock_jax.models.config import ModelConfig
from specblock_jax.models.transformer import Transformer, apply, causal_mask, positions_from_valid


@dataclasses.dataclass(frozen=True)
class Target:
    """A target model: `graphdef` is static under jit, `params` a nested dict of arrays."""

    config: ModelConfig
    graphdef: nnx.GraphDef
    params: dict
    tokenizer: Any = None  # a transformers tokenizer, or None

    def replace(self, **changes) -> "Target":
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        """One line: family, sizes, parameter count and dtype (not the weights, not the graph)."""
        c = self.config
        leaves = jax.tree.leaves(self.params)
        dtype = str(leaves[0].dtype) if leaves else c.dtype
        return (f"Target({c.family}, {c.num_layers} layers, hidden {c.hidden_size}, heads {c.num_heads}/"
                f"{c.num_kv_heads} kv, vocab {c.vocab_size}, {count_params(self.params) / 1e6:.1f}M params, {dtype}, "
                f"tokenizer {'yes' if self.tokenizer is not None else 'none'})")

    def with_attention(self, attention: str) -> "Target":
        """The same weights with another cache-attention path: "bucketed" (the default; its cost
        follows the sequence length), "full" (always the whole static cache) or "cascade" (the
        committed prefix and the new tokens apart, merged by log-sum-exp), models/attention.py."""
        cfg = self.config.replace(attention=attention)
        return self.replace(config=cfg, graphdef=abstract_target(cfg)[0])


def abstract_target(cfg: ModelConfig) -> tuple[nnx.GraphDef, dict]:
    """(graphdef, params of jax.ShapeDtypeStruct) without allocating anything."""
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    return graphdef, nnx.to_pure_dict(state)


def init_target(cfg: ModelConfig, seed: int = 0, tokenizer: Any = None) -> Target:
    """A randomly initialised target (normal(0, 0.02) weights, unit norms), as HF initialises."""
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed)))
    return Target(cfg, graphdef, nnx.to_pure_dict(state), tokenizer)


def count_params(params: dict) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


@functools.partial(jax.jit, static_argnames=("graphdef", "hidden_ids"))
def _forward(graphdef, params, tokens, valid, positions, hidden_ids):
    b, t = tokens.shape
    out = apply(graphdef, params, tokens, positions, causal_mask(b, t, valid), hidden_ids=hidden_ids)
    return out.logits, out.hidden


def forward(
    target: Target,
    token_ids,
    attention_mask=None,
    positions=None,
    hidden_ids: tuple[int, ...] = (),
):
    """Causal forward without a cache (for checks and training).

    token_ids [B, T]; attention_mask [B, T] (1 = real token, 0 = padding, left or right) or None;
    positions [B, T] RoPE positions, default cumsum(attention_mask) - 1 (as HF `generate`).
    Returns logits [B, T, V] fp32, or (logits, hidden [B, T, n, H]) when hidden_ids is given
    (HF `hidden_states` indexing, see `apply`).
    """
    tokens = jnp.asarray(token_ids, jnp.int32)
    if tokens.ndim != 2:
        raise ValueError(f"token_ids must be [batch, length], got shape {tokens.shape}")
    if int(tokens.max()) >= target.config.vocab_size or int(tokens.min()) < 0:
        raise ValueError(f"token ids must lie in [0, {target.config.vocab_size})")
    valid = jnp.ones_like(tokens) if attention_mask is None else jnp.asarray(attention_mask, jnp.int32)
    pos = positions_from_valid(valid) if positions is None else jnp.asarray(positions, jnp.int32)
    logits, hidden = _forward(target.graphdef, target.params, tokens, valid, pos, tuple(hidden_ids))
    return (logits, hidden) if hidden_ids else logits
