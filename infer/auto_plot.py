"""`specblock-bench`'s plot of what served each chunk of its `auto:` runs (auto_decisions.png)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .labels import method_label


def plot_auto(rows: list[dict], path: Path) -> None:
    """What served each chunk of every `auto:` run, over the job: one panel per (temperature, batch
    size), one step line per run (target-only at the bottom, then the drafter's budgets in rising
    order), x = requests decoded before the chunk; explored chunks drawn as open circles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["temperature"], r["batch_size"]) for r in rows if r.get("auto_events")})
    fig, axes = plt.subplots(1, len(groups), figsize=(7 * len(groups), 3.5), squeeze=False)
    for ax, (t, b) in zip(axes[0], groups):
        runs = [r for r in rows if (r["temperature"], r["batch_size"]) == (t, b) and r.get("auto_events")]
        names = ["ar"] + sorted({str(e["option"]) for r in runs for e in r["auto_events"] if e["option"] != "ar"},
                                key=int)
        for n, r in enumerate(runs):
            ev = r["auto_events"]
            x = np.cumsum([0] + [e["requests"] for e in ev[:-1]])
            y = np.asarray([names.index(str(e["option"])) for e in ev]) + 0.08 * n
            line, = ax.step(x, y, where="post", label=method_label(r["method"]))
            explore = np.asarray([e["why"] == "explore" for e in ev])
            ax.plot(x[explore], y[explore], "o", mfc="none", color=line.get_color(), ms=5)
        ax.set_yticks(range(len(names)), ["target-only"] + [f"budget {v}" for v in names[1:]])
        ax.set_title(f"auto: what served each chunk (T={t:g}, batch {b})")
        ax.set_xlabel("requests decoded before the chunk (open circles: exploration)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
