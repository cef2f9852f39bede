"""Eval tau against training FLOPs for several drafter runs on one plot.

    python scripts/plot_tau_vs_flops.py OUT.png LABEL=RUN/metrics.jsonl [LABEL=...] [--title TEXT]

Each run's metrics.jsonl has train records carrying cumulative "flops" (the trainer's XLA cost
analysis of its lowered step, `training/trainer.py` `step_flops`) and eval records carrying
"eval_tau_mean"; an eval at step s is placed at s x FLOPs per step. Also prints the points as JSON.
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def tau_points(path: str) -> list[tuple[float, float, int]]:
    """[(training FLOPs, eval tau mean, step)] of one run's metrics.jsonl."""
    rows = [json.loads(x) for x in open(path) if x.strip()]
    per_step = [r["flops"] / r["step"] for r in rows if "flops" in r and r.get("step")]
    if not per_step:
        raise ValueError(f"{path}: no record carries 'flops' (a run logged before the trainer counted FLOPs)")
    return [(r["step"] * per_step[-1], r["eval_tau_mean"], r["step"]) for r in rows if "eval_tau_mean" in r]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("runs", nargs="+", help="LABEL=metrics.jsonl")
    p.add_argument("--title", default="eval tau against training compute")
    a = p.parse_args()
    fig, ax = plt.subplots(figsize=(7, 4))
    for spec in a.runs:
        label, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"expected LABEL=metrics.jsonl, got {spec!r}")
        pts = tau_points(path)
        print(json.dumps({"run": label, "points": [{"tflops": round(f / 1e12, 2), "tau": round(t, 3), "step": s}
                                                   for f, t, s in pts]}))
        ax.plot([f / 1e12 for f, _, _ in pts], [t for _, t, _ in pts], marker="o", label=label)
    ax.set_xlabel("training compute (TFLOP, XLA cost analysis of the train step)")
    ax.set_ylabel("eval tau (mean, greedy)")
    ax.set_title(a.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)


if __name__ == "__main__":
    main()
