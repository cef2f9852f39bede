"""The released SpecBlock drafters (drafters/specblock/_released.py) and BlockPilot policy
(drafters/blockpilot/_released.py, `specblock-convert`): tiny checkpoints written by an independent
writer from the public code (tests/released_reference.py) import, match the reference forward /
predictor, round-trip identically, and every refusal names its field or reason."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import specblock_jax as sbj
from specblock_jax.drafters.specblock._model import block_mask

torch = pytest.importorskip("torch")
import released_reference as ref  # noqa: E402 (torch first)

V, KEEP, K = 32, 24, 4  # V, prompts, max_new_tokens as test_hf_format: one target-only compile
AUX = [0, 1, 2]  # decoder-layer outputs (their eagle_config) = HF hidden states 1, 2, 3


def _config(target, draft=KEEP, **extra):
    tc = target.config
    return ref.specblock_config(tc.hidden_size, 96, tc.num_heads, tc.num_kv_heads, 2, V, draft, K, AUX,
                                theta=tc.rope.theta, eps=tc.rms_norm_eps, **extra)


def _draft_ids():
    return np.random.default_rng(3).choice(V, KEEP, replace=False).tolist()


def _release(target, path, draft=KEEP, vocab_mapping=True, **extra):
    cfg = _config(target, draft, **extra)
    state = ref.random_specblock_state(cfg, _draft_ids() if draft < V else None)
    return ref.write_specblock(path, cfg, state, vocab_mapping), cfg, state


def _ours(loaded, target, tokens):
    """Block 1 of our imported drafter over `tokens`: (logits [S, K, V'], rank logits [S, K, 4],
    the target features [S, 3H] and next-token embeddings [S, H] it read)."""
    drafter, params = loaded
    c = drafter.config
    model = nnx.merge(drafter.graphdef, params["draft"])
    tok = jnp.asarray([tokens])
    s = len(tokens) - 1
    out = sbj.models.apply(target.graphdef, target.params, tok, jnp.arange(s + 1)[None],
                           sbj.models.causal_mask(1, s + 1), hidden_ids=c.feature_layers)
    emb = jnp.take(params["embed"], tok[:, 1:], axis=0)
    caches = tuple((jnp.zeros((1, c.num_kv_heads, s * K, c.head_dim)),) * 2 for _ in range(c.num_layers))
    hidden, _ = model.block(model.features(out.hidden[:, :s]), emb, jnp.arange(s)[None], block_mask(s, K)[None],
                            caches, jnp.zeros((1,), jnp.int32))
    logits = model.logits(hidden)
    return (np.asarray(logits[0]), np.asarray(model.rank_logits(hidden, logits)[0]),
            np.array(out.hidden[0, :s]).reshape(s, -1), np.array(emb[0]))


@pytest.mark.parametrize("draft,vocab_mapping", [(KEEP, True), (V, False)])
def test_released_specblock_matches_the_reference_forward(target, tmp_path, draft, vocab_mapping):
    """Logits and rank logits of an imported release match their forward_parallel within 1e-4
    (fp32); the imported drafter (reduced vocabulary) decodes token-identically to the target alone."""
    path, cfg, state = _release(target, tmp_path / "sb", draft, vocab_mapping)
    loaded = sbj.load_drafter(path, target, dtype="float32", num_nodes=12)
    assert loaded.drafter.config.feature_layers == (1, 2, 3) and loaded.drafter.config.rank_top1 == "top20"
    tokens = np.random.default_rng(4).integers(0, V, 10).tolist()
    logits, rank, aux, emb = _ours(loaded, target, tokens)
    ref_logits, ref_rank = ref.specblock_forward(state, cfg, torch.from_numpy(aux), torch.from_numpy(emb))
    diff = max(np.abs(logits - ref_logits.numpy()).max(), np.abs(rank - ref_rank.numpy()).max())
    print(f"max |logit diff| {np.abs(logits - ref_logits.numpy()).max():.2e}, "
          f"rank logits {np.abs(rank - ref_rank.numpy()).max():.2e}")
    assert diff < 1e-4
    assert np.array_equal(rank.argmax(-1), ref_rank.numpy().argmax(-1))
    if draft == V:
        return
    # head rows in their (target-id sorted) draft order; d2t maps them back
    assert np.array_equal(np.asarray(loaded.params["d2t"]), np.sort(_draft_ids()))
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    ar = sbj.generate(target, prompts, max_new_tokens=12, options=sbj.DecodeOptions(batch_size=2))
    spec = sbj.generate(target, prompts, drafter=loaded, max_new_tokens=12, options=sbj.DecodeOptions(batch_size=2))
    assert [r.token_ids for r in spec] == [r.token_ids for r in ar]


def test_released_specblock_round_trips_identically(target, tmp_path):
    """release -> ours -> release: every tensor bit-identical, every config field their code reads
    equal; ours -> release -> ours (through `specblock-convert specblock`): identical params."""
    from safetensors.numpy import load_file
    from specblock_jax_cli.train import convert

    path, cfg, _ = _release(target, tmp_path / "sb")
    loaded = sbj.load_drafter(path, target, dtype="float32")
    sbj.save_drafter(*loaded, tmp_path / "back", dtype="float32", format="specblock_hf",
                     max_positions=cfg["max_position_embeddings"])
    a, b = load_file(str(path / "model.safetensors")), load_file(str(tmp_path / "back" / "model.safetensors"))
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert {k: back[k] for k in back if k != "specblock"} == {k: cfg[k] for k in back if k != "specblock"}

    sbj.save_target(target, tmp_path / "target")
    argv = ["--target", str(tmp_path / "target"), "--dtype", "float32"]
    assert convert.main(["specblock", str(path), str(tmp_path / "ours"), *argv]) == 0
    assert "kind" in json.loads((tmp_path / "ours" / "config.json").read_text())
    assert convert.main(["specblock", str(tmp_path / "ours"), str(tmp_path / "again"), *argv]) == 0
    again = sbj.load_drafter(tmp_path / "again", target, dtype="float32")
    ours = sbj.load_drafter(tmp_path / "ours", target, dtype="float32")
    assert again.drafter == ours.drafter
    for x, y in zip(jax.tree.leaves(ours.params), jax.tree.leaves(again.params)):
        assert np.array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("edit,field", [
    (lambda c: c.update(vocab_size=V + 1), "vocab_size"),
    (lambda c: c.update(hidden_size=128), "hidden_size"),
    (lambda c: c.update(target_hidden_size=32), "target_hidden_size"),
    (lambda c: c.update(rank_classes=5), "rank_classes"),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    (lambda c: c.update(model_type="qwen3"), "model_type"),
    (lambda c: c.update(head_dim=32), "head_dim"),
    (lambda c: c.update(num_key_value_heads=3), "num_attention_heads"),
    (lambda c: c.update(num_hidden_layers=0), "num_hidden_layers"),
    (lambda c: c.update(diffspec_draft_token_num=0), "diffspec_draft_token_num"),
    (lambda c: c.update(draft_vocab_size=10), "draft_vocab_size"),
    (lambda c: c.pop("draft_vocab_size"), "draft_vocab_size"),
    (lambda c: c.pop("intermediate_size"), "intermediate_size"),
    (lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_scaling"),
    (lambda c: c.update(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "rope_scaling"),
    (lambda c: c.update(eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1]}),
     "eagle_config.eagle_aux_hidden_state_layer_ids"),
    (lambda c: c.update(eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 9]}),
     "eagle_config.eagle_aux_hidden_state_layer_ids"),
    (lambda c: c.update(specblock={"kind": "eagle3"}), "specblock.kind"),
])
def test_released_config_mismatches_are_refused_naming_the_field(target, tmp_path, edit, field):
    path, cfg, _ = _release(target, tmp_path / "sb")
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"config field '{field}'"):
        sbj.load_drafter(path, target)


@pytest.mark.parametrize("preset", sorted(ref.PUBLIC_CONFIGS))
def test_the_public_specblock_configs_load_abstractly_at_their_targets(preset, tmp_path):
    """The released configs import against the Qwen3-8B / Llama-3.1-8B presets with no weights:
    widths, layers, draft vocabulary, slots, RoPE and feature layers as their code builds them."""
    from specblock_jax.aot import load_preset
    from specblock_jax.drafters import hf_format
    from specblock_jax.drafters.common import abstract_model, config_from_meta
    from specblock_jax.drafters.specblock._model import SpecBlockConfig, SpecBlockModel

    tc = load_preset(preset)
    meta = hf_format.import_meta(tmp_path, ref.PUBLIC_CONFIGS[preset], tc)
    c = config_from_meta(SpecBlockConfig, meta, "bfloat16")
    n = tc.num_layers
    assert (c.num_layers, c.block_size, c.head_size, c.feature_layers) == (2, 4, 32000, (2, n // 2, n - 3))
    assert c.rope.theta == (1e6 if preset.startswith("qwen3") else 1e4) and c.rope.kind == "default"
    shapes = {k: v.shape for k, v in jax.tree_util.tree_leaves_with_path(abstract_model(SpecBlockModel, c)[1])
              for k in [jax.tree_util.keystr(k)]}
    assert shapes["['lm_head']"] == (4096, 32000) and shapes["['fc']"] == (3 * 4096, 4096)
    assert shapes["['shift']"] == (1, 8192, 4096) and shapes["['rank_in']"] == (4096 + 15, 256)


def test_released_defaults_feature_layers_and_rope_parameters(target, tmp_path):
    """Without eagle_config the features are their serving code's [2, L/2, L-3]; a transformers-5
    `rope_parameters` alone is read as rope_theta / rope_scaling."""
    path, cfg, _ = _release(target, tmp_path / "sb")
    cfg.pop("eagle_config")
    theta = cfg.pop("rope_theta")
    cfg.pop("rope_scaling")
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    (path / "config.json").write_text(json.dumps(cfg))
    drafter, _ = sbj.load_drafter(path, target)
    n = target.config.num_layers
    assert drafter.config.feature_layers == (2, n // 2, n - 3) and drafter.config.rope.theta == theta


def _edit_tensors(path, fn):
    from safetensors.torch import load_file, save_file

    w = load_file(str(path / "model.safetensors"))
    fn(w)
    save_file(w, str(path / "model.safetensors"))


@pytest.mark.parametrize("fn,match", [
    (lambda w: w.pop("shift_proj.0.weight"), "'shift_proj.0.weight' is missing"),
    (lambda w: w.pop("rank_head.2.weight"), "'rank_head.2.weight' is missing"),
    (lambda w: w.update({"rank_head.0.bias": torch.zeros(256)}), "unexpected tensors"),
    (lambda w: w.update({"lm_head.weight": torch.zeros(KEEP + 1, 64)}), "'lm_head.weight' has shape"),
    (lambda w: w["t2d"].__setitem__(slice(None), True), "vocab_mapping.pt disagrees"),
    (lambda w: w.update({"input_layer.embed_tokens.weight": torch.ones(V, 64)}), "not the target's embedding"),
])
def test_released_tensor_problems_are_refused(target, tmp_path, fn, match):
    path, _, _ = _release(target, tmp_path / "sb")
    _edit_tensors(path, fn)
    with pytest.raises(ValueError, match=match):
        sbj.load_drafter(path, target)


def test_released_vocabulary_problems_are_refused(target, tmp_path):
    path, _, _ = _release(target, tmp_path / "sb", vocab_mapping=False)
    _edit_tensors(path, lambda w: w["t2d"].__setitem__(slice(None), True))
    with pytest.raises(ValueError, match="'t2d' does not mark"):
        sbj.load_drafter(path, target)
    path, _, _ = _release(target, tmp_path / "full", draft=V, vocab_mapping=False)
    _edit_tensors(path, lambda w: w["d2t"].__setitem__(0, 1))
    with pytest.raises(ValueError, match="'d2t' maps a full-size"):
        sbj.load_drafter(path, target)


@pytest.mark.parametrize("config,bias,match", [
    ({"layer_shift": False}, 0.0, "layer_shift is off"),
    ({"rank_top1": "vocab"}, 0.0, "over the top 20"),
    ({}, 1.0, "non-zero rank_out_bias"),
])
def test_export_refuses_what_the_release_cannot_hold(target, tmp_path, config, bias, match):
    import dataclasses

    path, _, _ = _release(target, tmp_path / "sb")
    drafter, params = sbj.load_drafter(path, target, dtype="float32")
    drafter = dataclasses.replace(drafter, config=dataclasses.replace(drafter.config, **config))
    params = {**params, "draft": {**params["draft"], "rank_out_bias": params["draft"]["rank_out_bias"] + bias}}
    with pytest.raises(ValueError, match=match):
        sbj.save_drafter(drafter, params, tmp_path / "out", format="specblock_hf", target=target)


# ------------------------------------------------------------------------------------ BlockPilot


@pytest.fixture(scope="module")
def dflash_dir(target, tmp_path_factory):
    from specblock_jax.drafters.dflash._train import DFlashTask

    task = DFlashTask({"num_layers": 1, "block_size": 16, "num_anchors": 3, "mask_token_id": 3}, target)
    params = task.init_params(jax.random.key(1))
    path = tmp_path_factory.mktemp("dflash")
    sbj.save_drafter(task.decoding_drafter(params)[0], params, path, dtype="float32")
    return path


def test_released_blockpilot_picks_the_sizes_their_predictor_picks(target, dflash_dir, tmp_path):
    """model.pt -> `specblock-convert blockpilot` -> our policy folder: on the same raw-logit
    features (random, and the target's own after real prompts) it picks exactly the sizes their
    predictor picks in fp32; model.pt -> ours -> model.pt is bit-identical."""
    from specblock_jax_cli.train import convert

    model = ref.write_blockpilot(tmp_path / "model.pt", V, 64)
    sbj.save_target(target, tmp_path / "target")
    out = tmp_path / "policy"
    assert convert.main(["blockpilot", str(tmp_path / "model.pt"), str(out), "--dflash", str(dflash_dir),
                         "--target", str(tmp_path / "target")]) == 0
    from specblock_jax.drafters.blockpilot import choose

    drafter, params = sbj.load_drafter(out, target, dtype="float32")
    assert drafter.policy.sizes == (14, 15, 16, 17, 18) and drafter.policy.features == "logits"
    rng = np.random.default_rng(0)
    real = np.asarray(sbj.forward(target, jnp.asarray(rng.integers(0, V, (32, 8))))[:, -1])
    feats = np.concatenate([rng.normal(0, 4, (480, V)).astype(np.float32), real])
    ours = np.asarray(choose(drafter.policy_graphdef, params["policy"], drafter.policy, jnp.asarray(feats)))
    theirs = ref.blockpilot_predict(model, feats, torch.float32)
    bf16 = ref.blockpilot_predict(model, feats, torch.bfloat16)
    print(f"size agreement: fp32 {np.mean(ours == theirs):.4f}, their bf16 run {np.mean(ours == bf16):.4f} "
          f"over {len(feats)}; sizes used {sorted(set(ours.tolist()))}")
    assert np.array_equal(ours, theirs) and len(set(ours.tolist())) >= 3
    assert convert.main(["blockpilot", str(out), str(tmp_path / "back.pt")]) == 0
    a, b = torch.load(tmp_path / "model.pt"), torch.load(tmp_path / "back.pt")
    assert list(a) == list(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kw,match", [
    ({"input_dim": 64 + 1}, "reads 65 features"),
    ({"n_layers": 1}, "1 hidden layers"),
    ({"n_layers": 3}, "3 hidden layers"),
])
def test_released_blockpilot_policies_we_cannot_compute_are_refused(dflash_dir, tmp_path, kw, match):
    from specblock_jax_cli.train import convert

    ref.write_blockpilot(tmp_path / "model.pt", **{"input_dim": V, "hidden_dim": 32, **kw})
    with pytest.raises(SystemExit, match=match):
        convert.main(["blockpilot", str(tmp_path / "model.pt"), str(tmp_path / "out"), "--dflash", str(dflash_dir)])


def test_blockpilot_export_refuses_what_their_predictor_cannot_compute():
    from specblock_jax.drafters.blockpilot._model import PolicyConfig
    from specblock_jax.drafters.blockpilot._released import state_from_policy

    def params(policy, std=1.0):
        dense = lambda i, o: {"kernel": np.ones((i, o), np.float32), "bias": np.zeros((o,), np.float32)}  # noqa: E731
        return {"mean": np.zeros((policy.in_dim,)), "std": np.full((policy.in_dim,), std),
                "inp": dense(policy.in_dim, 8), "mid": dense(8, 8), "out": dense(8, len(policy.sizes))}

    sizes = (14, 15, 16, 17, 18)
    for policy, match in ((PolicyConfig(sizes, "topk", width=8), "features 'topk'"),
                          (PolicyConfig(sizes, "logits", vocab_size=V, width=8), "before the ReLU"),
                          (PolicyConfig((2, 4, 8), "logits", vocab_size=V, width=8, residual="post_relu"), "sizes")):
        with pytest.raises(ValueError, match=match):
            state_from_policy(policy, params(policy))
    policy = PolicyConfig(sizes, "logits", vocab_size=V, width=8, residual="post_relu")
    assert set(state_from_policy(policy, params(policy))) == {"layers.0.weight", "layers.0.bias", "layers.1.weight",
                                                              "layers.1.bias", "fc_out.weight", "fc_out.bias"}
    with pytest.raises(ValueError, match="standardisation"):
        state_from_policy(policy, params(policy, std=2.0))
