"""DFlash-style drafter: masks vs hand-written matrices, training/decoding agreement, greedy and
sampled losslessness, training steps, save/load."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import specblock_jax as sbj
from specblock_jax.drafters.base import Prefill
from specblock_jax.drafters.dflash._model import DFlashDrafter
from specblock_jax.drafters.dflash._train import DFlashTask, training_mask
from specblock_jax.drafters.io import load_drafter, save_drafter
from helpers_sampling import chi_square_pvalue, exact_pair_distribution, sampled_pair_counts
from helpers import train_on_fixed_batch

V = 8


@pytest.fixture(scope="module")
def task(target):
    return DFlashTask({"num_layers": 2, "block_size": 4, "num_anchors": 3, "mask_token_id": 3}, target)


@pytest.fixture(scope="module")
def params(task):
    p = task.init_params(jax.random.key(1))
    return jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, p)  # peakier drafts


def test_training_mask_matches_the_hand_written_matrix():
    got = training_mask(jnp.asarray([[1, 2]]), jnp.asarray([[True, True]]), jnp.ones((1, 4), jnp.int32), 2)
    want = [[1, 0, 0, 0, 1, 1, 0, 0],
            [1, 0, 0, 0, 1, 1, 0, 0],
            [1, 1, 0, 0, 0, 0, 1, 1],
            [1, 1, 0, 0, 0, 0, 1, 1]]
    np.testing.assert_array_equal(np.asarray(got[0], int), want)
    # padding is never context, and an anchor that could not be drawn sees no context at all
    got = training_mask(jnp.asarray([[3, 0]]), jnp.asarray([[True, False]]), jnp.asarray([[1, 0, 1, 1]]), 1)
    np.testing.assert_array_equal(np.asarray(got[0], int), [[1, 0, 1, 0, 1, 0], [0, 0, 0, 0, 0, 1]])


def test_decoding_mask_matches_the_hand_written_matrix(task):
    drafter = DFlashDrafter(task.config, task.graphdef, block_size=3)
    got = drafter.block_mask(jnp.asarray([3, 1]), jnp.asarray([3, 2]), 5)
    # row 0: context slots 0-2, the whole block; row 1: context slot 0, block size 2
    np.testing.assert_array_equal(np.asarray(got[0], int), [[1, 1, 1, 0, 0, 1, 1, 1]] * 3)
    np.testing.assert_array_equal(np.asarray(got[1], int), [[1, 0, 0, 0, 0, 1, 1, 0]] * 3)


def test_decoding_logits_equal_the_training_forward(target, task, params):
    """The block drafted after a prefill == the training block anchored at the root's position."""
    prefix, root = [5, 1, 7, 2, 6], 4
    bundle = task.decoding_drafter(params)
    drafter, dparams = bundle
    seq = jnp.asarray([prefix + [root, 0, 0, 0, 0]])
    logits, hidden = sbj.forward(target, seq, hidden_ids=task.config.feature_layers)
    pre = Prefill(seq[:, :5], jnp.asarray([5]), hidden[:, :5], logits[:, 4], jnp.asarray([root]))
    got = jax.jit(lambda dp, pre: drafter.draft_logits(dp, drafter.init_state(dp, pre, 24), pre.root))(
        dparams, pre)  # [1, 3, V]

    @jax.jit
    def training_side(params, hidden):  # anchor p = 5 of a 10-token row
        model = nnx.merge(task.graphdef, params)
        ctx_kv = model.context_cache(model.context(hidden), jnp.arange(10)[None])
        emb = jnp.take(target.params["embed_tokens"], jnp.asarray([[root, 3, 3, 3]]), axis=0)
        mask = training_mask(jnp.asarray([[5]]), jnp.asarray([[True]]), jnp.ones((1, 10), jnp.int32), 4)
        h = model.block(emb, jnp.asarray([[5, 6, 7, 8]]), ctx_kv, mask)
        return jnp.einsum("bth,hv->btv", h[:, 1:], dparams["head"])

    want = training_side(params, hidden)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4)


def test_update_appends_the_context_a_prefill_would_give(target, task, params):
    """Prefill 5 tokens, accept root + 2 drafts: the next block's logits equal those after a prefill
    of all 8 committed tokens."""
    from specblock_jax.drafters.base import DraftContext
    from specblock_jax.trees.verify import VerifyResult

    drafter, dparams = task.decoding_drafter(params)
    seq = jnp.asarray([[5, 1, 7, 2, 6, 4, 0, 2, 3]])  # prompt (5), root 4, drafts 0 2, bonus 3
    logits, hidden = sbj.forward(target, seq, hidden_ids=drafter.hidden_ids)

    def prefill(n):
        return Prefill(seq[:, :n], jnp.asarray([n]), hidden[:, :n], logits[:, n - 1], seq[:, n])

    @jax.jit
    def stepped(dp):
        state = drafter.init_state(dp, prefill(5), 24)
        result = VerifyResult(jnp.asarray([[0, 1, 2, 0]]), jnp.asarray([2]), jnp.asarray([3]),
                              jnp.asarray([[0, 2, 3, -1]]))
        ctx = DraftContext(jnp.zeros((1, 24), jnp.int32), jnp.asarray([9]), jnp.asarray([3]), jnp.asarray([8]))
        state = drafter.update(dp, state, ctx, result, hidden[:, 5:9])
        return drafter.draft_logits(dp, state, jnp.asarray([3])), state.length

    got, length = stepped(dparams)
    want = jax.jit(lambda dp: drafter.draft_logits(dp, drafter.init_state(dp, prefill(8), 24), seq[:, 8]))(dparams)
    assert int(length[0]) == 8
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4)


@pytest.mark.slow
def test_greedy_dflash_decoding_equals_autoregressive(target, task, params):
    """Greedy and auto drafts, block sizes below, at and above the training block (4): 3, 4 and 6
    (a size above it runs as the drafter allows, issue 58), batch 1, 2 and 4: output == target-only
    output."""
    dparams = task.decoding_drafter(params)[1]
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, V, rng.integers(1, 17)).tolist() for _ in range(12)]
    ar = sbj.generate(target, prompts, max_new_tokens=20, options=sbj.DecodeOptions(batch_size=4))
    assert task.config.block_size == 4
    for mode, size, batch in (("greedy", 4, 4), ("auto", 3, 1), ("greedy", 6, 2)):
        d = DFlashDrafter(task.config, task.graphdef, block_size=size, draft_mode=mode)
        spec = sbj.generate(target, prompts, drafter=sbj.LoadedDrafter(d, dparams), max_new_tokens=20,
                            options=sbj.DecodeOptions(batch_size=batch))
        assert [s.token_ids for s in spec] == [a.token_ids for a in ar], (mode, size, batch)
        assert np.mean([s.stats.tau for s in spec]) > 1.03  # some drafts are accepted (random drafter)


@pytest.mark.parametrize("mode,temp,top_k,top_p", [("sample", 1.0, 0, 1.0), ("auto", 0.8, 6, 0.9)])
@pytest.mark.slow
def test_sampled_dflash_decoding_matches_the_target_distribution(target, task, params, mode, temp, top_k, top_p):
    """The engine's distribution test (tests/test_speculative.py) with this drafter's sampled drafts."""
    drafter = DFlashDrafter(task.config, task.graphdef, block_size=3, draft_mode=mode)
    prompt, draws = [1, 2, 3], 6000
    loaded = sbj.LoadedDrafter(drafter, task.decoding_drafter(params).params)
    counts, res = sampled_pair_counts(target, loaded, V, prompt, draws, temp, top_k, top_p)
    exact = exact_pair_distribution(target, prompt, temp, top_k, top_p)
    assert chi_square_pvalue(counts, exact) > 1e-3
    assert chi_square_pvalue(counts, exact_pair_distribution(target, prompt, temp * 1.25, top_k, top_p)) < 1e-6
    if mode == "sample":  # sampled drafts really were accepted (auto starts with greedy drafts)
        assert np.mean([r.stats.tau == 2 for r in res]) > 0.1


def test_train_steps_reduce_the_loss_on_a_fixed_batch(task):
    losses, metrics = train_on_fixed_batch(task, V, mask_last=True)
    assert losses[-1] < 0.7 * losses[0]
    assert set(metrics) == {"acc_1", "acc", "tau_est"} and 1 <= float(metrics["tau_est"]) <= 4


def test_save_and_load_round_trip(target, task, params, tmp_path):
    drafter, _ = task.decoding_drafter(params)
    save_drafter(drafter, params, tmp_path, dtype="float32")
    loaded, lp = load_drafter(tmp_path, target, block_size=3, draft_mode="sample")
    assert (loaded.config, loaded.block_size, loaded.draft_mode) == (drafter.config, 3, "sample")
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(lp["draft"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other = sbj.init_target(sbj.models.config.tiny(vocab_size=16), seed=0)
    with pytest.raises(ValueError, match="drafter trained for vocab 8"):
        load_drafter(tmp_path, other)
