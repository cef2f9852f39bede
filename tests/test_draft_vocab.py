"""Reduced draft vocabularies (EAGLE-3's d2t/t2d): the map, its checks, and an EAGLE-3 drafter that
drafts in it losslessly (greedy identity, the exact sampling distribution), never outside the
target's vocabulary, and refuses to load with a map that does not fit."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specblock_jax as sbj
from helpers import train_on_fixed_batch
from specblock_jax.drafters import draft_vocab
from specblock_jax.drafters.base import DraftContext, Prefill
from specblock_jax.drafters.eagle3._train import Eagle3Task
from specblock_jax.drafters.specblock._train import SpecBlockTask
from helpers_sampling import chi_square_pvalue, exact_pair_distribution, sampled_pair_counts

V, K = 32, 12


def test_map_round_trip_order_and_checks(tmp_path):
    counts = np.zeros(V, np.int64)
    counts[[5, 9, 2, 30]] = [7, 7, 3, 10]
    vocab = draft_vocab.from_counts(counts, 6)
    assert vocab.d2t.tolist() == [30, 5, 9, 2, 0, 1]  # by count, ties to the lower id
    assert vocab.t2d[30] == 0 and vocab.t2d[2] == 3 and vocab.t2d[31] == -1
    assert (vocab.t2d >= 0).sum() == 6
    draft_vocab.save(tmp_path, vocab)
    loaded = draft_vocab.load(tmp_path, V, 6)
    np.testing.assert_array_equal(loaded.d2t, vocab.d2t)
    np.testing.assert_array_equal(loaded.t2d, vocab.t2d)
    assert draft_vocab.count_tokens([[1, 1, 3], [3]], 4).tolist() == [0, 2, 0, 2]

    with pytest.raises(ValueError, match="head has 7 outputs"):
        draft_vocab.load(tmp_path, V, 7)
    with pytest.raises(ValueError, match="target vocabulary has 40 ids"):
        draft_vocab.load(tmp_path, 40, 6)
    with pytest.raises(ValueError, match="same target id"):
        draft_vocab.make(np.asarray([1, 1, 2]), V)
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        draft_vocab.make(np.asarray([1, 32]), V)
    stale = draft_vocab.DraftVocab(vocab.d2t, np.roll(vocab.t2d, 1))
    with pytest.raises(ValueError, match="not the inverse of d2t"):
        draft_vocab.validate(stale, V, 6, "x")
    with pytest.raises(ValueError, match="no draft_vocab.safetensors"):
        draft_vocab.load(tmp_path / "nowhere", V, 6)


def _vocab_file(target, tmp_path, size=K) -> str:
    """A draft vocabulary of the target's most likely greedy tokens (counts from AR outputs)."""
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, V, 6).tolist() for _ in range(16)]
    outs = sbj.generate(target, prompts, max_new_tokens=12, options=sbj.DecodeOptions(batch_size=8))
    counts = draft_vocab.count_tokens([p + o.token_ids for p, o in zip(prompts, outs)], V)
    draft_vocab.save(tmp_path, draft_vocab.from_counts(counts, size))
    return str(tmp_path / draft_vocab.FILE)


@pytest.mark.parametrize("kind", ["eagle3", "specblock"])
@pytest.mark.slow
def test_a_drafter_with_a_draft_vocabulary_is_lossless_and_drafts_only_its_ids(target, tmp_path, kind):
    vocab = {"draft_vocab_size": K, "draft_vocab": _vocab_file(target, tmp_path)}
    task = (Eagle3Task({"num_nodes": 10, "top_k": 3, "depth": 3, **vocab}, target) if kind == "eagle3" else
            SpecBlockTask({"num_nodes": 12, "loss_fraction": 1.0, **vocab}, target))
    params = task.init_params(jax.random.key(0))
    assert params["lm_head"].shape == (target.config.hidden_size, K)
    drafter, bundle = task.decoding_drafter(params)
    np.testing.assert_array_equal(np.asarray(params["lm_head"]),
                                  np.asarray(sbj.drafters.common.target_head(target)[:, task.vocab.d2t]))

    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, V, rng.integers(2, 15)).tolist() for _ in range(8)]
    ar = sbj.generate(target, prompts, max_new_tokens=16, options=sbj.DecodeOptions(batch_size=4))
    spec = sbj.generate(target, prompts, drafter=sbj.LoadedDrafter(drafter, bundle), max_new_tokens=16,
                        options=sbj.DecodeOptions(batch_size=4))  # (batch 1 against batch 4 is test_speculative's, without the map)
    assert [s.token_ids for s in spec] == [a.token_ids for a in ar]
    if kind == "eagle3":  # drafts in the reduced vocabulary are accepted: mean tau 1.19 here, 1.08
        # when the same drafter skips the d2t map (its raw ids then stand for the wrong tokens)
        assert np.mean([s.stats.tau for s in spec]) > 1.12

    # every drafted node is a target id of the draft vocabulary (never a raw draft id)
    tok = jnp.asarray([[4, 7, 1, 9, 2, 0]])

    @jax.jit  # one compile instead of op-by-op dispatch
    def first_tree(bundle):
        out = sbj.models.apply(target.graphdef, target.params, tok, jnp.arange(6)[None],
                               sbj.models.causal_mask(1, 6), hidden_ids=drafter.hidden_ids)
        state = drafter.init_state(bundle, Prefill(tok, jnp.asarray([5]), out.hidden, out.logits[:, 4],
                                                   jnp.asarray([0])), 40)
        return drafter.propose(bundle, state, DraftContext(jnp.zeros((1, 40), jnp.int32), jnp.asarray([6]),
                                                           jnp.asarray([0]), jnp.asarray([5])), None)[0]

    tree = first_tree(bundle)
    drafted = np.asarray(tree.tokens)[0, 1:][np.asarray(tree.valid)[0, 1:]]
    assert drafted.size and set(drafted.tolist()) <= set(task.vocab.d2t.tolist())

    task.export(params, str(tmp_path / "drafter"))  # the map travels with the folder
    loaded, loaded_bundle = sbj.load_drafter(tmp_path / "drafter", target)
    assert loaded.config.draft_vocab_size == K
    np.testing.assert_array_equal(np.asarray(loaded_bundle["t2d"]), task.vocab.t2d)
    losses, _ = train_on_fixed_batch(task, V, steps=3)  # the restricted training loss runs
    assert np.all(np.isfinite(losses))


@pytest.mark.slow
def test_sampling_with_a_draft_vocabulary_matches_the_target_distribution(tmp_path):
    """The engine's distribution test with a 5-of-8 draft vocabulary: tokens outside it can only
    come from the verifier's residual and bonus draws, and the distribution stays exact."""
    cfg = sbj.models.config.tiny(vocab_size=8, eos_token_ids=())
    t = sbj.init_target(cfg, seed=5)
    small = t.replace(params={**t.params, "lm_head": t.params["lm_head"] * 15.0})
    draft_vocab.save(tmp_path, draft_vocab.make(np.asarray([3, 0, 6, 1, 4]), 8))
    task = Eagle3Task({"num_nodes": 8, "top_k": 3, "depth": 3, "draft_vocab_size": 5,
                       "draft_vocab": str(tmp_path)}, small)
    drafter = task.decoding_drafter(task.init_params(jax.random.key(4)))
    prompt, draws = [1, 2, 3], 6000
    counts, _ = sampled_pair_counts(small, drafter, 8, prompt, draws)
    assert chi_square_pvalue(counts, exact_pair_distribution(small, prompt, 1.0)) > 1e-3
    assert chi_square_pvalue(counts, exact_pair_distribution(small, prompt, 1.25)) < 1e-6
    outside = [2, 5, 7]
    assert counts[:, outside].sum() > 0  # the target still produces tokens the drafter cannot


def test_export_load_and_a_mismatched_map_is_refused(target, tmp_path):
    task = Eagle3Task({"num_nodes": 8, "top_k": 2, "depth": 3, "draft_vocab_size": K,
                       "draft_vocab": _vocab_file(target, tmp_path / "v")}, target)
    losses, _ = train_on_fixed_batch(task, V)
    assert losses[-1] < 0.8 * losses[0]  # the restricted loss trains
    out = tmp_path / "drafter"
    task.export(task.init_params(jax.random.key(0)), str(out))
    drafter, bundle = sbj.load_drafter(out, target)
    assert drafter.config.draft_vocab_size == K
    np.testing.assert_array_equal(np.asarray(bundle["d2t"]), task.vocab.d2t)

    (out / draft_vocab.FILE).unlink()
    with pytest.raises(ValueError, match="no draft_vocab.safetensors"):
        sbj.load_drafter(out, target)
    draft_vocab.save(out, draft_vocab.make(np.arange(K + 1), V))  # one id too many for the head
    with pytest.raises(ValueError, match=f"d2t has shape \\({K + 1},\\), the drafter's head has {K}"):
        sbj.load_drafter(out, target)
    meta = json.loads((out / "config.json").read_text())
    meta["config"]["draft_vocab_size"] = 0  # a config that disagrees with the stored head
    (out / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="lm_head"):
        sbj.load_drafter(out, target)
