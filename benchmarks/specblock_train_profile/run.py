"""SpecBlock's training step by part, beside EAGLE-3's (issue 40 item 2): XLA cost analysis and wall time.

    nice -n 19 .venv/bin/python benchmarks/specblock_train_profile/run.py --label before \
        [--reps 5] [--save-grads /tmp/sb_before.npz] [--compare-grads /tmp/sb_before.npz]

The v2 configs (configs/drafters/{specblock,eagle3}-v2.yaml: batch 8, max_len 256, the shipped
draft vocabularies), random tokens (the step's cost does not depend on them), one process. Each
part is its own jitted function; per part: the lowered HLO's FLOPs (what `specblock-train` logs as
flops_per_step), the compiled executable's FLOPs and bytes accessed, and the median wall time of
--reps calls after a warm-up call. Parts:
  target_forward    the frozen target's features and logits (shared by both drafters)
  blocks_fwd(+bwd)  SpecBlock's 3 block unrolls (+ their gradient, from a random cotangent)
  attention(+bwd)   the attention of those unrolls alone (every layer and block)
  losses(+bwd)      draft soft-CE + rank head over all blocks, given the blocks' hiddens
  loss_fwd          the whole loss (target included); loss_grad: its value_and_grad
  train_step        loss_grad + gradient clipping + AdamW (the trainer's jitted step)
Results are appended to results.json under --label (the machine is shared: compare ratios within
one label's run). --save-grads/--compare-grads: the loss and gradients at a fixed key, to check that
a change leaves them as they were (fp32 tolerance).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import yaml
from flax import nnx

import specblock_jax as sbj
from specblock_jax.drafters import specblock_train as sbt
from specblock_jax.drafters.eagle3_train import Eagle3Task
from specblock_jax.training.task import frozen_target_outputs
from specblock_jax.training.trainer import TRAINER_DEFAULTS, make_optimizer, make_train_step

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def settings(kind: str) -> tuple[dict, dict]:
    """(the kind's task settings, the run config) of configs/drafters/<kind>-v2.yaml."""
    cfg = yaml.safe_load((ROOT / f"configs/drafters/{kind}-v2.yaml").read_text())
    task_cls = sbt.SpecBlockTask if kind == "specblock" else Eagle3Task
    fields = {f.name for f in dataclasses.fields(task_cls.Settings)}
    s = {k: v for k, v in cfg.items() if k in fields}
    s["draft_vocab"] = str(ROOT / f"assets/drafters/{kind}/draft_vocab.safetensors")
    return s, {**TRAINER_DEFAULTS, **cfg}


def measure(fn, *args, reps: int) -> dict:
    """Lowered and compiled cost analysis, compile time and median wall time of jitted fn(*args)."""
    jf = jax.jit(fn)
    lowered = jf.lower(*args)
    t0 = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    lc, cc = lowered.cost_analysis() or {}, compiled.cost_analysis() or {}
    cc = cc[0] if isinstance(cc, list) else cc
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    return {"lowered_gflop": round(lc.get("flops", 0.0) / 1e9, 2),
            "compiled_gflop": round(cc.get("flops", 0.0) / 1e9, 2),
            "compiled_gbytes": round(cc.get("bytes accessed", 0.0) / 1e9, 2),
            "compile_s": round(compile_s, 1), "wall_ms": round(1e3 * statistics.median(times), 1),
            "wall_ms_all": [round(1e3 * x, 1) for x in times]}


def batch(b: int, t: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(4, 8192, size=(b, t)).astype(np.int32)
    loss = np.zeros((b, t), np.int32)
    loss[:, 40:-1] = 1  # a 41-token prompt, then the response
    return {"tokens": jnp.asarray(tokens), "loss_mask": jnp.asarray(loss),
            "attention_mask": jnp.ones((b, t), jnp.int32)}


def profile_specblock(target, reps: int) -> tuple[dict, dict]:
    s, cfg = settings("specblock")
    task = sbt.SpecBlockTask(s, target)
    data = batch(cfg["batch_size"], cfg["max_len"])
    params, frozen = task.init_params(jax.random.key(0)), task.frozen()
    key = jax.random.key(1)
    out: dict = {}
    out["target_forward"] = measure(lambda f, bt: frozen_target_outputs(target, f, bt, task.config.feature_layers),
                                    frozen, data, reps=reps)
    hidden, logits = jax.jit(lambda f, bt: frozen_target_outputs(target, f, bt, task.config.feature_layers))(frozen, data)
    embed = frozen["embed_tokens"]
    ms = sbt.block_offsets(key, s["num_blocks"], s["block_size"])
    ms = [jnp.asarray(m) for m in ms]

    def blocks(p, hid, ms):
        model = nnx.merge(task.graphdef, p)
        return sbt.run_blocks(model, embed, model.features(hid), data["tokens"], data["attention_mask"], ms)

    out["blocks_fwd"] = measure(blocks, params, hidden, ms, reps=reps)
    hiddens = jax.jit(blocks)(params, hidden, ms)
    cot = [jax.random.normal(jax.random.key(i), h.shape, h.dtype) for i, h in enumerate(hiddens)]
    out["blocks_fwd_bwd"] = measure(
        lambda p, hid, ms: jax.grad(lambda p: sum(jnp.vdot(h, c) for h, c in zip(blocks(p, hid, ms), cot)))(p),
        params, hidden, ms, reps=reps)

    c = task.config
    n = cfg["max_len"] * c.block_size
    kv_shape = (cfg["batch_size"], n, c.num_kv_heads, c.head_dim)
    qs = [jnp.ones((cfg["batch_size"], n, c.num_heads, c.head_dim), c.dtype) for _ in range(c.num_layers)]
    kvs = [[(jnp.ones(kv_shape, c.dtype), jnp.ones(kv_shape, c.dtype)) for _ in range(s["num_blocks"])]
           for _ in range(c.num_layers)]
    masks = [sbt.block_masks(data["attention_mask"], c.block_size, ms, blk) for blk in range(s["num_blocks"])]

    def attention_sum(qs, kvs):  # every block's attention in every drafter layer
        return sum(jnp.sum(sbt.block_attention(q, kv[0], see_first, kv[1:blk + 1] if blk else [], see_local,
                                               c.block_size).astype(jnp.float32))
                   for q, kv in zip(qs, kvs) for blk, (see_first, see_local) in enumerate(masks))

    out["attention_fwd"] = measure(attention_sum, qs, kvs, reps=reps)
    out["attention_fwd_bwd"] = measure(jax.grad(attention_sum, argnums=(0, 1)), qs, kvs, reps=reps)

    p_target, want, dmask = sbt.loss_targets(logits, data["loss_mask"], data["attention_mask"], task.vocab_arrays())

    def losses(p, hs):
        model = nnx.merge(task.graphdef, p)
        return sbt.blocks_loss(model, hs, ms, p_target, want, dmask, key, decay=s["slot_decay"],
                               valid_prefix=s["valid_prefix"], rank_weight=s["rank_weight"],
                               loss_fraction=s["loss_fraction"])[0]

    out["losses_fwd"] = measure(losses, params, hiddens, reps=reps)
    out["losses_fwd_bwd"] = measure(jax.grad(losses, argnums=(0, 1)), params, hiddens, reps=reps)
    out["loss_fwd"] = measure(lambda p, bt: task.loss_fn(p, frozen, bt, key)[0], params, data, reps=reps)
    grad_fn = jax.value_and_grad(lambda p, bt: task.loss_fn(p, frozen, bt, key)[0])
    out["loss_grad"] = measure(grad_fn, params, data, reps=reps)
    tx, _ = make_optimizer(cfg)
    out["train_step"] = measure_step(make_train_step(task, tx), params, tx, frozen, data, key, reps)
    loss, grads = jax.jit(grad_fn)(params, data)
    return out, {"loss": float(loss), "grads": {jax.tree_util.keystr(p): np.asarray(g, np.float32)
                                                for p, g in jax.tree_util.tree_leaves_with_path(grads)}}


def measure_step(step, params, tx, frozen, data, key, reps: int) -> dict:
    """The trainer's jitted step (params and optimizer state donated: fresh copies per call)."""
    opt = tx.init(params)
    lowered = step.lower(params, opt, frozen, data, key)
    compiled = lowered.compile()
    lc, cc = lowered.cost_analysis() or {}, compiled.cost_analysis() or {}
    cc = cc[0] if isinstance(cc, list) else cc
    copy = jax.jit(lambda x: jax.tree.map(jnp.copy, x))
    times = []
    for i in range(reps + 1):
        p, o = copy((params, opt))
        jax.block_until_ready((p, o))
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(p, o, frozen, data, key))
        if i:
            times.append(time.perf_counter() - t0)
    return {"lowered_gflop": round(lc.get("flops", 0.0) / 1e9, 2),
            "compiled_gflop": round(cc.get("flops", 0.0) / 1e9, 2),
            "compiled_gbytes": round(cc.get("bytes accessed", 0.0) / 1e9, 2),
            "wall_ms": round(1e3 * statistics.median(times), 1), "wall_ms_all": [round(1e3 * x, 1) for x in times]}


def profile_eagle3(target, reps: int) -> dict:
    s, cfg = settings("eagle3")
    task = Eagle3Task(s, target)
    data = batch(cfg["batch_size"], cfg["max_len"])
    params, frozen = task.init_params(jax.random.key(0)), task.frozen()
    key = jax.random.key(1)
    grad_fn = jax.value_and_grad(lambda p, bt: task.loss_fn(p, frozen, bt, key)[0])
    tx, _ = make_optimizer(cfg)
    return {"loss_fwd": measure(lambda p, bt: task.loss_fn(p, frozen, bt, key)[0], params, data, reps=reps),
            "loss_grad": measure(grad_fn, params, data, reps=reps),
            "train_step": measure_step(make_train_step(task, tx), params, tx, frozen, data, key, reps)}


PARTS = ("target_forward", "blocks_fwd", "blocks_fwd_bwd", "attention_fwd", "attention_fwd_bwd", "losses_fwd",
         "losses_fwd_bwd", "loss_fwd", "loss_grad", "train_step")


def table(results: dict) -> str:
    """Markdown: one row per part, per label wall ms (share of its train_step) and compiled
    GFLOP / GB; then EAGLE-3's step beside SpecBlock's."""
    labels = [x for x in results if "specblock" in results[x]]  # per-part runs (not the one-process step record)
    head = "| part | " + " | ".join(f"{x} ms (share) | {x} GFLOP lowered / compiled | {x} GB" for x in labels) + " |"
    lines = [head, "|---|" + "---:|" * (3 * len(labels))]
    for part in PARTS:
        cells = []
        for x in labels:
            r, step = results[x]["specblock"].get(part), results[x]["specblock"]["train_step"]["wall_ms"]
            cells += (["-"] * 3 if r is None else
                      [f"{r['wall_ms']:.0f} ({r['wall_ms'] / step:.0%})",
                       f"{r['lowered_gflop']:.1f} / {r['compiled_gflop']:.1f}", f"{r['compiled_gbytes']:.1f}"])
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    lines += ["", "| label | EAGLE-3 step ms | SpecBlock step ms | wall ratio | lowered GFLOP ratio |", "|---|---:|---:|---:|---:|"]
    for x in labels:
        e, sb = results[x].get("eagle3", {}).get("train_step"), results[x]["specblock"]["train_step"]
        if e:
            lines.append(f"| {x} | {e['wall_ms']:.0f} | {sb['wall_ms']:.0f} | {sb['wall_ms'] / e['wall_ms']:.2f}x | "
                         f"{sb['lowered_gflop'] / e['lowered_gflop']:.2f}x ({sb['lowered_gflop']:.1f} / {e['lowered_gflop']:.1f}) |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--label", default=None)
    p.add_argument("--markdown", action="store_true", help="print the results.json tables and exit")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--skip-eagle3", action="store_true")
    p.add_argument("--save-grads", type=Path, default=None)
    p.add_argument("--compare-grads", type=Path, default=None)
    args = p.parse_args()
    path = HERE / "results.json"
    if args.markdown:
        print(table(json.loads(path.read_text())))
        return
    if not args.label:
        p.error("--label is required")
    target = sbj.load_target(ROOT / "assets/target")
    sb, ref = profile_specblock(target, args.reps)
    record = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "jax": jax.__version__,
              "specblock": sb, "specblock_loss": ref["loss"]}
    if args.save_grads:
        np.savez(args.save_grads, loss=ref["loss"], **ref["grads"])
    if args.compare_grads:
        old = np.load(args.compare_grads)
        diffs = {k: float(np.max(np.abs(old[k] - g)) / max(float(np.max(np.abs(old[k]))), 1e-30))
                 for k, g in ref["grads"].items()}
        record["vs_saved"] = {"loss_before": float(old["loss"]), "loss_after": ref["loss"],
                              "max_rel_grad_diff": max(diffs.values()),
                              "worst_leaf": max(diffs, key=diffs.get)}
    if not args.skip_eagle3:
        record["eagle3"] = profile_eagle3(target, args.reps)
    results = json.loads(path.read_text()) if path.exists() else {}
    results[args.label] = record
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k not in ("specblock", "eagle3")}))
    for name in ("specblock", "eagle3"):
        for part, r in record.get(name, {}).items():
            print(f"{name:<9} {part:<18} {r['wall_ms']:>9.1f} ms  {r['lowered_gflop']:>8.2f} GFLOP lowered  "
                  f"{r['compiled_gflop']:>8.2f} compiled  {r['compiled_gbytes']:>7.2f} GB")


if __name__ == "__main__":
    main()
