"""Speculative decoding is lossless: greedy output == target-only greedy; sampled output follows
the target's sampling distribution exactly. Plus compile counts and statistics."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
from scipy import stats

import specblock_jax as sbj
from spec_drafters import RandomTreeDrafter, skewed_draft_params
from specblock_jax.decoding import SamplingParams, compilation_count, sampling_logprobs
from specblock_jax.drafters import PromptLookup

V = 8  # a tiny vocabulary: random drafts get accepted often, distributions can be enumerated


@pytest.fixture(scope="module")
def small_vocab_target():
    cfg = sbj.models.config.tiny(vocab_size=V, eos_token_ids=())
    target = sbj.init_target(cfg, seed=5)
    # logits with a std of about 2.5 instead of 0.16: a clearly non-uniform target distribution
    params = jax.tree.map(lambda x: x, target.params)
    params["lm_head"] = params["lm_head"] * 15.0
    return target.replace(params=params)


def _prompts(n, vocab, seed=0, max_len=30):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, rng.integers(1, max_len + 1)).tolist() for _ in range(n)]


@pytest.mark.parametrize("num_nodes,batch", [(4, 1), (9, 8), (16, 5)])
def test_greedy_random_trees_equal_autoregressive(small_vocab_target, num_nodes, batch):
    prompts = _prompts(50, V, seed=num_nodes)
    ar = sbj.generate(small_vocab_target, prompts, max_new_tokens=24, batch_size=8)
    drafter = RandomTreeDrafter(num_nodes, V)
    spec = sbj.generate(small_vocab_target, prompts, drafter=drafter, max_new_tokens=24, batch_size=batch)
    for a, s in zip(ar, spec):
        assert s.token_ids == a.token_ids
    taus = [s.stats.tau for s in spec]
    assert np.median(taus) > 1.2  # drafts are really accepted, so the paths are exercised


def test_greedy_stop_tokens_and_budgets_cut_speculative_output_like_autoregressive(small_vocab_target):
    prompts = _prompts(50, V, seed=9)
    kw = dict(max_new_tokens=17, stop_tokens=[3], batch_size=8)
    ar = sbj.generate(small_vocab_target, prompts, **kw)
    spec = sbj.generate(small_vocab_target, prompts, drafter=RandomTreeDrafter(9, V), **kw)
    assert any(a.stats.finish_reason == "stop" for a in ar)
    for a, s in zip(ar, spec):
        assert s.token_ids == a.token_ids and s.stats.finish_reason == a.stats.finish_reason


@pytest.mark.parametrize("num_nodes", [4, 8])
def test_greedy_prompt_lookup_equals_autoregressive(hf_dirs, num_nodes):
    target = sbj.load_target(hf_dirs["qwen3"][0])
    rng = np.random.default_rng(1)
    prompts = [(rng.integers(0, 128, rng.integers(2, 8)).tolist() * 4)[:30] for _ in range(50)]
    ar = sbj.generate(target, prompts, max_new_tokens=32, batch_size=10)
    for batch in (1, 10) if num_nodes == 8 else (10,):
        pl = sbj.generate(target, prompts, drafter=PromptLookup(num_nodes=num_nodes),
                          max_new_tokens=32, batch_size=batch)
        assert [p.token_ids for p in pl] == [a.token_ids for a in ar]
    assert np.mean([p.stats.tau for p in pl]) > 1.5  # the repeats are found and accepted


def test_prompt_lookup_proposes_the_continuation_of_the_latest_match():
    import jax.numpy as jnp

    from specblock_jax.drafters import DraftContext

    hist = jnp.asarray([[5, 6, 7, 8, 9, 5, 6, 7, 1, 2, 5, 6, 0, 0]])
    ctx = DraftContext(hist, jnp.asarray([12]), jnp.asarray([6]), jnp.asarray([11]))
    tree, _ = PromptLookup(num_nodes=4, max_ngram=2).propose((), (), ctx, None)
    # suffix [5, 6] occurs at 0 and 5; both are followed by 3 tokens; the latest (5) wins
    assert np.asarray(tree.tokens)[0].tolist() == [6, 7, 1, 2]
    assert np.asarray(tree.valid)[0].all()
    ctx = DraftContext(hist, jnp.asarray([10]), jnp.asarray([2]), jnp.asarray([9]))
    tree, _ = PromptLookup(num_nodes=4, max_ngram=2).propose((), (), ctx, None)
    # suffix [1, 2] never occurred before; nor did [2]: nothing is proposed
    assert np.asarray(tree.valid)[0].tolist() == [True, False, False, False]


def _exact_pair_distribution(target, prompt, temperature, top_k=0, top_p=1.0):
    """P(t2, t3) after the prompt, marginalising t1, under the target's sampling distribution
    (temperature, top-k, top-p as checked against a numpy reference in test_sampling.py)."""
    seqs = [prompt + [a, b] for a, b in itertools.product(range(V), repeat=2)]
    logits = sbj.forward(target, seqs)
    params = SamplingParams.make(len(seqs), temperature, top_k, top_p)
    probs = np.exp(np.asarray(sampling_logprobs(logits, params), np.float64))
    probs /= probs.sum(-1, keepdims=True)
    n = len(prompt)
    p1 = probs[0, n - 1]  # after the prompt
    joint = np.zeros((V, V))
    for idx, (a, b) in enumerate(itertools.product(range(V), repeat=2)):
        p2 = probs[idx, n]  # after prompt + a
        joint[b] += p1[a] * p2[b] * probs[idx, n + 1]  # t2 = b, t3 = every c
    return joint  # [t2, t3]


def sampled_pair_counts(target, drafter, vocab, prompt, draws=6000, temperature=1.0, top_k=0, top_p=1.0):
    """(counts [V, V] of (t2, t3) over `draws` sampled 3-token continuations of `prompt`, the
    results): tokens 2-3 come from the first speculative step (drafts and bonus)."""
    res = sbj.generate(target, [prompt] * draws, drafter=drafter, temperature=temperature, top_k=top_k,
                       top_p=top_p, max_new_tokens=3, batch_size=1000, seed=11)
    counts = np.zeros((vocab, vocab))
    for r in res:
        counts[r.token_ids[1], r.token_ids[2]] += 1
    return counts, res


def _chi_square_pvalue(counts, expected_probs):
    total = counts.sum()
    exp = expected_probs.ravel() * total
    obs = counts.ravel()
    big = exp >= 5  # pool the rare cells into one
    obs_b = np.append(obs[big], obs[~big].sum())
    exp_b = np.append(exp[big], exp[~big].sum())
    keep = exp_b > 0
    chi2 = (((obs_b - exp_b) ** 2) / exp_b)[keep].sum()
    return stats.chi2.sf(chi2, keep.sum() - 1)


@pytest.mark.parametrize("stochastic,temp,top_k,top_p", [(False, 1.0, 0, 1.0), (True, 1.0, 0, 1.0),
                                                         (True, 0.8, 6, 0.9)])
def test_sampling_matches_the_target_distribution(small_vocab_target, stochastic, temp, top_k, top_p):
    """6000 sequences; tokens 2-3 come from the first speculative step (drafts and bonus)."""
    target = small_vocab_target
    prompt, draws = [1, 2, 3], 6000
    drafter = (RandomTreeDrafter(8, V, stochastic=stochastic, max_children=4),
               skewed_draft_params(V))
    counts, res = sampled_pair_counts(target, drafter, V, prompt, draws, temp, top_k, top_p)
    exact = _exact_pair_distribution(target, prompt, temp, top_k, top_p)
    # H0 (lossless) holds, so a p-value below 1e-3 would happen 1 time in 1000: a real failure
    assert _chi_square_pvalue(counts, exact) > 1e-3
    # the test has power: the same samples clearly reject a nearby wrong distribution
    wrong = _exact_pair_distribution(target, prompt, temp * 1.25, top_k, top_p)
    assert _chi_square_pvalue(counts, wrong) < 1e-6
    tv = 0.5 * np.abs(counts / draws - exact).sum()
    assert tv < 0.06  # total variation, for reference: sampling noise alone is about 0.03 here
    # drafts really were accepted: with a budget of 3 tokens the first step commits 2 tokens
    # (tau 2) exactly when it accepted a draft; at least 600 of the 6000 samples exercise that
    assert np.mean([r.stats.tau == 2 for r in res]) > 0.1


def test_no_recompilation_once_warm(small_vocab_target):
    drafter = RandomTreeDrafter(6, V)
    sbj.generate(small_vocab_target, _prompts(4, V, 1, 16), drafter=drafter, max_new_tokens=10, batch_size=4)
    warm = compilation_count()
    for seed in range(3):  # new prompts (same bucket), new seeds, new temperatures
        sbj.generate(small_vocab_target, _prompts(4, V, seed + 2, 16), drafter=drafter,
                     max_new_tokens=10, batch_size=4)
    assert compilation_count() == warm
    sbj.generate(small_vocab_target, _prompts(4, V, 1, 16), drafter=drafter, max_new_tokens=10,
                 batch_size=4, temperature=0.7)  # sampling is its own (static) verifier
    sbj.generate(small_vocab_target, _prompts(4, V, 3, 16), drafter=drafter, max_new_tokens=10,
                 batch_size=4, temperature=1.3, top_p=0.8, seed=4)
    assert compilation_count() == warm + 1
