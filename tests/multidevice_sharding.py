"""Sharding checks on 8 simulated CPU devices, run by tests/test_sharding.py in a subprocess
(the pytest process already initialised JAX with one device).

    python tests/multidevice_sharding.py all|train|decode|checkpoint OUT.json

Each mode writes measured quantities as JSON under its name; the test asserts on them:
  train       the EAGLE-3 train step (tiny target, frozen) for meshes (8,1), (4,2), (2,4) against
              one device: per-step losses, final params and momentum (SGD + momentum)
  decode      sbj.generate greedy on meshes (8,1), (4,2), (2,4): target-only, prompt lookup, EAGLE-3,
              SpecBlock and BlockPilot (random drafters), token ids compared with target-only
              decoding on one device
  checkpoint  trainer (AdamW) run on (4,2) saved by orbax, restored on (8,1), (1,1) and one
              device, and resumed by the trainer on (8,1) vs an uninterrupted one-device run
"""

from __future__ import annotations

import functools
import json
import shutil
import traceback
import sys
import tempfile
import time
from pathlib import Path

import jax

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_platforms", "cpu")

import numpy as np  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

import specblock_jax as sbj  # noqa: E402
from specblock_jax import parallel  # noqa: E402
from specblock_jax.drafters.blockpilot._model import BlockPilotDrafter, PolicyConfig, init_policy  # noqa: E402
from specblock_jax.drafters.dflash._model import DFlashDrafter  # noqa: E402
from specblock_jax.drafters.dflash._train import DFlashTask  # noqa: E402
from specblock_jax.drafters.eagle3._train import Eagle3Task  # noqa: E402
from specblock_jax.drafters.specblock._train import SpecBlockTask  # noqa: E402
from specblock_jax.parallel.training import TrainLayout  # noqa: E402
from specblock_jax.training.regen_dataset import BatchIterator  # noqa: E402
from specblock_jax.trainer.trainer import (make_optimizer, make_train_step,  # noqa: E402
                                            train, train_step_fn, with_defaults)

MESHES = {"8x1": "data=8,model=1", "4x2": "data=4,model=2", "2x4": "data=2,model=4"}
# 8 query / 4 kv heads, so every model-axis size above really splits the heads
CFG = sbj.models.config.tiny(num_layers=2, num_heads=8, num_kv_heads=4, head_dim=8,
                              tie_word_embeddings=True)
# (tied: with an untied target Eagle3Task.init_params starts lm_head as the target's own buffer,
# which the donating train step then frees while `frozen` still uses it, on one device too)
TASK_CFG = {"ttt_steps": 2, "num_nodes": 8, "top_k": 2, "depth": 3}


@functools.lru_cache(maxsize=1)
def target() -> sbj.Target:
    return sbj.init_target(CFG, seed=3)


def records(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        a = int(rng.integers(3, CFG.vocab_size - 20))
        body = list(range(a + 2, a + 2 + int(rng.integers(6, 14))))
        out.append({"id": f"r{i}", "mode": "greedy", "prompt_ids": [0, a, a + 1],
                    "response_ids": body + [1]})
    return out


def batches(n: int) -> list[dict]:
    it = BatchIterator(records(64), batch_size=8, max_len=24, seed=0)
    return [next(it) for _ in range(n)]


def tree_diff(a, b) -> float:
    """Max |a - b| / (max |a| + 1e-30) over leaves (relative to each leaf's scale)."""
    worst = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        worst = max(worst, float(np.max(np.abs(x - y)) / (np.max(np.abs(x)) + 1e-30)))
    return worst


def run_train(steps: int = 3) -> dict:
    """Same batches, same keys, one device vs each mesh, through the trainer's step function with
    SGD + momentum, so that parameters can be compared at fp32 tolerance. (With AdamW, compared in
    run_checkpoint on losses, parameters are not comparable that way: Adam divides by
    sqrt(v) + eps, so a gradient entry below eps = 1e-8 moves by lr * g / eps and its fp32
    rounding noise from another reduction order (~1e-10 absolute, gradients agree to ~5e-7
    relative) is amplified by lr / eps = 1e6; see docs/scale_out.md.)"""
    tgt = target()
    task = Eagle3Task(TASK_CFG, tgt)
    cfg = with_defaults({"run_dir": "x", "out_dir": "x", "lr": 1e-2, "warmup_steps": 1,
                         "max_steps": steps})
    optimizers = {"sgd": optax.sgd(0.5, momentum=0.9)}
    data = batches(steps)
    key = jax.random.key(0)

    def run(mesh_spec, tx):
        params = task.init_params(key)
        frozen = task.frozen()
        if mesh_spec is None:
            step, opt = make_train_step(task, tx), tx.init(params)
        else:
            plan = parallel.ShardingPlan(parallel.make_mesh(mesh_spec), fsdp=True, fsdp_min_size=0)
            layout = TrainLayout.make(plan, tx, params, frozen)
            params, frozen = layout.put(params), layout.put_frozen(frozen)
            opt = layout.init_opt(params)
            step = layout.jit_step(train_step_fn(task, tx))
        losses = []
        t0 = time.perf_counter()
        for i, batch in enumerate(data):
            params, opt, metrics = step(params, opt, frozen, batch, jax.random.fold_in(key, i))
            losses.append(float(metrics["loss"]))
        out = {"losses": losses, "params": parallel.fetch(params), "opt": parallel.fetch(opt),
               "seconds": time.perf_counter() - t0}
        if mesh_spec is not None:
            out["specs"] = {parallel.mesh.path_str(p): str(s.spec) for p, s in
                            jax.tree_util.tree_leaves_with_path(layout.params)}
            out["q_proj_shard"] = list(params["layer"]["q_proj"].addressable_shards[0].data.shape)
            out["trace_q_proj_spec"] = next(
                (str(s.spec) for p, s in jax.tree_util.tree_leaves_with_path(layout.opt_state)
                 if parallel.mesh.path_str(p).endswith("trace/layer/q_proj")), None)
        return out

    result = {"meshes": {}}
    for opt_name, tx in optimizers.items():
        ref = run(None, tx)
        result[f"ref_losses_{opt_name}"] = ref["losses"]
        for name, spec in MESHES.items():
            got = run(spec, tx)
            entry = result["meshes"].setdefault(name, {})
            entry[opt_name] = {
                "losses": got["losses"],
                "loss_rel_diff": max(abs(a - b) / abs(b) for a, b in zip(got["losses"], ref["losses"])),
                "params_rel_diff": tree_diff(got["params"], ref["params"]),
                "opt_rel_diff": tree_diff(got["opt"], ref["opt"]), "seconds": got["seconds"]}
            entry["specs"] = {k: got["specs"][k] for k in (
                "fc", "layer/q_proj", "layer/o_proj", "layer/mlp/down_proj", "lm_head")}
            entry["q_proj_shard"] = got["q_proj_shard"]
            entry["trace_q_proj_spec"] = got["trace_q_proj_spec"]
    return result


def run_decode() -> dict:
    tgt = target()
    rng = np.random.default_rng(1)
    prompts = []
    for i in range(10):  # repetitive prompts, so prompt lookup accepts drafts; one length bucket
        motif = rng.integers(3, CFG.vocab_size, size=int(rng.integers(2, 5))).tolist()
        prompts.append(([0] + motif * 6)[: int(rng.integers(5, 17))])
    kw = dict(max_new_tokens=12, sampling=sbj.Sampling(0.0))
    task = Eagle3Task(TASK_CFG, tgt)
    eagle = task.decoding_drafter(task.init_params(jax.random.key(5)))
    sb_task = SpecBlockTask({"num_nodes": 10, "num_blocks": 2}, tgt)
    specblock = sb_task.decoding_drafter(sb_task.init_params(jax.random.key(6)))
    df_task = DFlashTask({"num_layers": 1, "block_size": 4, "num_anchors": 3, "mask_token_id": 3}, tgt)
    dflash, df_params = df_task.decoding_drafter(df_task.init_params(jax.random.key(7)))
    policy = PolicyConfig((2, 3, 4), "topk", 4, CFG.vocab_size, 16)
    graphdef, pparams = init_policy(policy, seed=3)
    pilot = sbj.LoadedDrafter(BlockPilotDrafter(DFlashDrafter(dflash.config, dflash.graphdef, block_size=4), policy,
                                                graphdef), {"dflash": df_params, "policy": pparams})
    methods = {"ar": None, "prompt_lookup": sbj.load_drafter("prompt_lookup", tgt), "eagle3": eagle,
               "specblock": specblock, "blockpilot": pilot}
    # greedy: every method's output is the target's own (the lossless tests prove it on one device),
    # so each mesh run is compared with target-only decoding on one device. (BlockPilot serves all
    # sizes in one masked loop at max(sizes) under a mesh; on one device each batch's loop runs at
    # its rows' largest size.)
    ar = [r.token_ids for r in sbj.generate(tgt, prompts, **kw, options=sbj.DecodeOptions(batch_size=4))]
    out = {"ref_lengths": [len(t) for t in ar], "meshes": {}}
    for name, spec in MESHES.items():
        mesh = parallel.make_mesh(spec)
        # each method once, on a mesh that splits what it must handle: target-only on the data axis
        # alone (the batch rounded up to it), the drafters with the model axis split too
        use = {"8x1": ["ar"], "4x2": ["prompt_lookup", "eagle3", "blockpilot"], "2x4": ["specblock"]}[name]
        out["meshes"][name] = {}
        for m in use:
            res = sbj.generate(tgt, prompts, drafter=methods[m], **kw,
                               options=sbj.DecodeOptions(batch_size=4, mesh=mesh))
            out["meshes"][name][m] = {
                "identical": [r.token_ids for r in res] == ar,
                "taus": [r.stats.tau for r in res],
                "batch_size": res[0].stats.batch_size}
    # the decode layout: KV cache and weights really split
    plan = parallel.ShardingPlan(parallel.make_mesh(MESHES["2x4"]))
    cache = sbj.init_cache(CFG, 4, 64)
    out["cache_spec_2x4"] = str(plan.cache_shardings(cache).k.spec)
    out["q_proj_spec_2x4"] = str(plan.param_shardings(tgt.params)["layers"]["self_attn"]["q_proj"].spec)
    out["loop_cache_shapes_2x4"] = loop_cache_shapes(plan, tgt)
    return out


def loop_cache_shapes(plan, tgt, b: int = 4, p: int = 16, s: int = 96) -> dict[str, int]:
    """Per-device shapes of [(L,) B, K, S, D] f32 buffers in the compiled, SPMD-partitioned decode loop
    (target-only) and how often each occurs: the KV cache inside the while loop must be split.
    S (96) differs from every weight dimension, so weights never match."""
    import collections
    import functools
    import re

    from specblock_jax.decoding.loop import decode_loop, make_loop
    from specblock_jax.decoding.loop_core import LoopInputs
    from specblock_jax.decoding.sampling import SamplingParams
    from specblock_jax.parallel.decoding import run_sharded

    def rows(shape, dt):
        return jax.ShapeDtypeStruct(shape, dt, sharding=plan.batch_sharding(len(shape)))

    psh = plan.param_shardings(tgt.params)
    inputs = LoopInputs(rows((b, p), np.int32), rows((b,), np.int32), rows((b,), np.int32),
                        SamplingParams(rows((b,), np.float32), rows((b,), np.int32), rows((b,), np.float32)),
                        jax.ShapeDtypeStruct((8,), np.int32, sharding=plan.replicated()), rows((b, 2), np.uint32))
    args = (jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), tgt.params, psh),
            (), inputs)
    fn = functools.partial(run_sharded, plan, decode_loop, make_loop(graphdef=tgt.graphdef, cfg=CFG, cache_len=s,
                                                                         max_new=8))
    text = jax.jit(fn).lower(*args).compile().as_text()
    pattern = rf"f32\[(?:\d+,)?\d+,\d+,{s},{CFG.head_dim}\]"  # [L, B, K, S, D] or one layer's slice
    return dict(collections.Counter(re.findall(pattern, text)))


def run_checkpoint() -> dict:
    tgt = target()
    recs = records(64)
    root = Path(tempfile.mkdtemp())

    def factory(state):
        return BatchIterator(recs, batch_size=8, max_len=24, seed=0, state=state)

    def cfg(run, steps):
        return {"run_dir": str(root / run), "out_dir": str(root / run / "export"), "lr": 1e-2,
                "warmup_steps": 1, "max_steps": steps, "log_every": 1, "ckpt_every": 2,
                "eval_every": 0, "keep_checkpoints": 3, **TASK_CFG}

    def plan(spec):
        return parallel.ShardingPlan(parallel.make_mesh(spec), fsdp=True, fsdp_min_size=0)

    task = Eagle3Task(TASK_CFG, tgt)
    train(task, cfg("a", 2), factory, mesh=plan("data=4,model=2"))
    saved_dir = root / "a" / "checkpoints"
    # the values written on (4,2), read back without shardings (numpy)
    mngr = ocp.CheckpointManager(saved_dir.absolute())
    raw = mngr.restore(2, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    mngr.close()
    out = {"restore": {}}
    tx, _ = make_optimizer(with_defaults(cfg("a", 2)))
    for name, spec in {"8x1": "data=8,model=1", "1x1": "data=1,model=1", "none": None}.items():
        params = task.init_params(jax.random.key(0))
        if spec is None:
            template = {"params": params, "opt_state": tx.init(params)}
            devices = 1
        else:
            devs = jax.devices()[:1] if spec == "data=1,model=1" else None
            p = parallel.ShardingPlan(parallel.make_mesh(spec, devs), fsdp=True, fsdp_min_size=0)
            layout = TrainLayout.make(p, tx, params, task.frozen())
            params = layout.put(params)
            template = {"params": params, "opt_state": layout.init_opt(params)}
        mngr = ocp.CheckpointManager(saved_dir.absolute())
        got = mngr.restore(2, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(template)))["state"]
        mngr.close()
        leaf = got["params"]["layer"]["q_proj"]
        devices = len(leaf.sharding.device_set)
        out["restore"][name] = {
            "max_abs_diff": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                                for a, b in zip(jax.tree.leaves(parallel.fetch(got)),
                                                jax.tree.leaves(raw))),
            "leaves": len(jax.tree.leaves(got)), "q_proj_devices": devices,
            "q_proj_spec": str(getattr(leaf.sharding, "spec", None))}
    # the trainer (AdamW) resumes the (4,2) run on (8,1); compare with 4 uninterrupted steps on
    # one device (no mesh)
    shutil.copytree(root / "a", root / "b")
    train(task, cfg("b", 4), factory, mesh=plan("data=8,model=1"))
    train(task, cfg("c", 4), factory)
    logs = {r: [json.loads(x) for x in (root / r / "metrics.jsonl").read_text().splitlines()]
            for r in ("b", "c")}
    out["resumed_losses"] = [x["loss"] for x in logs["b"]]
    out["straight_losses"] = [x["loss"] for x in logs["c"]]
    from safetensors.numpy import load_file
    eb, ec = (load_file(str(root / r / "export" / "model.safetensors")) for r in ("b", "c"))
    out["export_max_abs_diff"] = max(
        float(np.max(np.abs(eb[k].astype(np.float64) - ec[k].astype(np.float64)))) for k in ec)
    shutil.rmtree(root)
    return out


MODES = {"train": run_train, "decode": run_decode, "checkpoint": run_checkpoint}

if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    assert jax.device_count() == 8, jax.devices()
    result = {}
    for name in MODES if mode == "all" else [mode]:
        start = time.perf_counter()
        try:
            result[name] = MODES[name]()
        except Exception:  # recorded, so the other modes' tests still report
            result[name] = {"error": traceback.format_exc()}
        result[name]["wall_s"] = time.perf_counter() - start
        Path(path).write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, default=str)[:4000])
