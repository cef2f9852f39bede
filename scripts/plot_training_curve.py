"""Training and validation loss of a target run (its metrics.jsonl) as a PNG.

    python scripts/plot_training_curve.py RUN_DIR/metrics.jsonl OUT.png [--title TEXT] [--target 2.6]

Train loss: every logged step (one batch each, thin) and a 10-record moving mean; validation loss:
every evaluation (the stdlib validation split); an optional horizontal target line. x = tokens seen.
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("metrics")
    p.add_argument("out")
    p.add_argument("--title", default="target training")
    p.add_argument("--target", type=float, default=None)
    p.add_argument("--summary", default=None,
                   help="the run's summary.json: adds the final whole-split validation loss and says "
                        "how large the periodic evaluations' fixed subset is")
    a = p.parse_args()
    rows = [json.loads(x) for x in open(a.metrics) if x.strip()]
    train = [r for r in rows if "loss" in r]
    val = [r for r in rows if "val_loss" in r]
    per_step = train[0]["tokens_seen"] / train[0]["step"]
    fig, ax = plt.subplots(figsize=(7, 4))
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
    ax.set_title(a.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out}: {len(train)} train records, {len(val)} evaluations")


if __name__ == "__main__":
    main()
