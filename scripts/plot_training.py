"""Training curves from `metrics.jsonl` files, as PNGs.

    python scripts/plot_training.py drafters OUT.png LABEL=RUN/metrics.jsonl@TOKENS_PER_STEP[@START] [LABEL=...] [--title TEXT]
    python scripts/plot_training.py target RUN_DIR/metrics.jsonl OUT.png [--title TEXT] [--target 2.6]
                                    [--summary RUN_DIR/summary.json]

drafters: eval tau against training tokens (left) and training FLOPs (right) for several drafter
runs. Train records carry cumulative "flops" (the trainer's XLA cost analysis of its lowered step,
`trainer/trainer.py` `step_flops`), eval records "eval_tau_mean"; an eval at step s is placed at
s x FLOPs per step and s x TOKENS_PER_STEP (batch x max_len: the positions a step trains on,
padding included, the same count for every run; without it the run is left off the tokens panel).
START: the steps a fine-tuned run's starting drafter had trained (its points shift by START steps,
at this run's FLOPs per step). Also prints the points as JSON.

target: a target run's train loss (every logged step, thin, and a 10-record moving mean) and
validation loss (every evaluation) against tokens seen, with an optional horizontal target line.
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def read_metrics(path: str) -> list[dict]:
    return [json.loads(x) for x in open(path) if x.strip()]


def tau_points(path: str, start: int = 0) -> list[tuple[float, float, int]]:
    """[(training FLOPs, eval tau mean, step)] of one drafter run's metrics.jsonl, its steps counted
    from `start` (a fine-tuned run's starting drafter's steps)."""
    rows = read_metrics(path)
    per_step = [r["flops"] / r["step"] for r in rows if "flops" in r and r.get("step")]
    if not per_step:
        raise ValueError(f"{path}: no record carries 'flops' (a run logged before the trainer counted FLOPs)")
    return [((start + r["step"]) * per_step[-1], r["eval_tau_mean"], start + r["step"])
            for r in rows if "eval_tau_mean" in r]


def plot_drafters(axes, a) -> str:
    by_tokens, by_flops = axes
    for spec in a.runs:
        label, _, rest = spec.partition("=")
        path, _, per_step = rest.partition("@")
        per_step, _, start = per_step.partition("@")
        if not path:
            raise SystemExit(f"expected LABEL=metrics.jsonl[@TOKENS_PER_STEP[@START]], got {spec!r}")
        pts = tau_points(path, int(start or 0))
        tokens = int(per_step) if per_step else None
        print(json.dumps({"run": label, "points": [
            {"tflops": round(f / 1e12, 2), "tau": round(t, 3), "step": s,
             "tokens": None if tokens is None else s * tokens} for f, t, s in pts]}))
        line, = by_flops.plot([f / 1e12 for f, _, _ in pts], [t for _, t, _ in pts], marker="o", label=label)
        if tokens is not None:
            by_tokens.plot([s * tokens / 1e6 for _, _, s in pts], [t for _, t, _ in pts], marker="o",
                           label=label, color=line.get_color())
    by_tokens.set_xlabel("training tokens (M; steps x batch x max_len)")
    by_flops.set_xlabel("training compute (TFLOP, XLA cost analysis of the train step)")
    for ax in axes:
        ax.set_ylabel("eval tau (mean, greedy)")
    return f"{len(a.runs)} runs"


def plot_target(ax, a) -> str:
    rows = read_metrics(a.metrics)
    train = [r for r in rows if "loss" in r]
    val = [r for r in rows if "val_loss" in r]
    per_step = train[0]["tokens_seen"] / train[0]["step"]
    x = np.array([r["tokens_seen"] for r in train]) / 1e6
    y = np.array([r["loss"] for r in train])
    ax.plot(x, y, lw=0.5, alpha=0.4, color="tab:blue")
    if len(y) >= 10:
        ax.plot(x[9:], np.convolve(y, np.ones(10) / 10, "valid"), color="tab:blue", label="train (10-record mean)")
    summary = json.loads(open(a.summary).read()) if a.summary else None
    label = "validation (stdlib split)"
    if summary is not None:
        c = summary["config"]
        label = (f"validation, periodic: the split's first {c['eval_batches'] * c['batch_size'] * c['seq_len']:,} "
                 "tokens")
    ax.plot([r["step"] * per_step / 1e6 for r in val], [r["val_loss"] for r in val], "o-", color="tab:red",
            label=label)
    if summary is not None:
        ax.plot([summary["tokens_seen"] / 1e6], [summary["val_loss"]], "*", ms=14, color="black",
                label=f"validation, final: whole split ({summary['val_tokens']:,} tokens) {summary['val_loss']:.3f}")
    if a.target is not None:
        ax.axhline(a.target, ls="--", color="gray", label=f"target {a.target}")
    ax.set_xlabel("training tokens (M)")
    ax.set_ylabel("loss (nats/token)")
    return f"{len(train)} train records, {len(val)} evaluations"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="kind", required=True)
    d = sub.add_parser("drafters", help="eval tau against training FLOPs, several runs")
    d.add_argument("out")
    d.add_argument("runs", nargs="+", help="LABEL=metrics.jsonl[@TOKENS_PER_STEP]")
    d.add_argument("--title", default="eval tau against training tokens and compute")
    t = sub.add_parser("target", help="a target run's train and validation loss")
    t.add_argument("metrics")
    t.add_argument("out")
    t.add_argument("--title", default="target training")
    t.add_argument("--target", type=float, default=None)
    t.add_argument("--summary", default=None,
                   help="the run's summary.json: adds the final whole-split validation loss and says "
                        "how large the periodic evaluations' fixed subset is")
    a = p.parse_args()
    if a.kind == "drafters":
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        what = plot_drafters(axes, a)
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
        axes = [ax]
        what = plot_target(ax, a)
    fig.suptitle(a.title)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="lower right" if a.kind == "drafters" else "best")
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out}: {what}")


if __name__ == "__main__":
    main()
