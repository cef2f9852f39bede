"""Drafters in serving-engine layouts (drafters/hf_format.py): round trips, a checkpoint written
independently (torch, from the layouts' documented tensor names) against a torch reference forward
of EAGLE-3, and the config checks an engine would trip on."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import specblock_jax as sbj
from specblock_jax.drafters import draft_vocab
from specblock_jax.drafters.dflash._train import DFlashTask
from specblock_jax.drafters.eagle3._train import Eagle3Task

V, KEEP = 32, 20


@pytest.fixture(scope="module")
def eagle(target, tmp_path_factory):
    """(drafter, decoding params) of a random EAGLE-3 drafter with a 20-token draft vocabulary
    whose draft ids are not in target-id order."""
    counts = np.random.default_rng(0).integers(1, 100, V)
    path = tmp_path_factory.mktemp("vocab")
    draft_vocab.save(path, draft_vocab.from_counts(counts, KEEP))
    task = Eagle3Task({"num_nodes": 8, "top_k": 2, "depth": 3, "draft_vocab_size": KEEP,
                       "draft_vocab": str(path)}, target)
    params = jax.tree.map(lambda x: x * 3.0 if x.ndim >= 2 else x, task.init_params(jax.random.key(3)))
    return task.decoding_drafter(params)


def _eagle_logits(drafter, params, target, tokens):
    """Draft logits mapped to target ids ([T, V], -inf outside the draft vocabulary) of one pass
    over `tokens` (pairs: feature of token t, embedding of token t + 1)."""
    model = nnx.merge(drafter.graphdef, params["draft"])
    tok = jnp.asarray([tokens])
    t = tok.shape[1] - 1
    out = sbj.models.apply(target.graphdef, target.params, tok, jnp.arange(t + 1)[None],
                           sbj.models.causal_mask(1, t + 1), hidden_ids=drafter.config.feature_layers)
    emb = jnp.take(params["embed"], tok[:, 1:], axis=0)
    c = drafter.config
    cache = (jnp.zeros((1, c.num_kv_heads, t, c.head_dim)),) * 2
    mask = jnp.tril(jnp.ones((t, t), bool))[None]
    h, _ = model.step(emb, model.fuse(out.hidden[:, :t]), jnp.arange(t)[None], mask, cache,
                      jnp.zeros((1,), jnp.int32), jnp.int32(t))
    logits = np.asarray(model.logits(h)[0])
    full = np.full((t, V), -np.inf, np.float32)
    full[:, np.asarray(params["d2t"])] = logits
    return full


@pytest.mark.parametrize("fmt", ["eagle3", "speculators"])
@pytest.mark.slow
def test_eagle3_export_import_round_trip(target, eagle, fmt, tmp_path):
    drafter, params = eagle
    sbj.save_drafter(drafter, params, tmp_path, dtype="float32", format=fmt,
                     max_positions=target.config.max_position_embeddings)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["draft_vocab_size"] == KEEP and hf["eagle_aux_hidden_state_layer_ids"] == list(drafter.config.feature_layers)
    loaded, lp = sbj.load_drafter(tmp_path, target)
    assert (loaded.config, loaded.num_nodes, loaded.top_k, loaded.depth) == (
        drafter.config, drafter.num_nodes, drafter.top_k, drafter.depth)
    assert np.all(np.diff(np.asarray(lp["d2t"])) > 0)  # reordered by target id, as EAGLE-3 stores it
    tokens = np.random.default_rng(1).integers(0, V, 12).tolist()
    np.testing.assert_allclose(_eagle_logits(loaded, lp, target, tokens),
                               _eagle_logits(drafter, params, target, tokens), rtol=1e-5, atol=1e-5)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    ar = sbj.generate(target, prompts, max_new_tokens=16, options=sbj.DecodeOptions(batch_size=2))
    a = sbj.generate(target, prompts, drafter=sbj.LoadedDrafter(drafter, params), max_new_tokens=16,
                     options=sbj.DecodeOptions(batch_size=2))
    b = sbj.generate(target, prompts, drafter=sbj.LoadedDrafter(loaded, lp), max_new_tokens=16,
                     options=sbj.DecodeOptions(batch_size=2))
    assert [r.token_ids for r in b] == [r.token_ids for r in a] == [r.token_ids for r in ar]
    assert [(r.stats.tau, r.stats.target_forwards) for r in b] == [(r.stats.tau, r.stats.target_forwards) for r in a]


def _rms(x, w, eps):
    import torch

    return w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta):  # x [T, heads, D], HF rotate-half
    import torch

    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.cat([pos[:, None] * inv[None]] * 2, -1)
    cos, sin = ang.cos()[:, None].float(), ang.sin()[:, None].float()
    rot = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + rot * sin


def _reference_eagle3(w, cfg, aux, embeds):
    """EAGLE-3's one-layer forward (speculators / EAGLE `cnets.py`, written from their equations):
    aux [T, 3H] target states, embeds [T, H] of the next tokens -> draft logits [T, V']."""
    import torch

    eps, nh, nkv, d = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    p = "layers.0."
    h = aux @ w["fc.weight"].T
    u = torch.cat([_rms(embeds, w[p + "input_layernorm.weight"], eps), _rms(h, w[p + "hidden_norm.weight"], eps)], -1)
    t = u.shape[0]
    pos = torch.arange(t, dtype=torch.float64)
    q = _rope((u @ w[p + "self_attn.q_proj.weight"].T).view(t, nh, d), pos, cfg["rope_theta"])
    k = _rope((u @ w[p + "self_attn.k_proj.weight"].T).view(t, nkv, d), pos, cfg["rope_theta"])
    v = (u @ w[p + "self_attn.v_proj.weight"].T).view(t, nkv, d)
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    scores = torch.einsum("qnd,knd->nqk", q, k) / d ** 0.5
    scores = scores.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool)), float("-inf"))
    attn = torch.einsum("nqk,knd->qnd", scores.softmax(-1), v).reshape(t, nh * d)
    h1 = h + attn @ w[p + "self_attn.o_proj.weight"].T
    x = _rms(h1, w[p + "post_attention_layernorm.weight"], eps)
    mlp = (torch.nn.functional.silu(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T))
    h2 = h1 + mlp @ w[p + "mlp.down_proj.weight"].T
    return _rms(h2, w["norm.weight"], eps) @ w["lm_head.weight"].T


@pytest.mark.slow
def test_independent_speculators_checkpoint_matches_the_reference_forward(target, tmp_path):
    """A checkpoint written with torch from the speculators layout's tensor names and config
    fields (not by our exporter) imports, and its draft logits match a torch reference forward
    of EAGLE-3 within 1e-4 (fp32); the imported drafter decodes losslessly."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    tc = target.config
    h, nh, nkv, d, f = tc.hidden_size, tc.num_heads, tc.num_kv_heads, tc.head_dim, tc.intermediate_size
    ids = sorted(np.random.default_rng(2).choice(V, KEEP, replace=False).tolist())
    g = torch.Generator().manual_seed(0)
    shapes = {"fc.weight": (h, 3 * h), "layers.0.self_attn.q_proj.weight": (nh * d, 2 * h),
              "layers.0.self_attn.k_proj.weight": (nkv * d, 2 * h), "layers.0.self_attn.v_proj.weight": (nkv * d, 2 * h),
              "layers.0.self_attn.o_proj.weight": (h, nh * d), "layers.0.mlp.gate_proj.weight": (f, h),
              "layers.0.mlp.up_proj.weight": (f, h), "layers.0.mlp.down_proj.weight": (h, f),
              "lm_head.weight": (KEEP, h)}
    w = {k: torch.randn(s, generator=g) * 0.15 for k, s in shapes.items()}
    for k in ("layers.0.input_layernorm.weight", "layers.0.hidden_norm.weight",
              "layers.0.post_attention_layernorm.weight", "norm.weight"):
        w[k] = 1.0 + 0.1 * torch.randn(h, generator=g)
    d2t = torch.tensor(ids, dtype=torch.int64) - torch.arange(KEEP)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    aux_ids = [1, 2, 3]
    save_file({**w, "d2t": d2t, "t2d": t2d}, str(tmp_path / "model.safetensors"))
    layer = {"model_type": "llama", "vocab_size": V, "hidden_size": h, "intermediate_size": f,
             "num_hidden_layers": 1, "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": d,
             "rms_norm_eps": tc.rms_norm_eps, "rope_theta": tc.rope.theta, "hidden_act": "silu",
             "max_position_embeddings": tc.max_position_embeddings, "tie_word_embeddings": False}
    cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "draft_vocab_size": KEEP,
           "norm_before_residual": False, "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": aux_ids,
           "transformer_layer_config": layer,
           "speculators_config": {"algorithm": "eagle3", "proposal_methods": [{"proposal_type": "greedy",
                                  "speculative_tokens": 3}], "verifier": {"name_or_path": "tiny"}}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    drafter, params = sbj.load_drafter(tmp_path, target, num_nodes=8, top_k=2, depth=3)
    assert drafter.config.feature_layers == tuple(aux_ids)

    tokens = np.random.default_rng(4).integers(0, V, 14).tolist()
    ours = _eagle_logits(drafter, params, target, tokens)[:, ids]
    tok = jnp.asarray([tokens])
    out = sbj.models.apply(target.graphdef, target.params, tok, jnp.arange(len(tokens))[None],
                           sbj.models.causal_mask(1, len(tokens)), hidden_ids=tuple(aux_ids))
    aux = torch.from_numpy(np.array(out.hidden[0, :-1]).reshape(len(tokens) - 1, -1))
    embeds = torch.from_numpy(np.array(target.params["embed_tokens"])[tokens[1:]])
    ref = _reference_eagle3(w, layer, aux, embeds).numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=1e-4)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    ar = sbj.generate(target, prompts, max_new_tokens=12, options=sbj.DecodeOptions(batch_size=2))
    spec = sbj.generate(target, prompts, drafter=sbj.LoadedDrafter(drafter, params), max_new_tokens=12,
                        options=sbj.DecodeOptions(batch_size=2))
    assert [r.token_ids for r in spec] == [r.token_ids for r in ar]


def test_dflash_export_import_round_trip(target, tmp_path):
    task = DFlashTask({"num_layers": 2, "block_size": 4, "num_anchors": 3, "mask_token_id": 3}, target)
    params = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, task.init_params(jax.random.key(1)))
    drafter, bundle = task.decoding_drafter(params)
    sbj.save_drafter(drafter, params, tmp_path, dtype="float32", format="dflash",
                     max_positions=target.config.max_position_embeddings)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["dflash_config"]["target_layer_ids"] == [i - 1 for i in drafter.config.feature_layers]
    (tmp_path / "config.json").write_text(json.dumps({**hf, "specblock": None}))  # as a public release
    loaded, lp = sbj.load_drafter(tmp_path, target)
    assert loaded.config == drafter.config and loaded.block_size == 4
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(lp["draft"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    for temperature in (0.0, 1.0):  # greedy and sampled: the same draws with the same weights
        a = sbj.generate(target, prompts, drafter=sbj.LoadedDrafter(drafter, bundle), max_new_tokens=12, seed=4,
                         sampling=sbj.Sampling(temperature), options=sbj.DecodeOptions(batch_size=2))
        b = sbj.generate(target, prompts, drafter=sbj.LoadedDrafter(loaded, lp), max_new_tokens=12, seed=4,
                         sampling=sbj.Sampling(temperature), options=sbj.DecodeOptions(batch_size=2))
        assert [r.token_ids for r in b] == [r.token_ids for r in a]
        assert [(r.stats.tau, r.stats.target_forwards) for r in b] == [
            (r.stats.tau, r.stats.target_forwards) for r in a]


@pytest.mark.parametrize("edit,field", [
    (lambda c: c.update(vocab_size=V + 1), "vocab_size"),
    (lambda c: c.update(hidden_size=128), "hidden_size"),
    (lambda c: c.update(rope_theta=5e5), "rope_theta"),
    (lambda c: c.update(max_position_embeddings=64), "max_position_embeddings"),
    (lambda c: c.update(norm_before_residual=True), "norm_before_residual"),
    (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 3, 9],
                        eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 8]}),
     "eagle_aux_hidden_state_layer_ids"),
    (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[2, 3, 4]),
     "eagle_config.eagle_aux_hidden_state_layer_ids"),
])
def test_engine_config_mismatches_are_refused_naming_the_field(target, eagle, tmp_path, edit, field):
    drafter, params = eagle
    sbj.save_drafter(drafter, params, tmp_path, dtype="float32", format="eagle3",
                     max_positions=target.config.max_position_embeddings)
    cfg = json.loads((tmp_path / "config.json").read_text())
    edit(cfg)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"'{field}'"):
        sbj.load_drafter(tmp_path, target)


def test_foreign_embedding_and_chat_format_are_refused(target, eagle, tmp_path):
    from safetensors.numpy import load_file, save_file

    drafter, params = eagle
    chat = {"chat_template_sha256": "abc", "enable_thinking": False}
    sbj.save_drafter(drafter, params, tmp_path, dtype="float32", format="eagle3",
                     max_positions=target.config.max_position_embeddings, chat=chat)
    with pytest.raises(ValueError, match="enable_thinking"):
        sbj.load_drafter(tmp_path, target, chat={**chat, "enable_thinking": True})
    sbj.load_drafter(tmp_path, target, chat=chat)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    save_file({**tensors, "embed_tokens.weight": np.asarray(target.params["embed_tokens"]) + 0.5},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="embed_tokens.weight"):
        sbj.load_drafter(tmp_path, target)
    with pytest.raises(ValueError, match="format 'dflash' holds dflash drafters"):
        sbj.save_drafter(drafter, params, tmp_path / "x", format="dflash")


def _reference_dflash(w, cfg, feats, block_emb, head):
    """z-lab DFlash's block forward (written from its `dflash/model.py` equations): context
    features [P, n*H] of the prompt, block embeddings [B, H] ([root, MASK, ...] at positions P..),
    non-causal attention over [context K/V; block K/V] -> logits [B - 1, V] of offsets 1.."""
    import torch

    eps, nh, nkv, d = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    theta = cfg["rope_theta"]
    p_len, b_len = feats.shape[0], block_emb.shape[0]
    ctx = _rms(feats @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    pos_ctx = torch.arange(p_len, dtype=torch.float64)
    pos_blk = p_len + torch.arange(b_len, dtype=torch.float64)
    x = block_emb
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        xn = _rms(x, w[p + "input_layernorm.weight"], eps)
        q = _rms((xn @ w[p + "self_attn.q_proj.weight"].T).view(b_len, nh, d), w[p + "self_attn.q_norm.weight"], eps)
        q = _rope(q, pos_blk, theta)
        kc = _rms((ctx @ w[p + "self_attn.k_proj.weight"].T).view(p_len, nkv, d), w[p + "self_attn.k_norm.weight"], eps)
        kb = _rms((xn @ w[p + "self_attn.k_proj.weight"].T).view(b_len, nkv, d), w[p + "self_attn.k_norm.weight"], eps)
        k = torch.cat([_rope(kc, pos_ctx, theta), _rope(kb, pos_blk, theta)], 0)
        v = torch.cat([(ctx @ w[p + "self_attn.v_proj.weight"].T).view(p_len, nkv, d),
                       (xn @ w[p + "self_attn.v_proj.weight"].T).view(b_len, nkv, d)], 0)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        attn = torch.einsum("qnd,knd->nqk", q, k) / d ** 0.5
        out = torch.einsum("nqk,knd->qnd", attn.softmax(-1), v).reshape(b_len, nh * d)
        x = x + out @ w[p + "self_attn.o_proj.weight"].T
        y = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + (torch.nn.functional.silu(y @ w[p + "mlp.gate_proj.weight"].T)
                 * (y @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return _rms(x, w["norm.weight"], eps)[1:] @ head


@pytest.mark.slow
def test_independent_dflash_checkpoint_matches_the_reference_forward(target, tmp_path):
    """A DFlash checkpoint written with torch from the release's tensor names and config fields
    imports, and its block logits match a torch reference forward within 1e-4 (fp32)."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file
    from specblock_jax.drafters.base import Prefill
    from specblock_jax.drafters.common import target_head

    tc = target.config
    h, nh, nkv, d, f = tc.hidden_size, tc.num_heads, tc.num_kv_heads, tc.head_dim, tc.intermediate_size
    layers, block, layer_ids, mask_id = 2, 4, [0, 1, 3], 5
    g = torch.Generator().manual_seed(1)
    w = {"fc.weight": torch.randn(h, len(layer_ids) * h, generator=g) * 0.1}
    for name in ("hidden_norm.weight", "norm.weight"):
        w[name] = 1.0 + 0.1 * torch.randn(h, generator=g)
    for i in range(layers):
        p = f"layers.{i}."
        for name, shape in {"self_attn.q_proj.weight": (nh * d, h), "self_attn.k_proj.weight": (nkv * d, h),
                            "self_attn.v_proj.weight": (nkv * d, h), "self_attn.o_proj.weight": (h, nh * d),
                            "mlp.gate_proj.weight": (f, h), "mlp.up_proj.weight": (f, h),
                            "mlp.down_proj.weight": (h, f)}.items():
            w[p + name] = torch.randn(shape, generator=g) * 0.15
        for name, n in (("input_layernorm.weight", h), ("post_attention_layernorm.weight", h),
                        ("self_attn.q_norm.weight", d), ("self_attn.k_norm.weight", d)):
            w[p + name] = 1.0 + 0.1 * torch.randn(n, generator=g)
    save_file(w, str(tmp_path / "model.safetensors"))
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": block,
           "num_target_layers": tc.num_layers, "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": layer_ids},
           "vocab_size": V, "hidden_size": h, "intermediate_size": f, "num_hidden_layers": layers,
           "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": d, "rms_norm_eps": tc.rms_norm_eps,
           "rope_theta": tc.rope.theta, "max_position_embeddings": tc.max_position_embeddings,
           "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    drafter, params = sbj.load_drafter(tmp_path, target, draft_mode="greedy")
    assert drafter.config.feature_layers == tuple(i + 1 for i in layer_ids) and drafter.block_size == block

    tokens = np.random.default_rng(5).integers(0, V, 9).tolist()
    p_len, root = len(tokens), 7
    tok = jnp.asarray([tokens])
    out = sbj.models.apply(target.graphdef, target.params, tok, jnp.arange(p_len)[None],
                           sbj.models.causal_mask(1, p_len), hidden_ids=drafter.hidden_ids)
    prefill = Prefill(tok, jnp.asarray([p_len]), out.hidden, out.logits[:, -1], jnp.asarray([root]))
    state = drafter.init_state(params, prefill, p_len + 2 * block)
    ours = np.asarray(drafter.draft_logits(params, state, jnp.asarray([root]))[0])
    embed = np.array(target.params["embed_tokens"])
    emb = torch.from_numpy(embed[[root] + [mask_id] * (block - 1)])
    feats = torch.from_numpy(np.array(out.hidden[0]).reshape(p_len, -1))
    ref = _reference_dflash(w, cfg, feats, emb, torch.from_numpy(np.array(target_head(target)))).numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=1e-4)
