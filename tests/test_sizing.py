"""Step sizing (decoding/sizing.py): the chooser, the pruning and the calibration against brute
force on small cases, and losslessness with sizes switching from step to step (greedy identity,
sampled chi-square), in one compiled loop."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers_sampling import (VARIANTS, V, TableTreeDrafter, chi_square_pvalue, exact_joint, joint_counts,
                              perturbed_bigram_logits, sample_rows, top_k_table)
from spec_drafters import RandomTreeDrafter
from specblock_jax.decoding.compiled import compilation_count, compiled
from specblock_jax.decoding.loop import decode_loop, make_loop
from specblock_jax.decoding.sizing import (Calibration, calibrated, choose, expected_tokens, prune, size_menu,
                                           skip_draft)
from specblock_jax.decoding.step_costs import nondecreasing, priced_costs
from specblock_jax.decoding.step_profile import default_inputs
from specblock_jax.trees.tree import DraftTree, ancestor_mask, depths


def test_size_menu_and_costs_that_never_fall_along_the_menu():
    assert size_menu(16) == (0, 2, 4, 8, 16)
    assert size_menu(8) == (0, 2, 4, 8) and size_menu(9) == (0, 2, 4, 8, 9) and size_menu(2) == (0, 2)
    assert nondecreasing([3.0, 1.0, 2.0, 5.0]) == [2.0, 2.0, 2.0, 5.0]
    assert nondecreasing([1.0, 2.0, 2.5]) == [1.0, 2.0, 2.5]


def test_chooser_is_the_brute_force_argmax_of_expected_tokens_per_ms():
    rng = np.random.default_rng(0)
    for _ in range(50):
        b, m = rng.integers(1, 6), rng.integers(2, 6)
        expected = np.sort(rng.uniform(1, 5, (b, m)), axis=1)
        active = rng.random(b) < 0.7
        cost = np.sort(rng.uniform(1, 10, m))  # a synthetic step-cost curve
        best = max(range(m), key=lambda k: (sum(expected[r, k] for r in range(b) if active[r]) / cost[k], -k))
        got = int(choose(jnp.asarray(expected, jnp.float32), jnp.asarray(active), jnp.asarray(cost, jnp.float32)))
        assert got == best


def _random_tree(rng, n):
    parents = np.array([-1] + [int(rng.integers(0, j)) for j in range(1, n)])
    step = rng.uniform(0.05, 1.0, n)
    p = np.ones(n)
    for j in range(1, n):
        p[j] = p[parents[j]] * step[j]  # path products: never above an ancestor's
    return parents, p


def test_pruning_keeps_the_best_subtree_closed_under_ancestors():
    """On random 7-node trees, the pruned tree at each size is a valid tree (parents before
    children, each kept node's parent kept) and its expected tokens equal the best over every
    ancestor-closed node set of that size (brute force)."""
    rng = np.random.default_rng(1)
    n = 7
    for _ in range(20):
        parents, p = _random_tree(rng, n)
        tree = DraftTree(jnp.arange(n, dtype=jnp.int32)[None] + 10, jnp.asarray(parents, jnp.int32)[None],
                         jnp.ones((1, n), bool))
        for k in range(1, n + 1):
            sub, sel = prune(tree, jnp.asarray(p, jnp.float32)[None], k)
            sel = np.asarray(sel)[0]
            assert sel[0] == 0 and (np.diff(sel) > 0).all()
            kept = set(sel.tolist())
            assert all(parents[j] in kept for j in sel[1:])
            sub_par = np.asarray(sub.parents)[0]
            assert all(sub_par[i] < i and sel[sub_par[i]] == parents[sel[i]] for i in range(1, k))
            assert np.asarray(sub.tokens)[0].tolist() == (sel + 10).tolist() and bool(np.asarray(sub.valid).all())
            best = max(sum(p[list(c)]) for c in itertools.combinations(range(n), k)
                       if 0 in c and all(parents[j] in c for j in c if j))
            assert np.isclose(sum(p[sel]), best)
            got = float(expected_tokens(jnp.asarray(p, jnp.float32)[None], (k,))[0, 0])
            assert np.isclose(got, best, rtol=1e-5)


def test_calibration_scales_by_depth_and_stays_monotone_along_paths():
    parents = jnp.asarray([[-1, 0, 1, 2]], jnp.int32)
    anc = ancestor_mask(parents)
    raw = jnp.asarray([[1.0, 0.8, 0.6, 0.5]])
    cal = Calibration.zeros(1, 3)
    assert np.allclose(calibrated(raw, depths(anc), anc, cal), raw)  # no evidence: the drafter's own
    # depth 1: predicted 9 (sum of raw scores), realised 4 -> factor 5 / 10; depth 2: 1 / 9 -> 2 / 10
    cal = cal._replace(predicted=jnp.asarray([[9.0, 9.0, 0.0]]), realised=jnp.asarray([[4.0, 1.0, 0.0]]))
    p = np.asarray(calibrated(raw, depths(anc), anc, cal))[0]
    assert np.allclose(p, [1.0, 0.4, 0.12, 0.12])  # depth 3's 0.5 x 1 capped at its parent's 0.12


def test_the_draft_gate_skips_where_drafted_steps_gave_less_than_a_plain_step_and_explores_again():
    active = jnp.asarray([True])
    cost = jnp.asarray([10.0, 20.0], jnp.float32)
    fresh = Calibration.zeros(1, 2)
    assert not bool(skip_draft(fresh, active, cost, 4.0))  # optimistic prior: 4 tokens in 20 ms
    poor = fresh._replace(tokens=jnp.asarray([12.0]), cost=jnp.asarray([200.0]), steps=jnp.asarray([10.0]))
    assert bool(skip_draft(poor, active, cost, 4.0))  # (4 + 12) / (20 + 200) < 1 / 10
    decayed = jax.tree.map(lambda x: x * 0.95 ** 60, poor)  # 60 steps without a draft decay the evidence
    assert not bool(skip_draft(decayed, active, cost, 4.0))


def _switching_loop(target, drafter, costs, *, batch, max_new, greedy=True, prompt_len=16):
    loop = make_loop(graphdef=target.graphdef, cfg=target.config, drafter=drafter, prompt_len=prompt_len,
                     max_new=max_new, greedy=greedy, sizing="auto")
    return priced_costs(loop, dict(zip(loop.sizes, costs)))


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_output_is_target_only_while_sizes_switch(small_vocab_target, batch):
    """A scored random-tree drafter under a cost curve where several sizes win in turn: the tokens
    equal target-only decoding's, steps ran at no-draft and at drafted sizes, and one compiled loop
    served the whole run (its sizes are branches of one switch)."""
    target = small_vocab_target
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, V, 16).tolist() for _ in range(batch)]
    inputs = default_inputs(jnp.asarray(prompts), [16] * batch, max_new=40)
    drafter = RandomTreeDrafter(9, V, stochastic=True, scored=True, sizing="auto")
    params = perturbed_bigram_logits(target, [1, 2, 3], noise=0.3)
    loop = _switching_loop(target, drafter, (1.0, 1.5, 1.8, 2.4, 2.5), batch=batch, max_new=40)
    before = compilation_count()
    exe, _ = compiled(decode_loop, (loop,), target.params, params, inputs)
    out = jax.device_get(exe(target.params, params, inputs))
    assert compilation_count() == before + 1
    ar_loop = make_loop(graphdef=target.graphdef, cfg=target.config, prompt_len=16, max_new=40)
    ar = jax.device_get(compiled(decode_loop, (ar_loop,), target.params, (), inputs)[0](target.params, (), inputs))
    for r in range(batch):
        assert out.tokens[r, :40].tolist() == ar.tokens[r, :40].tolist()
    chosen = np.asarray(out.sizing.chosen).sum(0)
    assert chosen[0] > 0 and chosen[1:].sum() > 0, chosen  # skipped drafting, and verified drafts
    assert (chosen > 0).sum() >= 3, chosen  # at least two drafted sizes too
    accepted = np.asarray(out.sizing.accepted)
    assert accepted.sum() + chosen[0] == np.asarray(out.forwards).sum()  # one count per decoding step
    assert accepted[:, 1:].sum() > 0  # drafts were accepted


@pytest.mark.slow
@pytest.mark.parametrize("costs", [(1.0, 1.0, 1.0, 2.5), (1.0, 1.0, 2.5, 5.0)], ids=["prune-to-4", "prune-to-2"])
def test_sampling_matches_the_target_distribution_at_pruned_sizes(small_vocab_target, costs):
    """The single-step chi-square test (test_speculative.py) with the step verifying a pruned tree
    (the 8-node tree cut to 4 or 2 nodes by the cost curve): the target's joint still, and the
    wrong verifiers rejected on the same draws (the residual's error only where siblings remain)."""
    target, prompt = small_vocab_target, [1, 2, 3]
    logits = perturbed_bigram_logits(target, prompt, noise=0.5)
    drafter = TableTreeDrafter(parents=(-1, 0, 0, 0, 1, 1, 2, 4), ranks=(0, 0, 1, 2, 0, 1, 0, 0))  # sized: step_ms
    exact = exact_joint(target, prompt)
    pvalues, accepted = [], []
    for variant in range(len(VARIANTS)):
        tokens, forwards = sample_rows(target, drafter, top_k_table(logits, 3), prompt, draws=6000, max_new=3,
                                       seed=11, variant=variant, step_ms=costs)
        pvalues.append(chi_square_pvalue(joint_counts(tokens), exact))
        accepted.append(np.mean(forwards == 1))
    assert pvalues[0] > 1e-3
    assert pvalues[1] < 1e-6
    if costs[2] == 1.0:  # 4 nodes keep the root's three children; cut to 2 nodes (one child), no
        assert pvalues[2] < 1e-6  # sibling is ever tried after a rejection: VARIANTS[2] cannot show
    assert accepted[0] > 0.3  # drafts of the pruned tree really were accepted



def test_the_draft_floor_stops_expanding_levels_no_path_is_worth():
    """build_topk_tree (EAGLE-3's) expands a level only while a frontier path probability is above
    the floor: at 0.9 over a uniform drafter only depth 1 is drafted; with no floor, every depth."""
    from specblock_jax.decoding.sizing import draft_floor
    from specblock_jax.drafters.eagle3._topk_tree import build_topk_tree

    vocab, b = 12, 2
    uniform = jnp.full((b, vocab), -np.log(vocab))

    def expander(carry, tokens, parent, node, anc, d):
        return carry + 1, jnp.broadcast_to(uniform[:, None], tokens.shape + (vocab,))

    for floor, levels in ((None, 3), (jnp.float32(0.9), 0), (jnp.float32(0.0), 3)):
        tree, calls = build_topk_tree(jnp.zeros((b,), jnp.int32), uniform, expander, 0, 2, 4, 9, floor=floor)
        dep = np.asarray(depths(ancestor_mask(tree.parents)))
        assert int(calls) == levels
        assert dep[np.asarray(tree.valid)].max() == (1 if levels == 0 else 4)
    # the floor: a level's share of the smallest drafted step's extra cost over a plain step's
    assert np.isclose(float(draft_floor(jnp.asarray([10.0, 18.0, 20.0]), 4)), 0.2)
    assert float(draft_floor(jnp.asarray([10.0]), 4)) == 0.0


def test_the_cost_model_is_measured_once_then_read_from_the_cache(small_vocab_target, monkeypatch, tmp_path):
    """attach_costs times the loop's step at every menu size (non-decreasing along the menu),
    writes step_costs.json beside the compile cache, and a second call reads it (no new compile)."""
    from specblock_jax.decoding import step_costs

    monkeypatch.setenv(step_costs.COSTS_ENV, "measure")
    monkeypatch.setattr(step_costs, "cost_file", lambda: tmp_path / "step_costs.json")
    monkeypatch.setattr(step_costs, "_MEMORY", {})
    target = small_vocab_target
    inputs = default_inputs(jnp.asarray([[1, 2, 3, 4]]), [4], max_new=8)
    loop = make_loop(graphdef=target.graphdef, cfg=target.config, prompt_len=4, max_new=8, greedy=True,
                     drafter=RandomTreeDrafter(5, V, sizing="auto"))
    measured = step_costs.attach_costs(loop, target.params, (), inputs)
    assert len(measured.step_ms) == len(loop.sizes) == 4 and all(x > 0 for x in measured.step_ms)
    assert list(measured.step_ms) == sorted(measured.step_ms)
    assert (tmp_path / "step_costs.json").exists()
    monkeypatch.setattr(step_costs, "_MEMORY", {})
    before = compilation_count()
    again = step_costs.attach_costs(loop, target.params, (), inputs)
    assert again.step_ms == measured.step_ms and compilation_count() == before


def test_generate_with_sizing_reports_each_rows_tally_through_refill(small_vocab_target):
    """sbj.generate with a drafter set to sizing="auto", through continuous batching (5 requests
    in 2 rows): tokens equal target-only's, and each row's stats.sizing counts its steps (steps at
    size 0 + steps by accepted drafts = its decoding forwards) with committed tokens >= its new
    tokens minus the prefill's."""
    import specblock_jax as sbj

    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, V, 12).tolist() for _ in range(5)]
    opts = sbj.DecodeOptions(batch_size=2)
    ar = sbj.generate(small_vocab_target, prompts, max_new_tokens=12, options=opts)
    drafter = sbj.LoadedDrafter(RandomTreeDrafter(6, V, sizing="auto"), ())
    spec = sbj.generate(small_vocab_target, prompts, drafter=drafter, max_new_tokens=12, options=opts)
    for a, s in zip(ar, spec):
        assert s.token_ids == a.token_ids
        z = s.stats.sizing
        assert z["sizes"] == [0, 2, 4, 6] and len(z["chosen"]) == 4
        assert z["chosen"][0] + sum(z["accepted"]) == s.stats.target_forwards - 1
        committed = sum((i + 1) * c for i, c in enumerate(z["accepted"])) + z["chosen"][0]
        assert committed >= len(s.token_ids) - 1
