"""EAGLE-3-style drafter: dynamic tree vs a slow reference, training/decoding agreement, losslessness,
training steps, save/load."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import specblock_jax as sbj
from specblock_jax.drafters.eagle3._model import Eagle3Drafter
from specblock_jax.drafters.eagle3._train import Eagle3Task
from specblock_jax.models.attention import attend
from specblock_jax.models.layers import rope_cos_sin
from specblock_jax.training.losses import shift
from specblock_jax.drafters.io import load_drafter, save_drafter
from specblock_jax.drafters.base import Prefill
from specblock_jax.drafters.eagle3._topk_tree import build_topk_tree
from helpers import train_on_fixed_batch

V = 8


# ------------------------------------------------------------------ dynamic tree vs reference

def _path_logp(w, path):
    """A deterministic 'drafter': next-token log-probs depend on the whole path so far."""
    h = sum((i + 1) * 7 + t * 13 for i, t in enumerate(path)) % w.shape[0]
    z = w[h]
    return z - np.log(np.exp(z).sum())


def _reference_tree(root, w, k, depth, n):
    """EAGLE-2 as plain Python: candidates (score, index, token, parent index)."""
    cands = []
    lp = _path_logp(w, [root])
    for tok in np.argsort(-lp, kind="stable")[:k]:
        cands.append((lp[tok], len(cands), int(tok), -1, [root, int(tok)]))
    frontier = list(range(k))
    for _ in range(1, depth):
        pool = []
        for f in frontier:
            lp = _path_logp(w, cands[f][4])
            for tok in np.argsort(-lp, kind="stable")[:k]:
                pool.append((cands[f][0] + lp[tok], f, int(tok)))
        pool.sort(key=lambda x: -x[0])  # stable: ties keep the order above
        frontier = []
        for score, f, tok in pool[:k]:
            frontier.append(len(cands))
            cands.append((score, len(cands), tok, f, cands[f][4] + [tok]))
    chosen = sorted(sorted(cands, key=lambda c: -c[0])[: n - 1], key=lambda c: c[1])
    node = {c[1]: i + 1 for i, c in enumerate(chosen)}
    return [root] + [c[2] for c in chosen], [-1] + [0 if c[3] < 0 else node[c[3]] for c in chosen]


@pytest.mark.parametrize("k,depth,n", [(3, 3, 7), (4, 4, 16), (2, 5, 11)])
def test_topk_tree_matches_reference(k, depth, n):
    rng = np.random.default_rng(k * 10 + depth)
    w = rng.normal(size=(97, V)).astype(np.float32) * 2
    root = 3

    paths = {}  # candidate index -> its token path from the root, filled as the tree grows

    def tracking_expander(carry, tokens, parent, node, anc, d):
        for i in range(tokens.shape[1]):
            m, p = int(node[0, i]), int(parent[0, i])
            paths[m] = (paths[p] if p >= 0 else [root]) + [int(tokens[0, i])]
        out = [_path_logp(w, paths[int(node[0, i])]) for i in range(tokens.shape[1])]
        return carry, jnp.asarray(np.stack(out))[None]

    tree, _ = build_topk_tree(jnp.asarray([root]), jnp.asarray(_path_logp(w, [root]))[None],
                              tracking_expander, None, k, depth, n)
    tokens, parents = _reference_tree(root, w, k, depth, n)
    assert np.asarray(tree.tokens)[0].tolist() == tokens
    assert np.asarray(tree.parents)[0].tolist() == parents
    assert np.asarray(tree.valid)[0].all()


# ------------------------------------------------------------------ drafter on a tiny target

@pytest.fixture(scope="module")
def task(target):
    return Eagle3Task({"num_nodes": 12, "top_k": 3, "depth": 4, "ttt_steps": 7}, target)


def _features(target, tokens, layers):
    tok = jnp.asarray(tokens)
    out = sbj.models.apply(target.graphdef, target.params, tok, jnp.broadcast_to(jnp.arange(tok.shape[1]), tok.shape),
                           sbj.models.causal_mask(*tok.shape), hidden_ids=layers)
    return out.hidden, out.logits


def test_training_time_test_matches_decoding_side_drafting(target, task):
    """Step 0 of TTT == the decoding state after prefill; step 1 == the depth-2 expansion."""
    params = task.init_params(jax.random.key(1))
    model_params = {"draft": params, "embed": target.params["embed_tokens"]}
    drafter = Eagle3Drafter(task.config, task.graphdef, num_nodes=1 + V * 2, top_k=V, depth=2)
    prefix = [5, 1, 7, 2, 6]  # x_0 .. x_4, root x_5 = 3
    root = 3
    # decoding side: the full tree with k = V holds every depth-1 token and the top V pairs
    hidden, logits = _features(target, [prefix], task.config.feature_layers)
    pre = Prefill(jnp.asarray([prefix]), jnp.asarray([len(prefix)]), hidden, logits[:, -1], jnp.asarray([root]))
    state = drafter.init_state(model_params, pre, 32)
    ctx = sbj.drafters.DraftContext(jnp.zeros((1, 40), jnp.int32), jnp.asarray([6]), jnp.asarray([root]),
                                    jnp.asarray([5]))
    tree, _ = jax.jit(drafter.propose)(model_params, state, ctx, None)
    # training side
    model = nnx.merge(task.graphdef, params)

    @jax.jit
    def ttt_logq(seq):
        """The TTT recurrence of eagle3_train.ttt_loss on one sequence [1, T]: the step-0 and step-1
        log-probs at index t = 4 (one compile; the V sequences share it)."""
        h, _ = _features(target, seq, task.config.feature_layers)
        b, t = seq.shape
        idx = jnp.arange(t)
        feat = model.fuse(h)
        keys, values, outs = [], [], []
        for j in range(2):
            tok = shift(seq, j + 1)
            cos, sin = rope_cos_sin(jnp.broadcast_to(idx + j, (b, t)), model.c.rope, model.c.head_dim, feat.dtype)
            q, k, v = model.layer.project(jnp.take(target.params["embed_tokens"], tok, axis=0), feat, cos, sin)
            keys.append(k)
            values.append(v)
            blocks = [idx[:, None] >= idx[None, :]] + [jnp.eye(t, dtype=bool)] * j
            mask = jnp.broadcast_to(jnp.concatenate(blocks, axis=1), (b, t, t * (j + 1)))
            feat = model.layer.finish(feat, attend(q, jnp.concatenate(keys, 1), jnp.concatenate(values, 1), mask))
            outs.append(jax.nn.log_softmax(model.logits(feat), -1)[0, 4])
        return outs

    logq1 = {}
    for x in range(V):  # one sequence per depth-1 token x: prefix, root, x, pad
        logq0, logq1[x] = ttt_logq(jnp.asarray([prefix + [root, x, 0]]))
    np.testing.assert_allclose(jax.nn.log_softmax(state.logits[0]), logq0, atol=1e-5)
    pairs = sorted(((float(logq0[x] + logq1[x][c]), x, c) for x, c in itertools.product(range(V), range(V))),
                   reverse=True)[:V]
    toks, pars = np.asarray(tree.tokens)[0], np.asarray(tree.parents)[0]
    got = {(int(toks[pars[i]]), int(toks[i])) for i in range(1, len(toks)) if pars[i] > 0}
    assert got == {(x, c) for _, x, c in pairs}


def test_greedy_eagle3_decoding_equals_autoregressive(target, task):
    params = task.init_params(jax.random.key(2))
    bundle = task.decoding_drafter(params)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, V, rng.integers(1, 17)).tolist() for _ in range(12)]  # one bucket
    ar = sbj.generate(target, prompts, max_new_tokens=20, options=sbj.DecodeOptions(batch_size=4))
    for batch in (1, 4):
        spec = sbj.generate(target, prompts, drafter=bundle, max_new_tokens=20,
                            options=sbj.DecodeOptions(batch_size=batch))
        assert [s.token_ids for s in spec] == [a.token_ids for a in ar]


def test_train_steps_reduce_the_loss_on_a_fixed_batch(target, task):
    losses, metrics = train_on_fixed_batch(task, V)
    assert losses[-1] < 0.7 * losses[0]
    assert set(metrics) >= {f"acc_{j}" for j in range(7)} and 0 <= float(metrics["acc_0"]) <= 1


def test_save_and_load_round_trip(target, task, tmp_path):
    params = task.init_params(jax.random.key(5))
    drafter, _ = task.decoding_drafter(params)
    save_drafter(drafter, params, tmp_path, dtype="float32")
    loaded, loaded_params = load_drafter(tmp_path, target)
    assert (loaded.config, loaded.num_nodes, loaded.top_k, loaded.depth) == (
        drafter.config, drafter.num_nodes, drafter.top_k, drafter.depth)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded_params["draft"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other = sbj.init_target(sbj.models.config.tiny(vocab_size=16), seed=0)
    with pytest.raises(ValueError, match="drafter trained for vocab 8"):
        load_drafter(tmp_path, other)


@pytest.mark.slow
def test_calibration_times_each_setting_and_picks_the_fastest(target, task):
    from specblock_jax.serving.calibrate import calibrate

    bundle = task.decoding_drafter(task.init_params(jax.random.key(6)))
    out = calibrate(target, bundle, [[1, 2, 3], [4, 5, 6, 7]], {"num_nodes": (4, 7), "depth": (2,)},
                    max_new_tokens=12, draft_timing=True)
    assert out["kind"] == "eagle3" and out["knobs"] == ["num_nodes", "depth"]
    assert [(r["num_nodes"], r["depth"]) for r in out["table"]] == [(4, 2), (7, 2)]
    best = max(out["table"], key=lambda r: r["tokens_per_s"])
    assert out["best"] == {"num_nodes": best["num_nodes"], "depth": best["depth"]}
    assert set(out["verify_ms"]) == {1, 4, 7} and all(v > 0 for v in out["verify_ms"].values())
    assert all(r["draft_ms_per_token"] > 0 and r["tau"] >= 1 for r in out["table"])
    with pytest.raises(ValueError, match="knobs are"):  # a DFlash knob on an EAGLE-3 drafter
        calibrate(target, bundle, [[1, 2, 3]], {"block_size": (4,)})


def test_paper_baseline_preset_loads_by_name_and_stays_lossless(target, tmp_path):
    """Issue 57: the EAGLE-3 paper's baseline tree (depth 7 after the first forward = 8 levels here,
    top-k 10, 60 drafted tokens + the root) loads by name, from a folder and as a method string;
    settings given beside it win; an unknown preset names the kind's presets; greedy output is
    target-only's."""
    from specblock_jax.aot.presets import released_drafter
    from specblock_jax.serving.methods import resolve_method

    task = Eagle3Task({}, target)
    dr, dp = task.decoding_drafter(task.init_params(jax.random.key(1)))
    save_drafter(dr, dp["draft"], tmp_path / "e3", dtype="float32")
    d = load_drafter(tmp_path / "e3", target, preset="paper")
    assert (d.drafter.depth, d.drafter.top_k, d.drafter.num_nodes, d.drafter.forwards_per_step) == (8, 10, 61, 8)
    m = resolve_method(f"{tmp_path / 'e3'}:preset=paper:num_nodes=40", target)
    assert (m.loaded.drafter.depth, m.loaded.drafter.num_nodes) == (8, 40)
    assert released_drafter(f"{tmp_path / 'e3'}:preset=paper", target.config)[0].num_nodes == 61
    with pytest.raises(ValueError, match="no decoding preset 'papr' .presets: paper"):
        load_drafter(tmp_path / "e3", target, preset="papr")
    prompts = [[0, 5, 3, 6, 5, 3, 6, 5], [0, 7, 7, 4]]
    ref = sbj.generate(target, prompts, max_new_tokens=12)
    deep = load_drafter(tmp_path / "e3", target, preset="paper", top_k=4)  # the tiny vocabulary has 8 tokens
    out = sbj.generate(target, prompts, deep, max_new_tokens=12, options=sbj.DecodeOptions(batch_size=2))
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]
