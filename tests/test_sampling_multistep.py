"""Multi-step speculative sampling is lossless: after several speculative steps (deep tree paths
accepted and the target's cache compacted at every step) the generated tokens follow the
target-only sampling distribution. Two empirical samples are compared (no reference verifier)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import specblock_jax as sbj
from specblock_jax.decoding import SamplingParams, ar_loop, spec_loop
from specblock_jax.trees import DraftTree

V, PROMPT, MAX_NEW, DRAWS = 8, [1, 2, 3], 10, 4000
COMPARED = slice(7, 10)  # the joint of generated tokens 7..9: committed by a 3rd or later step
BUCKET, CACHE_LEN = 16, 64


@dataclasses.dataclass(frozen=True)
class BigramTreeDrafter:
    """A deterministic binary tree of depth 3 (8 nodes) from a table params [V, 2]: the two tokens
    proposed after each token. Node j's parent is PARENTS[j]; it takes its parent's RANK[j]-th
    proposal, so every node has two children but node 3 (one) and the leaves."""

    PARENTS: tuple[int, ...] = (-1, 0, 0, 1, 1, 2, 2, 3)
    RANK: tuple[int, ...] = (0, 0, 1, 0, 1, 0, 1, 0)
    num_nodes: int = 8
    max_children: int = 2
    hidden_ids: tuple[int, ...] = ()
    forwards_per_step = 0

    def init_state(self, params, prefill, max_len):
        return ()

    def propose(self, params, state, ctx, key):
        tokens = [ctx.root]
        for parent, rank in zip(self.PARENTS[1:], self.RANK[1:]):
            tokens.append(params[tokens[parent], rank])
        b = ctx.root.shape[0]
        parents = jnp.broadcast_to(jnp.asarray(self.PARENTS, jnp.int32), (b, self.num_nodes))
        return DraftTree(jnp.stack(tokens, 1).astype(jnp.int32), parents, jnp.ones((b, self.num_nodes), bool)), state

    def update(self, params, state, ctx, result, hidden):
        return state


@pytest.fixture(scope="module")
def target():
    """A tiny target over 8 tokens with a clearly non-uniform next-token distribution."""
    t = sbj.init_target(sbj.models.config.tiny(vocab_size=V, eos_token_ids=()), seed=5)
    params = dict(t.params)
    params["lm_head"] = params["lm_head"] * 15.0
    return t.replace(params=params)


@pytest.fixture(scope="module")
def bigram_table(target):
    """[V, 2]: the target's two likeliest tokens after PROMPT + [a], for every a."""
    logits = sbj.forward(target, [PROMPT + [a] for a in range(V)])[:, -1]
    return jnp.argsort(-logits, axis=-1)[:, :2].astype(jnp.int32)


_ar = jax.jit(ar_loop, static_argnums=(0, 1, 2, 3))
_spec = jax.jit(spec_loop, static_argnums=tuple(range(7)))


def _decode(target, drafter, drafter_params, temperature, seed):
    """DRAWS independent samples of MAX_NEW tokens after PROMPT (one PRNG key per row): tokens
    [DRAWS, MAX_NEW] and the target's decoding forwards per row [DRAWS]."""
    tokens = jnp.zeros((DRAWS, BUCKET), jnp.int32).at[:, :len(PROMPT)].set(jnp.asarray(PROMPT))
    args = (tokens, jnp.full((DRAWS,), len(PROMPT), jnp.int32), jnp.full((DRAWS,), MAX_NEW, jnp.int32),
            SamplingParams.make(DRAWS, temperature), jnp.full((8,), -1, jnp.int32),
            jax.random.split(jax.random.key(seed), DRAWS))
    if drafter is None:
        out = _ar(target.graphdef, target.config, CACHE_LEN, MAX_NEW, target.params, *args)
    else:
        out = _spec(target.graphdef, target.config, drafter, CACHE_LEN, MAX_NEW, False, False, target.params,
                    drafter_params, *args)
    assert (np.asarray(out.generated) == MAX_NEW).all()
    return np.asarray(out.tokens)[:, :MAX_NEW], np.asarray(out.forwards)


def _joint_counts(tokens):
    cells = np.ravel_multi_index(tuple(tokens[:, COMPARED].T), (V,) * tokens[:, COMPARED].shape[1])
    return np.bincount(cells, minlength=V ** tokens[:, COMPARED].shape[1])


def _two_sample_pvalue(a, b):
    """Chi-square test that two count vectors come from one distribution; cells with fewer than 10
    draws in both samples together are pooled into one cell."""
    rare = a + b < 10
    table = np.stack([np.append(a[~rare], a[rare].sum()), np.append(b[~rare], b[rare].sum())])
    table = table[:, table.sum(0) > 0]
    return stats.chi2_contingency(table, correction=False).pvalue


def test_multistep_speculative_sampling_follows_the_target_distribution(target, bigram_table):
    drafter = BigramTreeDrafter()
    ar_tokens, _ = _decode(target, None, None, 1.0, seed=1)
    spec_tokens, forwards = _decode(target, drafter, bigram_table, 1.0, seed=2)
    # several speculative steps, and deep paths accepted: 9 tokens after the prefill's in at most
    # 9 forwards; a mean above 2 tokens per forward needs paths of depth >= 2 (the tree has depth 3)
    assert forwards.mean() >= 3 and (MAX_NEW - 1) / forwards.mean() > 2.0
    ar_counts = _joint_counts(ar_tokens)
    assert (ar_counts >= 10).sum() >= 20  # a distribution with many cells, not a near-point mass
    # H0 (lossless) holds, so a p-value below 1e-3 would happen 1 time in 1000: a real failure
    assert _two_sample_pvalue(ar_counts, _joint_counts(spec_tokens)) > 1e-3
    # power: the same test tells speculative sampling at a wrong temperature from the target's
    wrong, _ = _decode(target, drafter, bigram_table, 0.5, seed=3)
    assert _two_sample_pvalue(ar_counts, _joint_counts(wrong)) < 1e-6
