"""BlockPilot labels and policy training.

    python -m train.blockpilot labels|train --config configs/drafters/blockpilot.yaml [--key value ...]
    python -m train.blockpilot labels --dflash assets/drafters/dflash --prompts P.jsonl --out DIR \
        [--sizes 12,14,16] [--skip N] [--limit N] [--max-new-tokens 64] [--temperature 0]
    python -m train.blockpilot train --labels DIR --eval-labels DIR2 --out assets/drafters/blockpilot \
        [--features topk|full] [--metric tau|speed]

`labels` decodes every prompt with the DFlash drafter at each candidate block size (static size =
the candidate, batched) and appends one line per prompt to DIR/size_<s>.jsonl: {"id", "tau",
"forwards", "new_tokens"}. It also profiles one decoding step per size at batch 1, as serving runs
that size (a DFlash drafter of exactly that block size; decoding/step_profile.py: propose + update +
the target's forward over the block + verify and commit, each phase the median over the first
`--cost-prompts` prompts): DIR/costs.json {"step_ms": {size: ms}, "forward_1_ms": {size: ms},
"prompts"}. Rerunning the same command resumes: prompts already written for a size, and sizes
already profiled, are skipped.

`train` reads the label folders; a prompt's oracle label is the size with the best mean
acceptance length (`--metric tau`, kept for comparison) or the best measured decoding speed
(`--metric speed`, the default: the prompt's tau at that size / the size's step cost, tokens per
ms at batch 1), ties to the size nearest the DFlash drafter's training block size
(then the smaller). Features are computed from the target's
prefill logits (`specblock_jax.drafters.blockpilot.features`); the MLP trains with AdamW and
dropout on the train labels, reports accuracy against the oracle labels of `--eval-labels`
(held-out prompts) and the mean tau the chosen sizes reach there, saves an orbax checkpoint in
`--run-dir` and writes the BlockPilot drafter folder to `--out`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm import tqdm

import specblock_jax as sbj
from infer.decode import read_prompts
from specblock_jax.decoding.generate import encode_prompts, length_bucket
from specblock_jax.decoding.prompt_profile import median_step_profile
from specblock_jax.decoding.step_profile import step_ms
from specblock_jax.drafters.blockpilot import PolicyConfig, features, init_policy, save_blockpilot


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
            res = sbj.generate(target, [r["prompt"] for r in part], drafter=drafter, temperature=temperature,
                               max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size)
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


def oracle_labels(score: np.ndarray, sizes: list[int], prefer: int | None = None) -> list[int]:
    """score [prompts, sizes] -> per prompt the index of the best size. Ties (within 1e-9) go to
    the size nearest `prefer` (the drafter's training block size, as BlockPilot breaks them; then
    the smaller), or to the smaller size when `prefer` is None."""
    sizes_arr = np.asarray(sizes)
    rank = np.abs(sizes_arr - prefer) if prefer is not None else np.zeros(len(sizes))
    order = np.lexsort((sizes_arr, rank))  # candidates in tie-break order
    best = score.max(axis=1, keepdims=True)
    tied = score >= best - 1e-9  # [prompts, sizes]
    return [int(order[np.argmax(row[order])]) for row in tied]


def training_block_size(dflash_dir: str | Path) -> int:
    """The block size the DFlash drafter in `dflash_dir` was trained with."""
    return int(json.loads((Path(dflash_dir) / "config.json").read_text())["config"]["block_size"])


def read_labels(folder: Path, metric: str = "tau", prefer: int | None = None
                ) -> tuple[list[str], list[int], np.ndarray, list[int]]:
    """(ids, sizes, tau [prompts, sizes], oracle label index per prompt) of a label folder; ties
    go to the size nearest `prefer` (`oracle_labels`)."""
    per_size = {int(p.stem.split("_")[1]): {json.loads(x)["id"]: json.loads(x)["tau"]
                                             for x in p.read_text().splitlines() if x.strip()}
                for p in folder.glob("size_*.jsonl")}
    sizes = sorted(per_size)
    ids = [i for i in per_size[sizes[0]] if all(i in per_size[s] for s in sizes)]
    tau = np.asarray([[per_size[s][i] or 1.0 for s in sizes] for i in ids], np.float64)
    score = tau
    if metric == "speed":
        costs = json.loads((folder / "costs.json").read_text())["step_ms"]
        missing = [s for s in sizes if str(s) not in costs]
        if missing:
            raise ValueError(f"{folder}/costs.json: no step cost for sizes {missing} (rerun `labels` to time them)")
        score = tau / np.asarray([costs[str(s)] for s in sizes])
    return ids, sizes, tau, oracle_labels(score, sizes, prefer)


def oracle_table(folder: Path, encode, sizes, prefer: int | None = None) -> dict[tuple[int, ...], int]:
    """Prompt token ids -> the labelled best block size (measured speed, ties to `prefer`) of every
    prompt in a label folder; its prompts are those of the folder's settings.json (the file the
    labels were made from), token ids by `encode` (list of texts -> list of id lists). `sizes`: the
    sizes the serving drafter has; the labels must be for exactly these."""
    settings = json.loads((folder / "settings.json").read_text())
    ids, label_sizes, _, labels = read_labels(folder, "speed", prefer)
    if sorted(label_sizes) != sorted(int(s) for s in sizes):
        raise ValueError(f"{folder}: labels for sizes {label_sizes}, the drafter has {sorted(sizes)}")
    records, _ = read_prompts(Path(settings["prompts"]))
    text = {r["id"]: r["prompt"] for r in records}
    missing = [i for i in ids if i not in text]
    if missing:
        raise ValueError(f"{folder}: labelled ids not in {settings['prompts']}: {missing[:3]}")
    toks = encode([text[i] for i in ids])
    return {tuple(t): label_sizes[k] for t, k in zip(toks, labels)}


def summarise(folder: Path, prefer: int | None = None) -> dict:
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


def prefill_features(target, prompts: dict[str, str], ids: list[str], kind: str, top_k: int) -> np.ndarray:
    """[len(ids), F] features of the target's next-token distribution after each prompt."""
    toks = encode_prompts(target, [prompts[i] for i in ids])
    out = []
    for start in range(0, len(toks), 32):
        part = toks[start:start + 32]
        width = length_bucket(max(len(t) for t in part))
        arr = np.zeros((len(part), width), np.int32)
        mask = np.zeros_like(arr)
        for r, t in enumerate(part):
            arr[r, :len(t)], mask[r, :len(t)] = t, 1
        logits = sbj.forward(target, arr, mask)
        last = jnp.asarray([len(t) - 1 for t in part])
        out.append(np.asarray(features(logits[jnp.arange(len(part)), last], kind, top_k)))
    return np.concatenate(out)


def train_policy(x, y, c: PolicyConfig, steps: int, lr: float, dropout: float, seed: int,
                 tau: np.ndarray | None = None, objective: str = "ce"):
    """Full-batch AdamW on features x [n, F]. objective "ce": cross-entropy on the oracle labels y [n];
    "regret": the expected tau lost to the oracle, sum_s policy(s) * (max tau - tau_s), which
    weighs each mistake by what it costs (ties cost nothing). Returns (graphdef, params, loss)."""
    graphdef, params = init_policy(c, seed)
    params["mean"] = jnp.asarray(x.mean(0))
    params["std"] = jnp.asarray(x.std(0) + 1e-6)
    frozen = {"mean": params.pop("mean"), "std": params.pop("std")}
    tx = optax.adamw(lr, weight_decay=0.05)
    opt = tx.init(params)
    xs, ys = jnp.asarray(x), jnp.asarray(y)
    gap = jnp.asarray(tau.max(1, keepdims=True) - tau, jnp.float32) if objective == "regret" else None

    @jax.jit
    def step(params, opt, key):
        def loss_fn(p):
            logits = nnx.merge(graphdef, {**p, **frozen})(xs, dropout, key)
            if objective == "regret":
                return jnp.sum(jax.nn.softmax(logits, -1) * gap, -1).mean()
            return optax.softmax_cross_entropy_with_integer_labels(logits, ys).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    for i in range(steps):
        params, opt, last = step(params, opt, jax.random.key(seed * 100003 + i))
    return graphdef, {**params, **frozen}, float(last)


def evaluate(graphdef, params, x, labels, tau) -> dict:
    pred = np.asarray(jnp.argmax(nnx.merge(graphdef, params)(jnp.asarray(x)), -1))
    chosen = tau[np.arange(len(pred)), pred]
    return {"accuracy": float(np.mean(pred == np.asarray(labels))), "mean_tau_chosen": float(chosen.mean()),
            "mean_tau_oracle": float(tau.max(1).mean()),
            "mean_tau_fixed": [float(v) for v in tau.mean(0)],
            "majority_accuracy": float(np.mean(np.asarray(labels) == np.bincount(labels).argmax())),
            "predicted_counts": np.bincount(pred, minlength=tau.shape[1]).tolist()}


def train_cmd(args) -> None:
    import orbax.checkpoint as ocp

    target = sbj.load_target(args.target)
    folders = {"train": Path(args.labels), "eval": Path(args.eval_labels)}
    data = {}
    for split, folder in folders.items():
        settings = json.loads((folder / "settings.json").read_text())
        ids, sizes, tau, labels = read_labels(folder, args.metric, training_block_size(settings["dflash"]))
        recs, _ = read_prompts(Path(settings["prompts"]))
        prompts = {r["id"]: r["prompt"] for r in recs}
        data[split] = (prefill_features(target, prompts, ids, args.features, args.top_k), labels, tau, sizes)
    sizes = data["train"][3]
    if data["eval"][3] != sizes:
        raise SystemExit(f"eval labels have sizes {data['eval'][3]}, train labels {sizes}")
    c = PolicyConfig(tuple(sizes), args.features, args.top_k, target.config.vocab_size, args.width)
    t0 = time.perf_counter()
    graphdef, params, loss = train_policy(data["train"][0], np.asarray(data["train"][1]), c, args.steps,
                                          args.lr, args.dropout, args.seed, data["train"][2], args.loss)
    report = {"policy": dataclasses.asdict(c), "metric": args.metric, "loss": args.loss, "train_loss": loss,
              "train_s": time.perf_counter() - t0,
              "train": evaluate(graphdef, params, *data["train"][:3]),
              "heldout": evaluate(graphdef, params, *data["eval"][:3])}
    run_dir = Path(args.run_dir).absolute()
    ckpt = ocp.StandardCheckpointer()
    tag = f"{args.features}_{args.metric}_{args.loss}"
    ckpt.save(run_dir / f"policy_{tag}", params, force=True)
    ckpt.wait_until_finished()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / f"report_{tag}.json").write_text(json.dumps(report, indent=2))
    if args.out:
        save_blockpilot(args.out, c, params, args.dflash_dir)
        (Path(args.out) / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


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


def parsers(prog: str) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The CLI's parser and its subcommands' parsers ({"labels", "train"})."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
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
    tr.add_argument("--loss", default="ce", choices=("ce", "regret"))
    tr.add_argument("--width", type=int, default=256)
    tr.add_argument("--steps", type=int, default=400)
    tr.add_argument("--lr", type=float, default=1e-3)
    tr.add_argument("--dropout", type=float, default=0.2)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--run-dir", default="runs/dflash_blockpilot")
    tr.add_argument("--out", default="")
    tr.add_argument("--dflash-dir", default="../dflash")
    return p, {"labels": lab, "train": tr}


def main(argv=None, prog: str = "python -m train.blockpilot") -> None:
    p, subparsers = parsers(prog)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default="")
    known, rest = pre.parse_known_args(argv)
    if known.config:
        apply_config(Path(known.config), subparsers)
    args = p.parse_args(rest)
    make_labels(args) if args.cmd == "labels" else train_cmd(args)


if __name__ == "__main__":
    main()
