"""Speculative decoding is lossless: greedy output == target-only greedy; sampled output follows
the target's sampling distribution exactly. Plus compile counts and statistics."""

from __future__ import annotations

import numpy as np
import pytest

import specblock_jax as sbj
from helpers_sampling import (VARIANTS, V, TableTreeDrafter, chi_square_pvalue, exact_joint, joint_counts,
                              perturbed_bigram_logits, sample_rows, top_k_table)
from spec_drafters import RandomTreeDrafter
from specblock_jax.decoding import compilation_count
from specblock_jax.drafters.prompt_lookup import PromptLookup


def _prompts(n, vocab, seed=0, max_len=30):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, rng.integers(1, max_len + 1)).tolist() for _ in range(n)]


@pytest.mark.parametrize("num_nodes,batch", [(4, 1), (9, 8), (16, 5)])
@pytest.mark.slow
def test_greedy_random_trees_equal_autoregressive(small_vocab_target, num_nodes, batch):
    prompts = _prompts(50, V, seed=num_nodes)
    ar = sbj.generate(small_vocab_target, prompts, max_new_tokens=24, options=sbj.DecodeOptions(batch_size=8))
    drafter = sbj.LoadedDrafter(RandomTreeDrafter(num_nodes, V), ())
    spec = sbj.generate(small_vocab_target, prompts, drafter=drafter, max_new_tokens=24,
                        options=sbj.DecodeOptions(batch_size=batch))
    for a, s in zip(ar, spec):
        assert s.token_ids == a.token_ids
    taus = [s.stats.tau for s in spec]
    assert np.median(taus) > 1.2  # drafts are really accepted, so the paths are exercised


@pytest.mark.slow
def test_greedy_stop_tokens_and_budgets_cut_speculative_output_like_autoregressive(small_vocab_target):
    prompts = _prompts(50, V, seed=9)
    kw = dict(max_new_tokens=17, options=sbj.DecodeOptions(stop_tokens=[3], batch_size=8))
    ar = sbj.generate(small_vocab_target, prompts, **kw)
    spec = sbj.generate(small_vocab_target, prompts, drafter=sbj.LoadedDrafter(RandomTreeDrafter(9, V), ()), **kw)
    assert any(a.stats.finish_reason == "stop" for a in ar)
    for a, s in zip(ar, spec):
        assert s.token_ids == a.token_ids and s.stats.finish_reason == a.stats.finish_reason


@pytest.mark.parametrize("num_nodes", [4, 8])
@pytest.mark.slow
def test_greedy_prompt_lookup_equals_autoregressive(hf_dirs, num_nodes):
    target = sbj.load_target(hf_dirs["qwen3"][0])
    rng = np.random.default_rng(1)
    prompts = [(rng.integers(0, 128, rng.integers(2, 8)).tolist() * 4)[:30] for _ in range(50)]
    ar = sbj.generate(target, prompts, max_new_tokens=32, options=sbj.DecodeOptions(batch_size=10))
    for batch in (1, 10) if num_nodes == 8 else (10,):
        pl = sbj.generate(target, prompts, drafter=sbj.LoadedDrafter(PromptLookup(num_nodes=num_nodes), ()), max_new_tokens=32,
                          options=sbj.DecodeOptions(batch_size=batch))
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


SINGLE_STEP_TREE = TableTreeDrafter(parents=(-1, 0, 0, 0, 1, 1, 2, 4), ranks=(0, 0, 1, 2, 0, 1, 0, 0))


@pytest.mark.parametrize("drafts,temp,top_k,top_p", [("deterministic", 1.0, 0, 1.0),
                                                     ("stochastic", 1.0, 0, 1.0), ("stochastic", 0.8, 6, 0.9)])
def test_sampling_matches_the_target_distribution(small_vocab_target, drafts, temp, top_k, top_p):
    """6000 rows of 3 new tokens after the prompt: the prefill samples t1; the first speculative step
    commits t2 and t3 when it accepts a draft (else the next step commits t3). Their joint must
    follow the target's, and the same test on the same draws must reject the two wrong verifiers
    of helpers_sampling.VARIANTS. Drafts are correlated with the target (its next-token logits
    after prompt + [a], plus noise): a fixed tree of their top 3 (q one-hot; the root has 3
    children, one of them 2), or random trees sampled from their softmax (q not one-hot)."""
    target, prompt = small_vocab_target, [1, 2, 3]
    logits = perturbed_bigram_logits(target, prompt, noise=0.5)
    drafter, params = ((SINGLE_STEP_TREE, top_k_table(logits, 3)) if drafts == "deterministic" else
                       (RandomTreeDrafter(8, V, stochastic=True, max_children=4), logits))
    exact = exact_joint(target, prompt, temp, top_k, top_p)
    pvalues, accepted = [], []
    for variant in range(len(VARIANTS)):
        tokens, forwards = sample_rows(target, drafter, params, prompt, draws=6000, max_new=3, seed=11,
                                       variant=variant, temperature=temp, top_k=top_k, top_p=top_p)
        pvalues.append(chi_square_pvalue(joint_counts(tokens), exact))
        accepted.append(np.mean(forwards == 1))  # one step committed t2 and t3: a draft was accepted
    print(f"single-step {drafts} T={temp} top_k={top_k} top_p={top_p}: p-values "
          + ", ".join(f"{name} {p:.3g}" for name, p in zip(VARIANTS, pvalues)))
    # H0 (lossless) holds, so a p-value below 1e-3 would happen 1 time in 1000: a real failure
    assert pvalues[0] > 1e-3
    # power: the same draws through a wrong verifier are clearly rejected
    assert pvalues[1] < 1e-6 and pvalues[2] < 1e-6
    assert accepted[0] > 0.5  # drafts really were accepted, deeper nodes verified too


def test_no_recompilation_once_warm(small_vocab_target):
    drafter = sbj.LoadedDrafter(RandomTreeDrafter(6, V), ())
    sbj.generate(small_vocab_target, _prompts(4, V, 1, 16), drafter=drafter, max_new_tokens=10,
                 options=sbj.DecodeOptions(batch_size=4))
    warm = compilation_count()
    for seed in range(3):  # new prompts (same bucket), new seeds, new temperatures
        sbj.generate(small_vocab_target, _prompts(4, V, seed + 2, 16), drafter=drafter, max_new_tokens=10,
                     options=sbj.DecodeOptions(batch_size=4))
    assert compilation_count() == warm
    sbj.generate(small_vocab_target, _prompts(4, V, 1, 16), drafter=drafter, max_new_tokens=10,
                 sampling=sbj.Sampling(0.7), options=sbj.DecodeOptions(batch_size=4))  # sampling is its own (static) verifier
    sbj.generate(small_vocab_target, _prompts(4, V, 3, 16), drafter=drafter, max_new_tokens=10, seed=4,
                 sampling=sbj.Sampling(temperature=1.3, top_p=0.8), options=sbj.DecodeOptions(batch_size=4))
    assert compilation_count() == warm + 1


def test_commit_counts_are_the_steps_by_the_batchs_most_committed_tokens(small_vocab_target):
    """stats.commit_hist[c]: the steps a row ran in which the most tokens any row of its batch
    committed was c (what a row-switched update runs at). It sums to the row's decoding forwards;
    alone, c x count sums to the tokens it committed (the last step's may pass the token budget);
    in a batch, each step counts the batch's most, so the row's own tokens are at most that sum."""
    t = small_vocab_target
    prompts = _prompts(3, V, seed=5)
    drafter = sbj.LoadedDrafter(RandomTreeDrafter(8, V), ())
    for batch in (1, 3):
        out = sbj.generate(t, prompts, drafter, max_new_tokens=24, options=sbj.DecodeOptions(batch_size=batch))
        for r in out:
            hist = np.asarray(r.stats.commit_hist)
            assert len(hist) == 8 + 1 and hist[0] == 0
            assert hist.sum() == r.stats.target_forwards - 1
            committed = int((np.arange(len(hist)) * hist).sum())
            assert committed >= r.stats.new_tokens - 1
            if batch == 1:  # its own counts: only the last step's may run past the token budget
                assert committed - (r.stats.new_tokens - 1) < np.flatnonzero(hist).max()
    assert sbj.generate(t, prompts[:1], max_new_tokens=4)[0].stats.commit_hist is None  # target-only
