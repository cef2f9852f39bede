"""AOT lowering (and optionally compilation) of the sharded EAGLE-3 train step for a Qwen3-8B
target on a 32-way data x 8-way model mesh, on CPU with 256 simulated devices and no weights.

    python benchmarks/qwen3_8b_aot/aot_qwen3_8b_sharding.py [--compile] [--batch 32] [--seq 2048]
        [--fsdp all] [--decode] [--out F.json]

Everything is abstract (jax.ShapeDtypeStruct with shardings): nothing is allocated. Prints the
per-device bytes of the trainable drafter params, the AdamW state and the frozen target params
under the training plan (FSDP over "data" for parameters of >= 2**16 elements, tensor parallel
over "model"), and with --compile XLA's per-device memory analysis of the step.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import time
from pathlib import Path

import jax

DATA, MODEL = 32, 8
jax.config.update("jax_num_cpu_devices", DATA * MODEL)
jax.config.update("jax_platforms", "cpu")

import jax.numpy as jnp  # noqa: E402

import specblock_jax as sbj  # noqa: E402
from specblock_jax import parallel  # noqa: E402
from specblock_jax.drafters.common import abstract_model  # noqa: E402
from specblock_jax.drafters.eagle3 import Eagle3Model  # noqa: E402
from specblock_jax.drafters.eagle3_train import Eagle3Task  # noqa: E402
from specblock_jax.models.target import abstract_target  # noqa: E402
from specblock_jax.parallel.mesh import tree_bytes  # noqa: E402
from specblock_jax.parallel.training import TrainLayout  # noqa: E402
from specblock_jax.training.trainer import make_optimizer, train_step_fn, with_defaults  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32, help="global batch (rows)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--compile", action="store_true", help="also compile (slow) and report memory")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--decode", action="store_true",
                    help="also lower target-only batch decoding (batch 256, prompts 1024, 1024 new)")
    ap.add_argument("--fsdp", choices=("all", "trainable", "none"), default="all",
                    help="FSDP-split every parameter, only the drafter's (and its optimizer "
                         "state), or none")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    cfg = sbj.models.config.qwen3_8b()
    graphdef, abstract_params = abstract_target(cfg)
    target = sbj.Target(cfg, graphdef, abstract_params)
    task = Eagle3Task({"ttt_steps": 7}, target)
    _, drafter = abstract_model(Eagle3Model, task.config)  # what task.init_params returns, abstractly
    tx, _ = make_optimizer(with_defaults({"run_dir": "x", "out_dir": "x"}))
    mesh = parallel.make_mesh(f"data={DATA},model={MODEL}")
    plan = parallel.ShardingPlan(mesh, fsdp=args.fsdp != "none")
    layout = TrainLayout.make(plan, tx, drafter, abstract_params)
    if args.fsdp == "trainable":  # the frozen target tensor-parallel only
        layout = dataclasses.replace(
            layout, frozen=parallel.ShardingPlan(mesh).param_shardings(abstract_params))
    opt = jax.eval_shape(tx.init, drafter)

    def sds(tree, shardings):
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            tree, shardings)

    batch_sh = plan.batch_sharding(2)
    batch = {k: jax.ShapeDtypeStruct((args.batch, args.seq), jnp.int32, sharding=batch_sh)
             for k in ("tokens", "loss_mask", "attention_mask")}
    raw_key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=plan.replicated())
    step = layout.jit_step(train_step_fn(task, tx)).jitted
    lowered = step.lower(sds(drafter, layout.params), sds(opt, layout.opt_state),
                         sds(abstract_params, layout.frozen), batch, raw_key)
    lower_s = time.perf_counter() - t0
    per_device = layout.bytes_per_device(drafter, opt, abstract_params)
    gib = 2**30
    report = {
        "mesh": parallel.mesh_str(plan.mesh), "devices": jax.device_count(), "fsdp": args.fsdp,
        "target": "qwen3-8b", "target_params": sbj.models.target.count_params(abstract_params),
        "drafter_params": sbj.models.target.count_params(drafter),
        "dtype": cfg.dtype, "global_batch": [args.batch, args.seq],
        "total_bytes": {"params": tree_bytes(drafter), "opt_state": tree_bytes(opt),
                        "frozen": tree_bytes(abstract_params)},
        "per_device_bytes": per_device,
        "per_device_gib": {k: round(v / gib, 4) for k, v in per_device.items()},
        "lower_s": round(lower_s, 1),
    }
    if args.compile:
        t1 = time.perf_counter()
        mem = lowered.compile().memory_analysis()
        report["compile_s"] = round(time.perf_counter() - t1, 1)
        if mem is not None:
            report["xla_memory_per_device"] = {
                k: int(getattr(mem, k)) for k in ("argument_size_in_bytes", "output_size_in_bytes",
                                                  "temp_size_in_bytes", "alias_size_in_bytes")
                if hasattr(mem, k)}
    if args.decode:
        report["decode"] = decode_report(256, 1024, 1024, args.compile)
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return report


def decode_report(batch: int, prompt: int, max_new: int, compile_: bool) -> dict:
    """Lowers target-only batch decoding (the `generate` loop, as `run_sharded` runs it) of
    Qwen3-8B on the same mesh with the decoding plan: weights tensor-parallel over "model" and
    replicated across the 32 data groups, KV cache [B, S, K, D] split (data, -, model, -)."""
    from specblock_jax.decoding.job import cache_length
    from specblock_jax.decoding.loop import LoopSpec
    from specblock_jax.decoding.prefill import LoopInputs
    from specblock_jax.decoding.sampling import SamplingParams
    from specblock_jax.models.kv_cache import init_cache
    from specblock_jax.parallel.decoding import run_sharded

    t0 = time.perf_counter()
    cfg = sbj.models.config.qwen3_8b()
    graphdef, params = abstract_target(cfg)
    plan = parallel.ShardingPlan(parallel.make_mesh(f"data={DATA},model={MODEL}"))
    psh = plan.param_shardings(params)
    cache_len = cache_length(prompt, max_new)
    cache = jax.eval_shape(lambda: init_cache(cfg, batch, cache_len))
    def rows(shape, dt):
        return jax.ShapeDtypeStruct(shape, dt, sharding=plan.batch_sharding(len(shape)))

    sampling = SamplingParams(rows((batch,), jnp.float32), rows((batch,), jnp.int32),
                              rows((batch,), jnp.float32))
    inputs = LoopInputs(rows((batch, prompt), jnp.int32), rows((batch,), jnp.int32), rows((batch,), jnp.int32),
                        sampling, jax.ShapeDtypeStruct((8,), jnp.int32, sharding=plan.replicated()),
                        rows((batch, 2), jnp.uint32))
    args = (jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params, psh), (), inputs)
    spec = LoopSpec(graphdef=graphdef, cfg=cfg, cache_len=cache_len, max_new=max_new)
    fn = functools.partial(run_sharded, plan, LoopSpec.decode, spec)
    lowered = jax.jit(fn).lower(*args)
    out = {"decode_mesh": parallel.mesh_str(plan.mesh), "decode_batch": batch,
           "prompt_bucket": prompt, "max_new_tokens": max_new, "cache_len": cache_len,
           "per_device_bytes": {"target_params": parallel.shard_bytes(params, psh),
                                "kv_cache": parallel.shard_bytes(cache, plan.cache_shardings(cache))},
           "total_bytes": {"target_params": tree_bytes(params), "kv_cache": tree_bytes(cache)},
           "lower_s": round(time.perf_counter() - t0, 1)}
    if compile_:
        t1 = time.perf_counter()
        mem = lowered.compile().memory_analysis()
        out["compile_s"] = round(time.perf_counter() - t1, 1)
        if mem is not None:
            out["xla_temp_per_device"] = int(mem.temp_size_in_bytes)
    return out


if __name__ == "__main__":
    main()
