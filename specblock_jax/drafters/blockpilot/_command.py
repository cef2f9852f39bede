"""BlockPilot's training command, `specblock-train blockpilot labels|train` (the registry's
`DrafterKind.train_command`: its training decodes, so it is a command of its own): its flags, its
YAML config's sections, what a label folder says about its making (settings.json), and the two
subcommands.


    specblock-train blockpilot labels|train --config configs/drafters/blockpilot.yaml [--key value ...]
    specblock-train blockpilot labels --dflash assets/drafters/dflash --prompts P.jsonl --out DIR \
        [--sizes 12,14,16] [--skip N] [--limit N] [--max-new-tokens 64] [--temperature 0]
    specblock-train blockpilot train --labels DIR --eval-labels DIR2 --out assets/drafters/blockpilot \
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
assets/drafters/blockpilot-v5p/provenance/costs_v5p.json), ties to the size nearest the DFlash drafter's
training block size (then the smaller). Features are computed from the target's prefill logits
(`_train.prefill_features`). The policy trains as the registered
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

from specblock_jax.drafters.blockpilot._labels import read_labels
from specblock_jax.drafters.blockpilot._train import BlockPilotTask, PolicyData, prefill_features
from specblock_jax.jsonl import append_rows, read_rows
from specblock_jax.prompts import encode_prompts, read_prompts


def training_block_size(dflash_dir: str | Path) -> int:
    """The block size the DFlash drafter in `dflash_dir` was trained with."""
    return int(json.loads((Path(dflash_dir) / "config.json").read_text())["config"]["block_size"])


def label_source(folder: Path) -> tuple[Path, int]:
    """(the prompt file, the DFlash drafter's training block size) a label folder was made from
    (its settings.json: the `labels` command's arguments)."""
    settings = json.loads((Path(folder) / "settings.json").read_text())
    return Path(settings["prompts"]), training_block_size(settings["dflash"])


def label_dflash(folder: Path) -> Path:
    """The DFlash drafter folder a label folder's labels were measured with (its settings.json)."""
    return Path(json.loads((Path(folder) / "settings.json").read_text())["dflash"])


def summarise(folder: Path, prefer: int | None = None) -> dict:
    """A label folder's prompt and label counts per metric, mean tau per size, the oracle's."""
    out = {}
    for metric in ("tau", "speed"):
        if metric == "speed" and not (folder / "costs.json").exists():
            continue
        ids, sizes, tau, labels = read_labels(folder, metric, prefer)
        out[metric] = {"prompts": len(ids), "label_counts": {s: labels.count(i) for i, s in enumerate(sizes)}}
    out["mean_tau"] = {s: float(tau[:, i].mean()) for i, s in enumerate(sizes)}
    out["oracle_mean_tau"] = float(tau.max(1).mean())
    if (folder / "costs.json").exists():
        out["ms_per_step_batch1"] = json.loads((folder / "costs.json").read_text())
    return out


def apply_config(path: Path, subparsers: dict[str, argparse.ArgumentParser]) -> None:
    """A YAML config's sections ({"labels": {...}, "train": {...}}) become the subcommands'
    defaults (flags still override them); an unknown section or key is a clear error."""
    import yaml

    cfg = yaml.safe_load(path.read_text()) or {}
    if set(cfg) - set(subparsers):
        raise SystemExit(f"{path}: unknown sections {sorted(set(cfg) - set(subparsers))} "
                         f"(sections: {sorted(subparsers)})")
    for name, sp in subparsers.items():
        section = {k.replace("-", "_"): v for k, v in (cfg.get(name) or {}).items()}
        dests = {a.dest for a in sp._actions}
        if set(section) - dests:
            raise SystemExit(f"{path}: {name}: unknown keys {sorted(set(section) - dests)}")
        sp.set_defaults(**section)
        for action in sp._actions:
            if action.required and action.dest in section:
                action.required = False


def parsers(prog: str, description: str = "") -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command's parser and its subcommands' parsers ({"labels", "train"})."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    sub = p.add_subparsers(dest="cmd", required=True)
    lab = sub.add_parser("labels")
    lab.add_argument("--target", default="assets/target")
    lab.add_argument("--dflash", default="assets/drafters/dflash")
    lab.add_argument("--prompts", required=True)
    lab.add_argument("--out", required=True)
    lab.add_argument("--sizes", default="14,15,16,17,18")
    lab.add_argument("--skip", type=int, default=0)
    lab.add_argument("--limit", type=int, default=0)
    lab.add_argument("--max-new-tokens", type=int, default=64)
    lab.add_argument("--temperature", type=float, default=0.0)
    lab.add_argument("--batch-size", type=int, default=16)
    lab.add_argument("--cost-prompts", type=int, default=8)
    lab.add_argument("--seed", type=int, default=0)
    tr = sub.add_parser("train")
    tr.add_argument("--target", default="assets/target")
    tr.add_argument("--labels", required=True)
    tr.add_argument("--eval-labels", required=True)
    tr.add_argument("--features", default="topk", choices=("topk", "full"))
    tr.add_argument("--top-k", type=int, default=32)
    tr.add_argument("--metric", default="speed", choices=("tau", "speed"))
    tr.add_argument("--costs", default="", help="step costs JSON {\"step_ms\": {size: ms}} for --metric "
                    "speed (e.g. priced for a TPU); default: each label folder's measured costs.json")
    tr.add_argument("--loss", default="ce", choices=("ce", "regret"))
    tr.add_argument("--width", type=int, default=256)
    tr.add_argument("--steps", type=int, default=400)
    tr.add_argument("--lr", type=float, default=1e-3)
    tr.add_argument("--dropout", type=float, default=0.2)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--run-dir", default="runs/dflash_blockpilot")
    tr.add_argument("--out", default="", help="the drafter folder; default: <run>/export")
    tr.add_argument("--dflash-dir", default="../dflash")
    return p, {"labels": lab, "train": tr}

def done_ids(path: Path) -> set:
    """The ids already written to a label file (a torn last line from a kill cut off first)."""
    return {row["id"] for row in read_rows(path)}


def make_labels(args) -> None:
    import specblock_jax as sbj  # the library's face, imported when the command runs (not at registration)

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
    import specblock_jax as sbj
    from specblock_jax.decoding.step_profile import step_ms
    from specblock_jax.serving.prompt_profile import median_step_profile

    costs_path = out / "costs.json"
    costs = json.loads(costs_path.read_text()) if costs_path.exists() else {}
    for size in sizes:
        drafter = sbj.load_drafter(dflash_dir, target, block_size=size)
        path = out / f"size_{size}.jsonl"
        done = done_ids(path)
        todo = [r for r in records if r["id"] not in done]
        chunk = batch_size * 4
        bar = tqdm(total=len(records), initial=len(records) - len(todo), desc=f"block {size}")
        for start in range(0, len(todo), chunk):
            part = todo[start:start + chunk]
            res = sbj.generate(target, [r["prompt"] for r in part], drafter=drafter, max_new_tokens=max_new_tokens,
                               seed=seed, sampling=sbj.Sampling(temperature),
                               options=sbj.DecodeOptions(batch_size=batch_size))
            append_rows(path, [{"id": r["id"], "tau": g.stats.tau, "forwards": g.stats.target_forwards,
                                "new_tokens": g.stats.new_tokens} for r, g in zip(part, res)])
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
    import specblock_jax as sbj
    from specblock_jax.trainer.trainer import train

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
    """`specblock-train blockpilot ARGS`: the `labels` or `train` subcommand."""
    p, subparsers = parsers(prog or "specblock-train blockpilot", __doc__.split("\n")[0])
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default="")
    known, rest = pre.parse_known_args(argv)
    if known.config:
        apply_config(Path(known.config), subparsers)
    args = p.parse_args(rest)
    make_labels(args) if args.cmd == "labels" else train_cmd(args)
