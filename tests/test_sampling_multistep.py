"""Multi-step speculative sampling is lossless: after several speculative steps (deep tree paths
accepted and the target's cache compacted at every step) the generated tokens follow the
target-only sampling distribution. Two empirical samples are compared (no reference verifier);
on the same draws, the two wrong verifiers of helpers_sampling.VARIANTS are rejected."""

from __future__ import annotations

import numpy as np
import pytest

from helpers_sampling import (VARIANTS, TableTreeDrafter, joint_counts, peaked_target, perturbed_bigram_logits,
                              sample_rows, top_k_table, two_sample_pvalue)

PROMPT, MAX_NEW, DRAWS = [1, 2, 3], 10, 4000
COMPARED = slice(7, 10)  # the joint of generated tokens 7..9: committed by a 3rd or later step
# a binary tree of depth 3 (8 nodes): every node has two children but node 3 (one) and the leaves
TREE = TableTreeDrafter(parents=(-1, 0, 0, 1, 1, 2, 2, 3), ranks=(0, 0, 1, 0, 1, 0, 1, 0))


@pytest.fixture(scope="module")
def target():
    return peaked_target()


def test_multistep_speculative_sampling_follows_the_target_distribution(target):
    # the two likeliest tokens after each token, by the target's logits after PROMPT + [a] plus noise
    table = top_k_table(perturbed_bigram_logits(target, PROMPT, noise=0.5), 2)
    ar_tokens, _ = sample_rows(target, None, None, PROMPT, draws=DRAWS, max_new=MAX_NEW, seed=1)
    ar_counts = joint_counts(ar_tokens[:, COMPARED])
    assert (ar_counts >= 10).sum() >= 20  # a distribution with many cells, not a near-point mass
    pvalues = []
    for variant in range(len(VARIANTS)):
        tokens, forwards = sample_rows(target, TREE, table, PROMPT, draws=DRAWS, max_new=MAX_NEW, seed=2,
                                       variant=variant)
        if variant == 0:
            # several speculative steps, and deep paths accepted: 9 tokens after the prefill's in at
            # most 9 forwards; a mean above 2 tokens per forward needs paths of depth >= 2 (of 3)
            assert forwards.mean() >= 3 and (MAX_NEW - 1) / forwards.mean() > 2.0
        pvalues.append(two_sample_pvalue(ar_counts, joint_counts(tokens[:, COMPARED])))
    print("multi-step: p-values " + ", ".join(f"{name} {p:.3g}" for name, p in zip(VARIANTS, pvalues)))
    # H0 (lossless) holds, so a p-value below 1e-3 would happen 1 time in 1000: a real failure
    assert pvalues[0] > 1e-3
    # power: the same draws through a wrong verifier are clearly rejected
    assert pvalues[1] < 1e-6 and pvalues[2] < 1e-6
