"""Shared pieces of the sampling-distribution tests (test_speculative.py, test_sampling_multistep.py):
a tiny peaked target, drafters correlated with it, the real sampling verifier and two wrong ones
behind one traced switch, the speculative loop over many independent rows in one call, and
chi-square tests with rare cells pooled.

The wrong verifiers (`VARIANTS`) are plausible bugs in recursive rejection sampling:
- "resample from p": after a rejection the residual is never formed; later siblings are tried
  against p again and the bonus is sampled from p;
- "unnormalised residual": after a rejection the residual max(resid - q, 0) is not divided by its
  mass, so a later sibling x is accepted with min(1, resid(x) / q(x)) from a residual of mass < 1,
  too rarely (the bonus draw itself still normalises).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

import specblock_jax as sbj
from specblock_jax.decoding import DecodeLoop, LoopInputs, SamplingParams, make_loop, sampling_logprobs
from specblock_jax.trees import DraftTree, verify

V = 8  # a tiny vocabulary: distributions can be enumerated
VARIANTS = ("real", "resample from p", "unnormalised residual")


@functools.cache
def peaked_target():
    """A tiny target over V tokens whose logits have a std of about 2.5 instead of 0.16: a clearly
    non-uniform next-token distribution (one per process: its loops compile once)."""
    target = sbj.init_target(sbj.models.config.tiny(vocab_size=V, eos_token_ids=()), seed=5)
    params = dict(target.params)
    params["lm_head"] = params["lm_head"] * 15.0
    return target.replace(params=params)


def context_logits(target, prompt) -> jax.Array:
    """[V, V, 3, V] fp32: logits[a, b, i] are the target's next-token logits after prompt + [a, b][:i],
    from one forward over every prompt + [a, b]."""
    seqs = [list(prompt) + [a, b] for a, b in itertools.product(range(V), repeat=2)]
    n = len(prompt)
    return sbj.forward(target, seqs)[:, n - 1:].astype(jnp.float32).reshape(V, V, 3, V)


def perturbed_bigram_logits(target, prompt, noise, seed=0) -> jax.Array:
    """[V, V]: row a is the target's next-token logits after prompt + [a] plus Gaussian noise of
    std `noise`: a draft model correlated with the target but not equal to it."""
    logits = context_logits(target, prompt)[:, 0, 1]
    return logits + noise * jax.random.normal(jax.random.key(seed), logits.shape)


def top_k_table(logits: jax.Array, k: int) -> jax.Array:
    """[V, V] logits -> [V, k] int32: each row's k likeliest tokens, likeliest first."""
    return jnp.argsort(-logits, axis=-1)[:, :k].astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class TableTreeDrafter:
    """A deterministic tree of fixed shape from a table params [V, K] (`top_k_table`): node j
    proposes the ranks[j]-th table entry of its parent's token (node parents[j]; node 0 is the
    root, parent -1). Trees [B, N]; q is one-hot (draft_probs None)."""

    parents: tuple[int, ...]
    ranks: tuple[int, ...]
    hidden_ids: tuple[int, ...] = ()
    forwards_per_step = 0

    num_nodes = property(lambda self: len(self.parents))
    max_children = property(lambda self: max(self.parents.count(j) for j in range(len(self.parents))))

    def init_state(self, params, prefill, max_len):
        return ()

    def propose(self, params, state, ctx, key):
        tokens = [ctx.root]
        for parent, rank in zip(self.parents[1:], self.ranks[1:]):
            tokens.append(params[tokens[parent], rank])
        b, n = ctx.root.shape[0], self.num_nodes
        parents = jnp.broadcast_to(jnp.asarray(self.parents, jnp.int32), (b, n))
        return DraftTree(jnp.stack(tokens, 1).astype(jnp.int32), parents, jnp.ones((b, n), bool)), state

    def update(self, params, state, ctx, result, hidden):
        return state


@contextlib.contextmanager
def verifier_variant(variant: jax.Array):
    """While a loop is traced inside it, `verify_sampling` runs VARIANTS[variant] (variant: [] int32,
    traced, so one compile serves all three). The real verifier keeps its own paths (parallel for
    deterministic drafts); the wrong ones run the sequential walk with its residual step replaced."""
    real_residual, real_verify = verify._residual, verify.verify_sampling_with_uniforms

    def residual(resid, q):
        left = jnp.maximum(resid - q, 0.0)
        return jnp.where(variant == 0, real_residual(resid, q), jnp.where(variant == 1, resid, left))

    def with_uniforms(tree, logp, u_accept, u_bonus, max_children=None, anc=None):
        return jax.lax.cond(variant == 0,
                            lambda: real_verify(tree, logp, u_accept, u_bonus, max_children, anc),
                            lambda: verify.verify_sampling_sequential(tree, logp, u_accept, u_bonus, max_children))

    with mock.patch.object(verify, "_residual", residual), \
            mock.patch.object(verify, "verify_sampling_with_uniforms", with_uniforms):
        yield


@functools.partial(jax.jit, static_argnums=0)
def _decode(loop: DecodeLoop, params, drafter_params, variant, inputs: LoopInputs):
    with verifier_variant(variant):
        out = loop.decode(params, drafter_params, inputs)
    return out.tokens[:, :loop.max_new], out.generated, out.forwards


def sample_rows(target, drafter, drafter_params, prompt, *, draws, max_new, seed, variant=0,
                temperature=1.0, top_k=0, top_p=1.0, step_ms=None):
    """`draws` independent sampled continuations of `prompt`, one PRNG key per row from `seed`
    (the same draws for every variant): by the speculative loop verified by VARIANTS[variant], or
    target-only when drafter is None. Returns tokens [draws, max_new] and each row's decoding
    forwards [draws]. One compile per (drafter, draws, max_new, prompt length) serves every variant
    and sampling setting. step_ms: step sizing's cost per menu size (with it the loop sizes its
    steps, decoding/sizing.py; default: the drafter's own sizing, fixed unless it says "auto")."""
    nodes = 0 if drafter is None else drafter.num_nodes
    loop = make_loop(graphdef=target.graphdef, cfg=target.config, drafter=drafter,
                     cache_len=len(prompt) + max_new + nodes, max_new=max_new,
                     sizing=None if step_ms is None else "auto")
    if step_ms is not None:
        loop = dataclasses.replace(loop, step_ms=tuple(step_ms))
    inputs = LoopInputs(jnp.broadcast_to(jnp.asarray(prompt, jnp.int32), (draws, len(prompt))),
                        jnp.full((draws,), len(prompt), jnp.int32), jnp.full((draws,), max_new, jnp.int32),
                        SamplingParams.make(draws, temperature, top_k, top_p), jnp.full((8,), -1, jnp.int32),
                        jax.random.split(jax.random.key(seed), draws))
    tokens, generated, forwards = _decode(loop, target.params, drafter_params, jnp.int32(variant), inputs)
    assert (np.asarray(generated) == max_new).all()
    return np.asarray(tokens), np.asarray(forwards)


def exact_joint(target, prompt, temperature=1.0, top_k=0, top_p=1.0) -> np.ndarray:
    """[V, V, V] float64: P(t1, t2, t3), the target's sampling distribution (temperature, top-k,
    top-p as checked against a numpy reference in test_sampling.py) of the first three new tokens
    after `prompt`."""
    logits = context_logits(target, prompt).reshape(V * V, 3, V)
    logp = sampling_logprobs(logits, SamplingParams.make(V * V, temperature, top_k, top_p))
    probs = np.exp(np.asarray(logp, np.float64))
    probs = (probs / probs.sum(-1, keepdims=True)).reshape(V, V, 3, V)
    return probs[0, 0, 0][:, None, None] * probs[:, 0, 1][:, :, None] * probs[:, :, 2]


def exact_pair_distribution(target, prompt, temperature=1.0, top_k=0, top_p=1.0) -> np.ndarray:
    """[V, V]: P(t2, t3) (`exact_joint` with t1 summed out)."""
    return exact_joint(target, prompt, temperature, top_k, top_p).sum(0)


def sampled_pair_counts(target, drafter, vocab, prompt, draws=6000, temperature=1.0, top_k=0, top_p=1.0):
    """Counts [vocab, vocab] of (t2, t3) over `draws` 3-token continuations of `prompt` sampled by
    `sbj.generate` with `drafter` (a LoadedDrafter or None), or by an `AutoServe`'s own `generate`,
    and the results."""
    serve = drafter.generate if isinstance(drafter, sbj.serving.AutoServe) else (
        lambda *a, **kw: sbj.generate(*a, drafter=drafter, **kw))
    res = serve(target, [prompt] * draws, max_new_tokens=3, seed=11,
                sampling=sbj.Sampling(temperature=temperature, top_k=top_k, top_p=top_p),
                options=sbj.DecodeOptions(batch_size=1000))
    counts = np.zeros((vocab, vocab))
    for r in res:
        counts[r.token_ids[1], r.token_ids[2]] += 1
    return counts, res


def joint_counts(tokens: np.ndarray) -> np.ndarray:
    """tokens [D, k] -> counts [V ** k] of each k-token combination (row-major)."""
    cells = np.ravel_multi_index(tuple(tokens.T), (V,) * tokens.shape[1])
    return np.bincount(cells, minlength=V ** tokens.shape[1])


def _pool(weight: np.ndarray, minimum: float) -> np.ndarray:
    """weight [C] -> mask [C] of the cells pooled into one: every cell with weight below `minimum`,
    plus the next lightest while the pool's weight is below it (all False when no cell is light)."""
    order = np.argsort(weight, kind="stable")
    pooled = np.zeros(weight.shape, bool)
    total = 0.0
    for i in order:
        if weight[i] >= minimum and (total >= minimum or not pooled.any()):
            break
        pooled[i], total = True, total + weight[i]
    return pooled


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """One-sample chi-square test that counts [...] were drawn from probs [...] (same shape). Cells
    expected below `min_expected` draws are pooled (`_pool`); a draw in a cell of probability 0
    rejects outright."""
    obs, exp = counts.ravel().astype(float), probs.ravel() * counts.sum()
    if obs[exp <= 0].sum() > 0:
        return 0.0
    pooled = _pool(exp, min_expected)
    obs = np.append(obs[~pooled], obs[pooled].sum())
    exp = np.append(exp[~pooled], exp[pooled].sum())
    keep = exp > 0  # an empty pool (nothing rare) is no cell
    return float(stats.chisquare(obs[keep], exp[keep] * obs.sum() / exp[keep].sum()).pvalue)


def two_sample_pvalue(a: np.ndarray, b: np.ndarray, min_total: float = 10.0) -> float:
    """Chi-square test that count vectors a and b [C] come from one distribution; cells with fewer
    than `min_total` draws in both samples together are pooled (`_pool`)."""
    pooled = _pool(a + b, min_total)
    table = np.stack([np.append(a[~pooled], a[pooled].sum()), np.append(b[~pooled], b[pooled].sum())])
    return float(stats.chi2_contingency(table[:, table.sum(0) > 0], correction=False).pvalue)
