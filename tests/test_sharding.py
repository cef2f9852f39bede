"""Scale-out: mesh parsing, partition rules, host shards (in process), and sharded training,
decoding and checkpoints on 8 simulated CPU devices (tests/multidevice_sharding.py, run in a
subprocess because this process already initialised JAX with one device).

Tolerances: fp32 relative 1e-5 on losses and (SGD) parameters; token-identical decoding; exact
(0.0) for checkpoint values restored onto another mesh.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType

from specblock_jax import parallel
from specblock_jax.models.config import tiny
from specblock_jax.models.target import abstract_target

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-5


def abstract_mesh(data: int, model: int) -> AbstractMesh:
    return AbstractMesh((data, model), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


# ------------------------------------------------------------------------------ in process

def test_parse_mesh():
    assert parallel.parse_mesh("data=4,model=2") == {"data": 4, "model": 2}
    assert parallel.parse_mesh("model=2") == {"data": 1, "model": 2}
    assert parallel.parse_mesh("data=-1,model=8") == {"data": -1, "model": 8}
    assert parallel.parse_mesh(None) == {"data": -1, "model": 1}
    for bad in ("data=4,pipe=2", "data", "data=x", "data=0", "data=-1,model=-1"):
        with pytest.raises(ValueError, match="mesh"):
            parallel.parse_mesh(bad)


def test_make_mesh_on_one_device():
    mesh = parallel.make_mesh("data=1,model=1")
    assert dict(mesh.shape) == {"data": 1, "model": 1}
    assert dict(parallel.make_mesh("data=-1").shape) == {"data": jax.device_count(), "model": 1}
    with pytest.raises(ValueError, match="needs 8 devices"):
        parallel.make_mesh("data=4,model=2")


def test_param_rules_split_heads_mlp_vocab_and_fsdp():
    _, params = abstract_target(tiny(num_heads=8, num_kv_heads=4, head_dim=8, attention_bias=True))
    train = parallel.ShardingPlan(abstract_mesh(4, 2), fsdp=True, fsdp_min_size=0)
    specs = {parallel.mesh.path_str(p): tuple(s.spec) for p, s in
             jax.tree_util.tree_leaves_with_path(train.param_shardings(params))}
    attn = "layers/self_attn/"  # stacked layers: a leading [L] axis, never split
    assert specs[attn + "q_proj"] == (None, "data", "model", None)  # [L, H, N, D]
    assert specs[attn + "k_proj"] == (None, "data", "model", None)  # [L, H, K, D]
    assert specs[attn + "o_proj"] == (None, "model", None, "data")  # [L, N, D, H]
    assert specs[attn + "q_bias"] == (None, "model", None)
    assert specs["layers/mlp/gate_proj"] == (None, "data", "model")  # [L, H, F]
    assert specs["layers/mlp/down_proj"] == (None, "model", "data")  # [L, F, H]
    assert specs["embed_tokens"] == ("model", None)  # [V, H]: gathered from, never FSDP
    assert specs["lm_head"] == ("data", "model")  # [H, V]
    assert specs["norm/weight"] == (None,)
    # decoding: no FSDP (weights replicated across data groups), tensor parallel kept
    decode = parallel.ShardingPlan(abstract_mesh(4, 2))
    assert tuple(decode.param_shardings(params)["layers"]["self_attn"]["q_proj"].spec) == (
        None, None, "model", None)
    # an indivisible dimension is replicated: 4 kv heads on an 8-way model axis
    wide = parallel.ShardingPlan(abstract_mesh(1, 8))
    assert tuple(wide.param_shardings(params)["layers"]["self_attn"]["k_proj"].spec) == (
        None, None, None, None)
    assert tuple(wide.param_shardings(params)["layers"]["self_attn"]["q_proj"].spec) == (
        None, None, "model", None)
    # small parameters are not FSDP-split by default (fsdp_min_size = 2**16 elements)
    default = parallel.ShardingPlan(abstract_mesh(4, 2), fsdp=True)
    assert tuple(default.param_shardings(params)["lm_head"].spec) == (None, "model")


def test_optimizer_state_follows_its_parameter():
    import optax

    params = {"layer": {"q_proj": np.zeros((64, 8, 8), np.float32)}, "norm": {"weight": np.ones(64)}}
    opt = jax.eval_shape(optax.adamw(1e-3).init, params)
    plan = parallel.ShardingPlan(abstract_mesh(4, 2), fsdp=True, fsdp_min_size=0)
    specs = {parallel.mesh.path_str(p): tuple(s.spec) for p, s in
             jax.tree_util.tree_leaves_with_path(plan.param_shardings(opt))}
    assert specs["0/mu/layer/q_proj"] == specs["0/nu/layer/q_proj"] == ("data", "model", None)
    assert specs["0/count"] == ()


def test_cache_and_bytes():
    plan = parallel.ShardingPlan(abstract_mesh(2, 4))
    k = jax.ShapeDtypeStruct((4, 4, 64, 8), np.float32)  # a drafter layer's [B, K, S, D]
    assert tuple(plan.cache_shardings({"k": k})["k"].spec) == ("data", "model", None, None)
    k = jax.ShapeDtypeStruct((3, 4, 4, 64, 8), np.float32)  # the target's stacked [L, B, K, S, D]
    assert tuple(plan.cache_shardings({"k": k})["k"].spec) == (None, "data", "model", None, None)
    mesh = parallel.make_mesh("data=1,model=1")
    one = parallel.ShardingPlan(mesh)
    tree = {"w": jax.ShapeDtypeStruct((8, 4), np.float32)}
    assert parallel.shard_bytes(tree, one.param_shardings(tree)) == 8 * 4 * 4


def test_host_shards():
    items = list(range(10))
    shards = [parallel.host_shard(items, i, 3) for i in range(3)]
    assert sorted(sum(shards, [])) == items  # nothing lost, nothing twice
    assert parallel.host_shard(items) == items  # one process: everything
    views = [parallel.HostShard(items, i, 3) for i in range(3)]
    assert [len(v) for v in views] == [3, 3, 3]  # equal lengths: every host runs as many steps
    assert [v[j] for v in views for j in range(3)] == [0, 3, 6, 1, 4, 7, 2, 5, 8]
    with pytest.raises(IndexError):
        views[0][3]
    assert parallel.host_max([3, 1]) == [3, 1] and parallel.host_min([2]) == [2]
    assert parallel.host_gather_floats([1.5]) == [1.5]


def test_initialize_without_a_cluster_is_a_no_op(monkeypatch):
    for name in parallel.distributed.ENV.values():
        monkeypatch.delenv(name, raising=False)
    assert parallel.initialize() is False
    with pytest.raises(ValueError, match="coordinator"):
        parallel.initialize(num_processes=2, process_id=1)
    with pytest.raises(ValueError, match="num_processes"):
        parallel.initialize(coordinator="localhost:1234")


def test_cli_mesh_errors_are_clear(tmp_path, capsys):
    from specblock_jax_cli.infer import decode
    from specblock_jax_cli.train import cli

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "def f():"}\n')
    with pytest.raises(SystemExit, match="--mesh: mesh 'data=2,model=2' needs 4 devices"):
        decode.main(["--prompts", str(prompts), "--out", str(tmp_path / "o.jsonl"),
                     "--random-target", "--mesh", "data=2,model=2"])
    with pytest.raises(SystemExit):
        cli.main(["target", "--config", "configs/target/reference.yaml", "--mesh", "data=1"])
    assert "the target trainer" in capsys.readouterr().err


# ------------------------------------------------------------------ 8 simulated devices

def run_checks(mode: str, tmp_path) -> dict:
    """Runs one mode of tests/multidevice_sharding.py (train, decode or checkpoint) in a subprocess
    with 8 simulated devices; each mode is its own test, so xdist workers run them side by side."""
    out = tmp_path / "checks.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "multidevice_sharding.py"), mode,
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(out.read_text())


def result(checks: dict, mode: str) -> dict:
    res = checks[mode]
    assert "error" not in res, res["error"]
    return res


@pytest.mark.slow
def test_sharded_training_matches_one_device(tmp_path):
    res = result(run_checks("train", tmp_path), "train")
    assert set(res["meshes"]) == {"8x1", "4x2", "2x4"}
    for name, entry in res["meshes"].items():
        sgd = entry["sgd"]
        assert sgd["loss_rel_diff"] < TOL, (name, sgd)
        assert sgd["params_rel_diff"] < TOL, (name, sgd)
        assert sgd["opt_rel_diff"] < TOL, (name, sgd)  # momentum buffers
        # the layout really is FSDP x tensor parallel, optimizer state like its parameter
        data, model = int(name[0]), int(name[2])
        assert entry["q_proj_shard"] == [128 // data, 8 // model, 8]  # [2H, N, D] of the drafter
        want = f"P('data', {repr('model') if model > 1 else None}, None)"
        assert entry["specs"]["layer/q_proj"] == want and entry["trace_q_proj_spec"] == want
    assert res["meshes"]["4x2"]["specs"]["layer/o_proj"] == "P('model', None, 'data')"


@pytest.mark.slow
def test_sharded_decoding_is_token_identical(tmp_path):
    res = result(run_checks("decode", tmp_path), "decode")
    assert set(res["meshes"]) == {"8x1", "4x2", "2x4"}
    for name, methods in res["meshes"].items():
        for method, entry in methods.items():
            assert entry["identical"], (name, method)
    assert set(res["meshes"]["4x2"]) == {"prompt_lookup", "eagle3", "blockpilot"}
    assert set(res["meshes"]["8x1"]) == {"ar"} and set(res["meshes"]["2x4"]) == {"specblock"}
    assert res["meshes"]["8x1"]["ar"]["batch_size"] == 8  # batch 4 rounded up to the data axis
    assert max(res["meshes"]["4x2"]["prompt_lookup"]["taus"]) > 1  # drafts really accepted
    assert res["cache_spec_2x4"] == "P(None, 'data', 'model', None, None)"  # [L, B, K, S, D]
    assert res["q_proj_spec_2x4"] == "P(None, None, 'model', None)"  # [L, H, N, D]
    # inside the compiled loop (S = 96) every cache buffer is split: [L, B/2, K/4, S, D] per device (and
    # a layer's slice [(1,) B/2, K/4, S, D] inside the scan over layers)
    shapes = set(res["loop_cache_shapes_2x4"])
    assert "f32[2,2,1,96,8]" in shapes, shapes
    assert all(re.fullmatch(r"f32\[(\d+,)?2,1,96,8\]", x) for x in shapes), shapes


@pytest.mark.slow
def test_checkpoint_saved_on_4x2_restores_on_8x1_and_1x1(tmp_path):
    res = result(run_checks("checkpoint", tmp_path), "checkpoint")
    for name, devices in (("8x1", 8), ("1x1", 1), ("none", 1)):
        entry = res["restore"][name]
        assert entry["max_abs_diff"] == 0.0, (name, entry)
        assert entry["q_proj_devices"] == devices, (name, entry)
    assert res["restore"]["8x1"]["q_proj_spec"] == "P('data', None, None)"
    # the trainer (AdamW) resumed the (4,2) run on (8,1): same losses as 4 uninterrupted steps
    # on one device
    resumed, straight = res["resumed_losses"], res["straight_losses"]
    assert len(resumed) == len(straight) == 4
    np.testing.assert_allclose(resumed, straight, rtol=TOL)


def test_cli_decodes_a_drafter_method_under_a_one_device_mesh(tmp_path):
    """--mesh with a drafter method: the CLI lays the drafter's weights out on the mesh (the served
    method rebuilt with them) and decodes token-identically to the run without a mesh."""
    from specblock_jax_cli.infer import decode

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "def f():"}\n{"id": "b", "prompt": "x = 1"}\n')
    common = ["--prompts", str(prompts), "--random-target", "--method", "prompt_lookup", "--max-new-tokens", "4"]
    assert decode.main([*common, "--out", str(tmp_path / "mesh.jsonl"), "--mesh", "data=1"]) == 0
    assert decode.main([*common, "--out", str(tmp_path / "plain.jsonl")]) == 0
    rows = [[json.loads(x)["token_ids"] for x in (tmp_path / f).read_text().splitlines()]
            for f in ("mesh.jsonl", "plain.jsonl")]
    assert rows[0] == rows[1] and len(rows[0]) == 2
