"""SpecBlock: masks and shift by hand, valid-prefix and rank-chain losses on constructed examples,
training == decoding for blocks 1 and 2, the rank-head tree, losslessness, training, save/load."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import specblock_jax as sbj
import specblock_jax.drafters.specblock._model as specblock_module
from specblock_jax.drafters.base import DraftContext, Prefill
from specblock_jax.drafters.specblock._model import SpecBlockDrafter, block_mask, layer_shift
from specblock_jax.drafters.specblock._train import SpecBlockTask, block_attention, block_masks, run_blocks
from specblock_jax.models.attention import attend
from specblock_jax.training.losses import draft_loss
from specblock_jax.training.losses import rank_loss as specblock_rank_loss
from specblock_jax.drafters.specblock._rank_tree import RankTreeSettings, build_rank_tree, rank_class, top_tokens
from helpers_sampling import chi_square_pvalue, exact_pair_distribution, sampled_pair_counts
from helpers import train_on_fixed_batch

V = 32


def _assert_block_attention(mask: np.ndarray, ms: list) -> None:
    """block_attention under block_masks, of the block over [block 1 | later blocks] keys that the
    hand-written mask [T*K, blocks * T*K] (T = 2, K = 3) covers == dense attention under that
    mask, in one query chunk and in one chunk per position."""
    blocks = mask.shape[1] // 6
    rng = np.random.default_rng(len(ms))
    q = jnp.asarray(rng.normal(size=(1, 6, 4, 8)), jnp.float32)
    kv = [(jnp.asarray(rng.normal(size=(1, 6, 2, 8)), jnp.float32),
           jnp.asarray(rng.normal(size=(1, 6, 2, 8)), jnp.float32)) for _ in range(blocks)]
    dense = attend(q, jnp.concatenate([k for k, _ in kv], 1), jnp.concatenate([v for _, v in kv], 1),
                   jnp.asarray(mask)[None])
    # jitted: one compile each instead of op-by-op dispatch
    see_first, see_local = jax.jit(lambda: block_masks(jnp.ones((1, 2), jnp.int32), 3, [jnp.asarray(m) for m in ms],
                                                       blocks - 1))()
    for chunk in (1, 2):
        got = jax.jit(lambda: block_attention(q, kv[0], see_first, kv[1:], see_local, 3, chunk=chunk))()
        np.testing.assert_allclose(np.asarray(got), np.asarray(dense), rtol=1e-5, atol=1e-6)
    # recomputed per chunk in the backward pass (`remat`): the same values and gradients
    w = jnp.asarray(rng.normal(size=(1, 6, 4, 8)), jnp.float32)

    def grads(remat):
        def loss(q, kv):
            return jnp.sum(w * block_attention(q, kv[0], see_first, kv[1:], see_local, 3, chunk=1, remat=remat))
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(q, kv)

    (v0, g0), (v1, g1) = grads(False), grads(True)
    np.testing.assert_allclose(float(v1), float(v0), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_block_masks_match_hand_written_matrices_for_k3():
    # two positions, K = 3: entry e = i * 3 + k sees every e' <= e
    np.testing.assert_array_equal(np.asarray(block_mask(2, 3)), np.tril(np.ones((6, 6), bool)))
    _assert_block_attention(np.tril(np.ones((6, 6), bool)), [])
    # block 2 drafted from slot M - 1 = 1: block-1 entries before i * 3 + 2, own slots <= k
    expected = np.array([
        # block 1 (i=0 | i=1)   block 2 (i=0 | i=1)
        [1, 1, 0, 0, 0, 0,      1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0,      1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0,      1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0,      0, 0, 0, 1, 0, 0],
        [1, 1, 1, 1, 1, 0,      0, 0, 0, 1, 1, 0],
        [1, 1, 1, 1, 1, 0,      0, 0, 0, 1, 1, 1]], bool)
    _assert_block_attention(expected, [2])
    # block 3 from slot 0 of block 2: block 2's first slot at the own position is visible too
    block2 = np.array([[1, 0, 0, 0, 0, 0]] * 3 + [[0, 0, 0, 1, 0, 0]] * 3, bool)
    _assert_block_attention(np.concatenate([expected[:, :6], block2, expected[:, 6:]], axis=1), [2, 1])


def test_layer_shift_is_exactly_the_formula():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(2, 5, 4, 8)).astype(np.float32)
    w = rng.normal(size=(16, 8)).astype(np.float32)
    got = np.asarray(layer_shift(jnp.asarray(h), jnp.asarray(w)))
    for k in range(4):
        prev = h[:, :, k - 1] if k else h[:, :, 0]
        np.testing.assert_allclose(got[:, :, k], h[:, :, k] @ w[:8] + prev @ w[8:], rtol=1e-5, atol=1e-5)


def _logq(argmaxes, v=5):
    """[1, P, K, v] log-probs whose argmax per (position, slot) is given."""
    x = np.full((1, len(argmaxes), len(argmaxes[0]), v), -3.0, np.float32)
    for p, row in enumerate(argmaxes):
        for k, a in enumerate(row):
            x[0, p, k, a] = 0.0
            x[0, p, k, (a + 1) % v] = -1.0 - 0.1 * (p + k)
    return jax.nn.log_softmax(jnp.asarray(x), -1)


def test_valid_prefix_loss_ignores_slots_after_the_first_error():
    want = jnp.asarray([[[0, 1, 2, 3], [0, 1, 2, 3]]])
    logq = _logq([[0, 4, 2, 3], [0, 1, 2, 3]])  # position 0: slot 1 wrong; position 1: all right
    target_p = jax.nn.one_hot(want, 5)
    mask = jnp.ones((1, 2, 4))
    ce = -np.asarray(jnp.sum(target_p * logq, -1))[0]  # [P, K]
    _, per_slot, acc = draft_loss(logq, target_p, want, mask, 0.8, valid_prefix=True)
    # slots 0-1 average both positions; slots 2-3 only position 1 (position 0 failed at slot 1)
    np.testing.assert_allclose(np.asarray(per_slot), [ce[:, 0].mean(), ce[:, 1].mean(), ce[1, 2], ce[1, 3]],
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(acc), [1, 0.5, 1, 1])
    _, plain, _ = draft_loss(logq, target_p, want, mask, 0.8, valid_prefix=False)
    np.testing.assert_allclose(np.asarray(plain), ce.mean(0), rtol=1e-6)
    # what the drafter says after the error at position 0 does not matter
    worse = logq.at[0, 0, 2:].set(jnp.log(jnp.full((2, 5), 0.2)))
    total, _, _ = draft_loss(logq, target_p, want, mask, 0.8, True)
    total2, _, _ = draft_loss(worse, target_p, want, mask, 0.8, True)
    assert float(total) == pytest.approx(float(total2), rel=1e-7)
    # prefix_norm="all": the same counted positions, divided by every position (2), not the valid ones
    _, summed, _ = draft_loss(logq, target_p, want, mask, 0.8, True, prefix_norm="all")
    np.testing.assert_allclose(np.asarray(summed), [ce[:, 0].mean(), ce[:, 1].mean(), ce[1, 2] / 2, ce[1, 3] / 2],
                               rtol=1e-6)
    with pytest.raises(ValueError, match="prefix_norm"):
        draft_loss(logq, target_p, want, mask, 0.8, True, prefix_norm="sum")


def test_rank_loss_drops_slots_after_the_first_misranked_one():
    rank_loss = jax.jit(specblock_rank_loss)  # one compile per shape, not op-by-op dispatch
    true_cls = jnp.asarray([[[0, 2, 1, 3]]])
    logits = jnp.asarray(np.eye(4, dtype=np.float32)[[0, 1, 1, 3]] * 5)[None, None]  # slot 1 wrong
    mask = jnp.ones((1, 1, 4))
    base, acc = rank_loss(logits, true_cls, mask)
    assert float(acc) == pytest.approx(0.75)
    changed, _ = rank_loss(logits.at[0, 0, 2:].set(0.0), true_cls, mask)
    assert float(changed) == pytest.approx(float(base), rel=1e-6)  # slots 2-3 are dropped
    moved, _ = rank_loss(logits.at[0, 0, 1].set(0.0), true_cls, mask)
    assert float(moved) != pytest.approx(float(base), rel=1e-3)  # the mis-ranked slot counts
    # under-estimating the rank costs more than over-estimating it by as much
    under, _ = rank_loss(jnp.asarray([[[[5.0, 0, 0, 0]]]]), jnp.asarray([[[1]]]), jnp.ones((1, 1, 1)))
    over, _ = rank_loss(jnp.asarray([[[[0, 0, 5.0, 0]]]]), jnp.asarray([[[1]]]), jnp.ones((1, 1, 1)))
    assert float(under) > float(over)
    np.testing.assert_array_equal(np.asarray(rank_class(jnp.asarray([0, 1, 3, 4, 9, 10, 500]))),
                                  [0, 1, 1, 2, 2, 3, 3])


# ------------------------------------------------------------------ the rank-head tree


def _paths(tree):
    toks, pars, valid = (np.asarray(x)[0] for x in (tree.tokens, tree.parents, tree.valid))
    out = set()
    for i in range(1, len(toks)):
        if valid[i]:
            path, j = [], i
            while j > 0:
                path.append(int(toks[j]))
                j = int(pars[j])
            out.add(tuple(reversed(path)))
    return out


def test_rank_tree_branches_gives_up_continues_and_merges_twins():
    """The public code's rule: a slot drafts slot_topk[class] tokens (its chain token included),
    the first block's slot 0 root_topk; a give-up stops the alternatives from that slot on (the
    chain stays); the next block continues from the deepest confident slot."""
    k, v = 4, 16
    # block 1: slot s prefers token 10 + s, then 1, 2, 3, ... (alternatives)
    lp1 = np.full((1, k, v), -9.0, np.float32)
    for s in range(k):
        lp1[0, s, 10 + s] = -0.1
        lp1[0, s, 1:4] = [-2.0, -2.5, -3.0]
    cls1 = jnp.asarray([[0, 1, 0, 3]])  # slot 1 doubtful (ranks 2-4), slot 3 gives up
    # block 2 (drafted from slot 1's chain node, M = 2): its slot 0 repeats block 1's slot 2
    # token; its slot 1 gives up (from there on no alternatives, the chain stays)
    lp2 = np.full((1, 1, k, v), -9.0, np.float32)
    for s in range(k):
        lp2[0, 0, s, [12, 5, 6, 7][s]] = -0.2
    top1 = top_tokens(jax.nn.log_softmax(jnp.asarray(lp1), -1), 10)

    def build(settings):
        """The tree and what the next block was drafted from (blk, slot, token, level), in one
        compile instead of op-by-op dispatch."""
        seen = {}

        def expand(carry, blk, slot, token, level):
            seen.update(blk=blk, slot=slot, token=token, level=jnp.int32(level))
            return carry, top_tokens(jnp.asarray(lp2), 10), jnp.asarray([[[0, 3, 0, 0]]], jnp.int32)

        def run():
            tree, _ = build_rank_tree(settings, jnp.asarray([0]), top1, cls1, expand, None)
            return tree, dict(seen)  # filled while tracing

        return jax.jit(run)()

    s = RankTreeSettings(num_nodes=40, max_blocks=2, beam=1, slot_topk=(2, 3, 10, 0), root_topk=2)
    tree, seen = build(s)
    assert {k: np.asarray(v).tolist() for k, v in seen.items()} == {"blk": [[0]], "slot": [[1]], "token": [[11]],
                                                                    "level": 2}
    chain = [(10,), (10, 11), (10, 11, 12), (10, 11, 12, 13)]  # the give-up slot's chain token stays
    # slot 0: root_topk 2; slot 1 (class 1): 3 tokens; slot 2 (class 0): 2 tokens; slot 3 gives up
    alts = [(1,), (10, 1), (10, 2), (10, 11, 1)]
    # block 2: its first token merges into its twin (10, 11, 12); slot 0 (class 0) keeps one
    # alternative (token 0: the best of the rest); slots 1-3 none (give-up at slot 1)
    block2 = [(10, 11, 12, 5), (10, 11, 12, 5, 6), (10, 11, 12, 5, 6, 7), (10, 11, 0)]
    assert _paths(tree) == set(chain + alts + block2)
    # the same tree with the rank head off: 2 alternatives everywhere, next block from slot 3
    s_fixed = RankTreeSettings(num_nodes=40, max_blocks=2, rank_tree=False, fixed_branch=2)
    tree, seen = build(s_fixed)
    assert np.asarray(seen["slot"]).tolist() == [[3]] and np.asarray(seen["token"]).tolist() == [[13]]
    assert len(_paths(tree)) == 4 * 3 + 4 * 3


def test_tree_settings_are_checked():
    with pytest.raises(ValueError, match="slot_topk"):
        RankTreeSettings(slot_topk=(0, 4, 10, 0))
    with pytest.raises(ValueError, match="root_topk"):
        RankTreeSettings(root_topk=0)


# ------------------------------------------------------------------ drafter on a tiny target


@pytest.fixture(scope="module")
def task(target):
    return SpecBlockTask({"num_nodes": 12, "num_blocks": 2}, target)


def test_an_unknown_prefix_norm_is_refused_when_the_task_is_built(target):
    with pytest.raises(ValueError, match="specblock: prefix_norm must be 'valid' or 'all', not 'sum'"):
        SpecBlockTask({"prefix_norm": "sum"}, target)


def test_training_blocks_match_decoding_blocks(target, task, monkeypatch):
    """Block 1 at the last prompt position == the state after prefill; block 2 drafted from slot
    j == the training block 2 with M = j + 1 whose token M ahead is the leaf's token."""
    params = task.init_params(jax.random.key(1))
    bundle = {"draft": params, "embed": target.params["embed_tokens"]}
    drafter = SpecBlockDrafter(task.config, task.graphdef, num_nodes=12)
    model = nnx.merge(task.graphdef, params)
    prefix, root, j, leaf = [5, 1, 7, 2, 6], 3, 1, 9
    seq = prefix + [root] + [4] * j + [leaf] + [0, 0, 0]
    tok = jnp.asarray([seq])
    out = sbj.models.apply(target.graphdef, target.params, tok, jnp.arange(len(seq))[None],
                           sbj.models.causal_mask(1, len(seq)), hidden_ids=task.config.feature_layers)
    train1, train2 = jax.jit(lambda h: run_blocks(model, target.params["embed_tokens"], model.features(h), tok,
                                                  jnp.ones_like(tok), [j + 1]))(out.hidden)
    p = len(prefix)
    pre = Prefill(jnp.asarray([prefix + [0, 0]]), jnp.asarray([p]), out.hidden[:, :p + 2],
                  out.logits[:, p - 1], jnp.asarray([root]))
    state = jax.jit(lambda: drafter.init_state(bundle, pre, 32))()
    _assert_top(state.top, 0, model.logits(train1[0, p - 1]))
    captured = {}

    def fake_tree(settings, root_, top, cls, expand, carry, token_map=None, floor=None):
        carry, top2, _ = expand(carry, jnp.zeros((1, 1), jnp.int32), jnp.full((1, 1), j, jnp.int32),
                                jnp.full((1, 1), leaf, jnp.int32), 2)
        captured["top"] = top2
        return sbj.trees.DraftTree(jnp.zeros((1, 12), jnp.int32), sbj.trees.chain_parents(1, 12),
                                  jnp.ones((1, 12), bool)), carry

    monkeypatch.setattr(specblock_module, "build_rank_tree", fake_tree)
    ctx = DraftContext(jnp.zeros((1, 40), jnp.int32), jnp.asarray([p + 1]), jnp.asarray([root]), jnp.asarray([p]))

    @jax.jit
    def block2_top(state):  # one compile instead of op-by-op dispatch; returns what the fake captured
        drafter.propose(bundle, state, ctx, None)
        return captured["top"]

    _assert_top(block2_top(state), (0, 0), model.logits(train2[0, p - 1]))


def _assert_top(top, index, logits):
    """The drafter's TopTokens at `index` are the best R tokens of `logits` [K, V] and their
    log-probs (R = the drafter's candidate count, 20 here)."""
    r = top.ids.shape[-1]
    want_lp, want_ids = jax.lax.top_k(jax.nn.log_softmax(logits, -1), r)
    np.testing.assert_allclose(np.asarray(top.logp[index]), np.asarray(want_lp), atol=2e-5)
    np.testing.assert_array_equal(np.asarray(top.ids[index]), np.asarray(want_ids))


@pytest.mark.parametrize("settings,batches", [({}, (1, 4)),
                                              ({"rank_tree": False, "max_blocks": 3, "beam": 2, "num_nodes": 20}, (4,))])
@pytest.mark.slow
def test_greedy_specblock_decoding_equals_autoregressive(target, task, settings, batches):
    params = task.init_params(jax.random.key(2))
    drafter, bundle = task.decoding_drafter(params)
    drafter = SpecBlockDrafter(drafter.config, drafter.graphdef, **{"num_nodes": 12, **settings})
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, V, rng.integers(1, 17)).tolist() for _ in range(8)]  # one bucket
    ar = sbj.generate(target, prompts, max_new_tokens=16, options=sbj.DecodeOptions(batch_size=4))
    for batch in batches:
        spec = sbj.generate(target, prompts, drafter=sbj.LoadedDrafter(drafter, bundle), max_new_tokens=16,
                            options=sbj.DecodeOptions(batch_size=batch))
        assert [s.token_ids for s in spec] == [a.token_ids for a in ar]
    assert drafter.forwards_per_step == drafter.max_blocks


@pytest.mark.parametrize("settings", [
    # one block, 7 alternatives per slot and room for all 4 * 8 candidates: every depth-1 token is
    # a sibling (8 children verified by recursive rejection) with chains below, so drafts get
    # accepted whatever this untrained drafter prefers
    {"num_nodes": 33, "max_blocks": 1, "rank_tree": False, "fixed_branch": 7},
    # the rank-head tree with a second block from 2 leaves (twins merged): all 8 tokens at the
    # first slot, so drafts still get accepted
    {"num_nodes": 40, "max_blocks": 2, "beam": 2, "rank_tree": True, "root_topk": 8, "slot_topk": (2, 4, 8, 0)},
])
@pytest.mark.slow
def test_sampling_with_specblock_matches_the_target_distribution(settings):
    """The engine's distribution test (test_speculative.py) with a SpecBlock drafter on V = 8."""
    cfg = sbj.models.config.tiny(vocab_size=8, eos_token_ids=())
    t = sbj.init_target(cfg, seed=5)
    params = dict(t.params)
    params["lm_head"] = params["lm_head"] * 15.0
    small = t.replace(params=params)
    sb_task = SpecBlockTask(settings, small)
    drafter = sb_task.decoding_drafter(sb_task.init_params(jax.random.key(4)))
    prompt, draws = [1, 2, 3], 6000
    counts, res = sampled_pair_counts(small, drafter, 8, prompt, draws)
    exact = exact_pair_distribution(small, prompt, 1.0)
    assert chi_square_pvalue(counts, exact) > 1e-3
    assert chi_square_pvalue(counts, exact_pair_distribution(small, prompt, 1.25)) < 1e-6
    assert np.mean([r.stats.tau == 2 for r in res]) > 0.1  # drafts were accepted


def test_train_steps_reduce_the_loss_on_a_fixed_batch(target):
    task = SpecBlockTask({"num_blocks": 3, "loss_fraction": 1.0}, target)
    losses, metrics = train_on_fixed_batch(task, V)
    assert losses[-1] < 0.7 * losses[0]
    assert {f"b{b}_acc_{j}" for b in (1, 2, 3) for j in range(4)} <= set(metrics)
    assert 0 <= float(metrics["b1_rank_acc"]) <= 1


def test_save_and_load_round_trip_with_overrides(target, task, tmp_path):
    params = task.init_params(jax.random.key(5))
    drafter, _ = task.decoding_drafter(params)
    sbj.save_drafter(drafter, params, tmp_path, dtype="float32")
    loaded, loaded_params = sbj.load_drafter(tmp_path, target, rank_tree=False)
    assert loaded.config == drafter.config and loaded.slot_topk == drafter.slot_topk
    assert loaded.rank_tree is False and drafter.rank_tree is True
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded_params["draft"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_update_equals_the_training_forward_at_the_committed_positions(target, task):
    """Two verifier updates (3 then 2 committed pairs, a chain accepted from a 12-node tree) leave
    the hidden states, log-probs and rank classes that the training forward (`run_blocks`, block 1)
    gives at the last committed pair of the whole sequence."""
    from specblock_jax.trees.verify import VerifyResult

    params = task.init_params(jax.random.key(7))
    bundle = {"draft": params, "embed": target.params["embed_tokens"]}
    drafter = SpecBlockDrafter(task.config, task.graphdef, num_nodes=12)
    model = nnx.merge(task.graphdef, params)
    seq = [5, 1, 7, 2, 6, 4, 0, 2, 3, 9, 8, 1, 1, 6, 2, 5, 7, 3, 0, 4, 2, 8]  # prompt 5, then committed
    tok = jnp.asarray([seq])
    out = sbj.models.apply(target.graphdef, target.params, tok, jnp.arange(len(seq))[None],
                           sbj.models.causal_mask(1, len(seq)), hidden_ids=task.config.feature_layers)
    train1 = jax.jit(lambda h: run_blocks(model, target.params["embed_tokens"], model.features(h), tok,
                                          jnp.ones_like(tok), [])[0])(out.hidden)  # [1, T, K, H]
    p, n = 5, 12
    pre = Prefill(tok[:, :p], jnp.asarray([p]), out.hidden[:, :p], out.logits[:, p - 1], tok[:, p])

    def commit(state, start, accepted):
        """The verifier accepted a chain of `accepted` drafts after the root at position start."""
        path = jnp.asarray([list(range(accepted + 1)) + [0] * (n - accepted - 1)])
        new = jnp.asarray([seq[start + 1:start + accepted + 2] + [-1] * (n - accepted - 1)])
        result = VerifyResult(path, jnp.asarray([accepted]), tok[:, start + accepted + 1], new)
        end = start + accepted + 1  # committed tokens in the target's cache afterwards
        ctx = DraftContext(jnp.zeros((1, 48), jnp.int32), jnp.asarray([end + 1]), tok[:, end], jnp.asarray([end]))
        return drafter.update(bundle, state, ctx, result, out.hidden[:, start:start + n])

    state = jax.jit(lambda: drafter.init_state(bundle, pre, 40))()
    for start, accepted in ((p, 2), (p + 3, 1)):
        state = jax.jit(commit, static_argnums=(1, 2))(state, start, accepted)
        last = start + accepted  # the last committed pair: its token is the bonus
        assert int(state.length[0]) == last + 1
        want = train1[0, last]  # [K, H]
        np.testing.assert_allclose(np.asarray(state.hidden[0]), np.asarray(want), atol=2e-5)
        logits = model.logits(want)
        _assert_top(state.top, 0, logits)
        np.testing.assert_array_equal(np.asarray(state.cls[0]),
                                      np.asarray(jnp.argmax(model.rank_logits(want, logits), -1)))


def test_a_layer_with_query_rows_writes_the_same_kv_and_gives_the_full_output_at_those_rows(task):
    """DecoderLayer(query_rows=...): the K/V written are bit-for-bit the full pass's; the output is
    the full output at the chosen rows (per row of the batch)."""
    model = nnx.merge(task.graphdef, task.init_params(jax.random.key(8)))
    layer, c = model.layers[-1], task.config
    b, t, size = 2, 12, 20
    x = jax.random.normal(jax.random.key(9), (b, t, c.hidden_size))
    cos, sin = sbj.models.layers.rope_cos_sin(jnp.arange(3, 3 + t)[None].repeat(b, 0), c.rope, c.head_dim,
                                              jnp.float32)
    starts = jnp.asarray([3, 5])
    mask = jnp.arange(size)[None, None] <= (starts[:, None] + jnp.arange(t))[:, :, None]
    shape = (b, c.num_kv_heads, size, c.head_dim)
    cache = tuple(jax.random.normal(jax.random.key(i), shape) for i in (10, 11))
    rows = jnp.asarray([[4, 5, 6, 7], [0, 1, 2, 3]])
    full, cheap = jax.jit(lambda: (layer(x, cos, sin, mask, cache, starts, 18),
                                   layer(x, cos, sin, mask, cache, starts, 18, query_rows=rows)))()
    for want, got in zip(full[1], cheap[1]):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    want = jnp.take_along_axis(full[0], rows[:, :, None], axis=1)
    np.testing.assert_allclose(np.asarray(cheap[0]), np.asarray(want), atol=1e-5)


def test_the_factored_fuse_equals_the_concatenated_input(task):
    """block_input (the pair's part once per position + the slot query's once per slot) ==
    concat([norm(c); norm(e); norm(q_k)]) @ fuse for every (position, slot)."""
    model = nnx.merge(task.graphdef, task.init_params(jax.random.key(12)))
    h, k = task.config.hidden_size, task.config.block_size
    cond, emb = (jax.random.normal(jax.random.key(i), (2, 5, h)) for i in (13, 14))
    shape = (2, 5, k, h)
    concat = jnp.concatenate([jnp.broadcast_to(model.cond_norm(cond)[:, :, None], shape),
                              jnp.broadcast_to(model.token_norm(emb)[:, :, None], shape),
                              jnp.broadcast_to(model.query_norm(model.slot_queries[...]), shape)], -1)
    want = concat @ model.fuse[...]
    got = model.block_input(cond, emb)
    assert got.shape == shape
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


def _full_update(drafter, bundle, state, ctx, result, hidden):
    """`update` through the plain block: every path row's slots through every layer, then the
    last committed pair's slots taken. Returns (caches, hidden [B, K, H], TopTokens, classes)."""
    model = drafter._model(bundle)
    count = ctx.cache_len - state.length
    n = result.path.shape[1]
    feats = model.features(jnp.take_along_axis(hidden, result.path[:, :, None, None], axis=1))
    h, caches = drafter._committed(model, bundle, state.cache, feats, jnp.maximum(result.new_tokens, 0),
                                   state.length, state.cache[0][0].shape[2], None)
    last = jnp.take_along_axis(h, jnp.clip(count - 1, 0, n - 1)[:, None, None, None], axis=1)[:, 0]
    top, cls = drafter._heads(model, last)
    return caches, last, top, cls


def test_the_cheaper_update_equals_the_full_pass(target, task):
    """The update that runs the last layer's attention and MLP only at the last committed pair
    leaves the state the full pass gives: the committed entries' K/V of every layer, the next
    tree's first block (hidden), its top tokens and rank classes; rows commit 3, 0 (finished) and
    1 pairs, from prompts of different lengths."""
    from specblock_jax.trees.verify import VerifyResult

    params = task.init_params(jax.random.key(15))
    bundle = {"draft": params, "embed": target.params["embed_tokens"]}
    drafter = SpecBlockDrafter(task.config, task.graphdef, num_nodes=12)
    c, k, n, b = task.config, task.config.block_size, 12, 3
    feat = (len(c.feature_layers), c.hidden_size)
    lengths = jnp.asarray([5, 3, 7])
    pre = Prefill(jax.random.randint(jax.random.key(16), (b, 8), 0, V), lengths,
                  jax.random.normal(jax.random.key(17), (b, 8) + feat), jnp.zeros((b, V)), jnp.asarray([1, 2, 3]))
    count = jnp.asarray([3, 0, 1])
    path = jnp.asarray([[0, 2, 5] + [0] * (n - 3), [0] * n, [0] * n])
    new = jax.random.randint(jax.random.key(18), (b, n), 0, V)
    new = jnp.where(jnp.arange(n) < count[:, None], new, -1)
    result = VerifyResult(path, count - 1, new[:, 0], new)
    ctx = DraftContext(jnp.zeros((b, 48), jnp.int32), lengths + count + 1, new[:, 0], lengths + count)
    hidden = jax.random.normal(jax.random.key(19), (b, n) + feat)

    @jax.jit
    def both():
        state = drafter.init_state(bundle, pre, 40)
        return drafter.update(bundle, state, ctx, result, hidden), _full_update(drafter, bundle, state, ctx,
                                                                                result, hidden)

    cheap, (caches, last, top, cls) = both()
    moved = np.asarray(count) > 0
    np.testing.assert_array_equal(np.asarray(cheap.length), np.asarray(lengths + count))
    for got_kv, want_kv in zip(cheap.cache, caches):
        for got, want in zip(got_kv, want_kv):
            for row, end in enumerate(np.asarray(lengths + count) * k):
                np.testing.assert_allclose(np.asarray(got[row, :, :end]), np.asarray(want[row, :, :end]), atol=1e-5)
    np.testing.assert_allclose(np.asarray(cheap.hidden)[moved], np.asarray(last)[moved], atol=2e-5)
    np.testing.assert_allclose(np.asarray(cheap.top.logp)[moved], np.asarray(top.logp)[moved], atol=2e-5)
    np.testing.assert_array_equal(np.asarray(cheap.top.ids)[moved], np.asarray(top.ids)[moved])
    np.testing.assert_array_equal(np.asarray(cheap.cls)[moved], np.asarray(cls)[moved])


def test_update_runs_the_smallest_row_bucket_that_holds_the_commit():
    from specblock_jax.drafters.common import row_buckets, switch_on_rows
    assert row_buckets(9) == (2, 4, 9) and row_buckets(17) == (2, 4, 8, 17)
    assert row_buckets(1) == (1,) and row_buckets(2) == (2,)
    for counts, want in (([0, 1], 2), ([3, 1], 4), ([9, 2], 9), ([5], 9), ([2], 2)):
        got = jax.jit(lambda c: switch_on_rows(c, 9, lambda r: jnp.int32(r)))(jnp.asarray(counts))
        assert int(got) == want, (counts, want)
