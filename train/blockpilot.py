"""BlockPilot labels and policy training.

    python -m train.blockpilot labels|train --config configs/drafters/blockpilot.yaml [--key value ...]
    python -m train.blockpilot labels --dflash assets/drafters/dflash --prompts P.jsonl --out DIR \
        [--sizes 12,14,16] [--skip N] [--limit N] [--max-new-tokens 64] [--temperature 0]
    python -m train.blockpilot train --labels DIR --eval-labels DIR2 --out assets/drafters/blockpilot \
        [--features topk|full] [--metric tau|speed] [--costs FILE]

`labels` decodes every prompt with the DFlash drafter at each candidate block size (static size =
the candidate, batched) and appends one line per prompt to DIR/size_<s>.jsonl: {"id", "tau",
"forwards", "new_tokens"}. It also profiles one decoding step per size at batch 1, as serving runs
that size (a DFlash drafter of exactly that block size; decoding/step_profile.py: propose + update +
the target's forward over the block + verify and commit, each phase the median over the first
`--cost-prompts` prompts): DIR/costs.json {"step_ms": {size: ms}, "forward_1_ms": {size: ms},
"prompts"}. Rerunning the same command resumes: prompts already written for a size, and sizes
already profiled, are skipped.

`train` reads the label folders; a prompt's oracle label is the size with the best mean
acceptance length (`--metric tau`, kept for comparison) or the best decoding speed (`--metric
speed`, the default: the prompt's tau at that size / the size's step cost, tokens per ms at batch
1; the cost measured in each folder's costs.json, or from `--costs FILE`, e.g. priced for a TPU:
benchmarks/blockpilot_priced/costs_v5p.json), ties to the size nearest the DFlash drafter's
training block size (then the smaller). Features are computed from the target's prefill logits
(`specblock_jax.drafters.blockpilot._train.prefill_features`). The policy trains as the registered
"blockpilot" task (`BlockPilotTask`) through the one trainer: full-batch AdamW (constant `--lr`,
betas 0.9 / 0.999, weight decay 0.05 on every parameter) with dropout on the train labels for
`--steps` steps, evaluated every 100 steps and at the end on the oracle labels of
`--eval-labels` (held-out prompts): accuracy and the mean tau the chosen sizes reach there. The
run goes to `<--run-dir>/<features>_<metric>_<loss>/` (metrics.jsonl, checkpoints, summary.json,
report.json; each `train` starts that run afresh: it takes seconds), the BlockPilot drafter
folder to `--out` (default: the run's export/), with report.json beside it.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
from tqdm import tqdm

import specblock_jax as sbj
from specblock_jax.decoding.prompts import encode_prompts
from specblock_jax.serving.prompt_profile import median_step_profile
from specblock_jax.decoding.prompts import read_prompts
from specblock_jax.decoding.step_profile import step_ms
from specblock_jax.drafters.blockpilot import (BlockPilotTask, PolicyData, apply_config, label_dflash, label_source,
                                               parsers, prefill_features, read_labels, summarise,
                                               training_block_size)
from specblock_jax.trainer.trainer import train


def _done(path: Path) -> set[str]:
    if not path.exists():
        return set()
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):  # a torn last line from a kill
        path.write_bytes(data[: data.rfind(b"\n") + 1])
    return {json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()}


def make_labels(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = sbj.load_target(args.target)
    records, _ = read_prompts(Path(args.prompts))
    records = records[args.skip: args.skip + args.limit if args.limit else None]
    (out / "settings.json").write_text(json.dumps(vars(args), indent=2))
    write_labels(target, args.dflash, records, [int(s) for s in args.sizes.split(",")], out,
                 max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                 batch_size=args.batch_size, cost_prompts=args.cost_prompts)
    print(json.dumps(summarise(out, training_block_size(args.dflash)), indent=2))


def write_labels(target, dflash_dir, records: list[dict], sizes: list[int], out: Path, *, max_new_tokens: int,
                 temperature: float = 0.0, seed: int = 0, batch_size: int = 16, cost_prompts: int = 8) -> None:
    """Decodes each record ({"id", "prompt": text or token ids}) with a DFlash drafter of each
    size in `sizes` and appends its line to out/size_<s>.jsonl, then profiles each size's step
    (out/costs.json). Resumes: records already in a size's file and sizes already profiled are
    skipped (a torn last line from a kill is dropped first)."""
    costs_path = out / "costs.json"
    costs = json.loads(costs_path.read_text()) if costs_path.exists() else {}
    for size in sizes:
        drafter = sbj.load_drafter(dflash_dir, target, block_size=size)
        path = out / f"size_{size}.jsonl"
        todo = [r for r in records if r["id"] not in _done(path)]
        chunk = batch_size * 4
        bar = tqdm(total=len(records), initial=len(records) - len(todo), desc=f"block {size}")
        for start in range(0, len(todo), chunk):
            part = todo[start:start + chunk]
            res = sbj.generate(target, [r["prompt"] for r in part], drafter=drafter, max_new_tokens=max_new_tokens,
                               seed=seed, sampling=sbj.Sampling(temperature),
                               options=sbj.DecodeOptions(batch_size=batch_size))
            with path.open("a") as f:
                f.write("".join(json.dumps({"id": r["id"], "tau": g.stats.tau,
                                            "forwards": g.stats.target_forwards,
                                            "new_tokens": g.stats.new_tokens}) + "\n"
                                for r, g in zip(part, res)))
            bar.update(len(part))
        bar.close()
        if str(size) not in costs.get("step_ms", {}) and cost_prompts:
            few = encode_prompts(target, [r["prompt"] for r in records[:cost_prompts]])
            prof = median_step_profile(target, *drafter, few, max_new=max_new_tokens)
            costs.setdefault("step_ms", {})[str(size)] = step_ms(prof)
            costs.setdefault("forward_1_ms", {})[str(size)] = prof["forward_1_ms"]
            costs["prompts"] = prof["prompts"]
            costs_path.write_text(json.dumps(costs, indent=2))


def train_cmd(args) -> None:
    target = sbj.load_target(args.target)
    data, sizes = {}, {}
    for split, folder in (("train", Path(args.labels)), ("heldout", Path(args.eval_labels))):
        prompt_file, prefer = label_source(folder)
        ids, sizes[split], tau, labels = read_labels(folder, args.metric, prefer,
                                                     Path(args.costs) if args.costs else None)
        recs, _ = read_prompts(prompt_file)
        prompts = {r["id"]: r["prompt"] for r in recs}
        x = prefill_features(target, [prompts[i] for i in ids], args.features, args.top_k)
        data[split] = PolicyData(x, np.asarray(labels, np.int32), tau)
    if sizes["heldout"] != sizes["train"]:
        raise SystemExit(f"eval labels have sizes {sizes['heldout']}, train labels {sizes['train']}")
    run_dir = Path(args.run_dir) / f"{args.features}_{args.metric}_{args.loss}"
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # a fresh run, not a resumed one
    cfg = {"run_dir": str(run_dir), "out_dir": args.out or str(run_dir / "export"), "seed": args.seed,
           "lr": args.lr, "b1": 0.9, "b2": 0.999, "weight_decay": 0.05, "max_steps": args.steps,
           "log_every": 1, "eval_every": 100, "ckpt_every": args.steps}
    task = BlockPilotTask(
        {"sizes": sizes["train"], "features": args.features, "top_k": args.top_k, "width": args.width,
         "loss": args.loss, "dropout": args.dropout, "dflash_dir": args.dflash_dir,
         "labels_dflash": str(label_dflash(Path(args.labels)))},
        target, data["train"], data["heldout"])
    summary = train(task, cfg, task.batches, task.evaluate)
    report = {"policy": summary["policy"], "metric": args.metric, "costs": args.costs or "measured", "loss": args.loss,
              "train_loss": summary["last_train_record"]["loss"], "train_s": summary["elapsed_s"],
              "train": summary["train"], "heldout": summary["heldout"]}
    for folder in (run_dir, Path(cfg["out_dir"])):
        (folder / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


def main(argv=None, prog: str | None = None) -> None:
    p, subparsers = parsers(prog or (f"python -m {__spec__.name}" if __spec__ else None), __doc__.split("\n")[0])
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default="")
    known, rest = pre.parse_known_args(argv)
    if known.config:
        apply_config(Path(known.config), subparsers)
    args = p.parse_args(rest)
    make_labels(args) if args.cmd == "labels" else train_cmd(args)


if __name__ == "__main__":
    main()
