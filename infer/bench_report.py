"""`specblock-bench`'s reporting: speedups of a group against target-only, the table, results.json /
results.md, the plots, and the three closing lines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .auto_plot import plot_auto
from .labels import method_label


def compare(group: list[dict], temperature: float) -> None:
    """Adds the comparison with target-only to every row of one (batch size, temperature) group,
    whose first row is `ar`'s:
      speedup            pooled: the method's new tokens / seconds over all rounds, over `ar`'s
      round_speedups     per round: that round's tokens/s of the method / of `ar`
      achieved_over_ideal, same_as_ar (fraction of prompts with `ar`'s tokens; None when sampling)
    Rows carry round_new_tokens and round_wall_s (one entry per round, in prompt order)."""
    base = group[0]

    def pooled(row):
        return sum(row["round_new_tokens"]) / sum(row["round_wall_s"])

    for r in group:
        r["speedup"] = pooled(r) / pooled(base)
        r["round_speedups"] = [(t / w) / (bt / bw) for t, w, bt, bw in zip(
            r["round_new_tokens"], r["round_wall_s"], base["round_new_tokens"], base["round_wall_s"])]
        # None where the ideal is unknown (an auto: row whose profiled chunks all went to target-only)
        r["achieved_over_ideal"] = r["speedup"] / r["ideal_speedup"] if r["ideal_speedup"] else None
        # token equality is the greedy guarantee; sampled runs draw other random numbers
        r["same_as_ar"] = (float(np.mean([a == b for a, b in zip(r["token_ids"], base["token_ids"])]))
                           if temperature == 0 else None)


def speedup_cell(row: dict) -> str:
    """'1.14x [0.80-2.00]': the pooled speedup and the min-max of the per-round ones."""
    rounds = row["round_speedups"]
    return f"{row['speedup']:.2f}x [{min(rounds):.2f}-{max(rounds):.2f}]"


def output_name(row: dict) -> str:
    """outputs_<label>_T<t>_b<b>.jsonl (portable: ':' -> '__', '=' and '/' -> '-'); the run's adaptation
    events go to the same name with the prefix adapt_."""
    label = method_label(row["method"]).replace(":", "__").replace("=", "-").replace("/", "-")
    return f"outputs_{label}_T{row['temperature']:g}_b{row['batch_size']}.jsonl"


def table(rows: list[dict]) -> str:
    """The measured columns, then (with `--price`: rows carrying priced_step_ms) the priced ones.
    The step profile's "ideal speedup" (and achieved / ideal) stay in results.json only: timed phase
    by phase on a shared CPU they differ between identical decodes (issue 64), so no table shows them."""
    priced = any("priced_step_ms" in r for r in rows)
    head = ("| T | batch | method | tau median [min, max] | tokens/s | speedup [round min-max] "
            "| draft ms/token | draft share | draft fwd/token | verify ms/step | 1-token fwd ms "
            "| same as ar | compile s | calibrated (s) | adapt s (updates/decisions) |"
            + (" priced step ms | priced speedup | priced draft ms/token |" if priced else "")
            + "\n" + "|---" * (15 + 3 * priced) + "|")
    lines = [head]
    for r in rows:
        cells = (f" {_num(r.get('priced_step_ms'), digits=3)} | {_num(r.get('priced_speedup'), 'x')} | "
                 f"{_num(r.get('priced_draft_ms_per_token'), digits=3)} |") if priced else ""
        lines.append(
            f"| {r['temperature']:g} | {r['batch_size']} | {r['method']} | {r['tau_median']:.2f} [{r['tau_min']:.2f}, "
            f"{r['tau_max']:.2f}] | {r['tokens_per_s']:.1f} | {speedup_cell(r)} | "
            f"{_num(_scaled(r['draft_s_per_token'], 1000), digits=3)} | {_num(_scaled(r['draft_share'], 100), '%', 1)} | "
            f"{r['draft_forwards_per_token']:.2f} | {_num(r.get('verify_ms_per_step'), digits=3)} | "
            f"{_num(r.get('forward_1_ms'), digits=3)} | "
            f"{'n/a' if r['same_as_ar'] is None else format(r['same_as_ar'], '.2f')} | "
            f"{r['compile_s']:.1f} | {calibrated_cell(r)} | {adapt_cell(r)} |" + cells)
    return "\n".join(lines)


def sizing_table(rows: list[dict]) -> str:
    """Step sizing's table (rows with a `sizing` summary, decoding/sizing.py `summed_sizing`), or
    "": per method the share of steps at each size of its menu, the per-position acceptance (of
    steps that reached position d - 1 and drafted deeper, the share that accepted d), the expected
    against the committed tokens (calibration error), and the cost model's predicted tokens/s beside
    the measured."""
    sized = [r for r in rows if r.get("sizing")]
    if not sized:
        return ""
    lines = ["", "", "Step sizing (the steps of each size of the menu, share of row-steps; acceptance by draft "
             "position; expected vs committed tokens; the cost model's tokens/s beside the measured):", "",
             "| T | batch | method | steps at size | acceptance by position | expected / committed tokens "
             "(error) | predicted tokens/s | measured tokens/s |", "|---|---|---|---|---|---|---|---|"]
    for r in sized:
        z = r["sizing"]
        steps = ", ".join(f"{k}: {100 * f:.0f}%" for k, f in zip(z["sizes"], z["steps_share"]))
        acc = ", ".join("-" if a is None else f"{a:.2f}" for a in z["acceptance"][:8])
        err = "-" if z["calibration_error"] is None else f"{100 * z['calibration_error']:+.0f}%"
        lines.append(f"| {r['temperature']:g} | {r['batch_size']} | {r['method']} | {steps} | {acc} | "
                     f"{z['predicted_tokens']:.0f} / {z['committed_tokens']:.0f} ({err}) | "
                     f"{_num(z['predicted_tokens_per_s'], digits=1)} | {r['tokens_per_s']:.1f} |")
    return "\n".join(lines)


def _num(value, suffix: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _scaled(value, factor: float):
    return None if value is None else value * factor


def calibrated_cell(row: dict) -> str:
    best = row.get("calibrated")
    if not best:
        return "-"
    return " ".join(f"{k}={v}" for k, v in best.items()) + f" ({row['calibrate_s']:.1f})"


def adapt_cell(row: dict) -> str:
    a = row.get("adapt")
    if not a:
        return "-"
    return f"{row['adapt_s']:.1f} ({a['updates']}/{a['decisions']})"


def notes(meta: dict) -> str:
    """How the table was measured: the rounds, which prompts calibrated (held out from it) and,
    with `--price`, what the priced columns are."""
    lines = [f"{meta['num_prompts']} prompts in {meta['rounds']} rounds of contiguous prompts, every method on "
             "each round, the methods' order rotating by one per round; speedup = pooled tokens/s over all "
             "rounds / target-only's, [min-max] of the per-round ratios."]
    cal = meta.get("calibration_prompts")
    if cal:
        where = ("" if cal["held_out"] else "--calibrate-from ") + str(cal["source"])
        lines.append(f"Calibration (':calibrate=true') decoded {len(cal['ids'])} prompts of {where} "
                     f"(ids {', '.join(cal['ids'])}), excluded from measurement: none of them is measured.")
    if meta.get("price"):
        lines.append(meta["price"]["note"])
    return "\n".join(lines)


def closing_lines(rows: list[dict], out_dir: Path, own_command: str) -> list[str]:
    """The run's last three lines: where the outputs went, the fastest method (pooled speedup over
    target-only with the per-round min-max), and `own_command`, the same comparison on one's own
    checkpoint and drafter."""
    where = f"outputs: {out_dir}/ (results.md, results.json, speedup.png, outputs_*.jsonl)"
    others = [r for r in rows if r["method"] != "ar"]
    best = max(others, key=lambda r: r["speedup"], default=None)
    if best is None:
        fastest = "fastest: target-only, the only method run"
    else:
        at = f"(T={best['temperature']:g}, batch {best['batch_size']})"
        if best["speedup"] > 1:
            fastest = f"fastest: {method_label(best['method'])}, {speedup_cell(best)} target-only's tokens/s {at}"
        else:
            fastest = (f"fastest: target-only; the best other method, {method_label(best['method'])}, ran at "
                       f"{speedup_cell(best)} its tokens/s {at}")
    return [where, fastest, f"your own model: {own_command}"]


def write_results(out_dir: Path, meta: dict, records: list[dict], group: list[dict], rows: list[dict]) -> None:
    """Writes a finished (batch size, temperature) group's completions and rewrites results.json /
    results.md with every row so far (meta["complete"] is False until the last group), so an
    interrupted run keeps the groups it finished."""
    for r in group:  # every method's completions, for inspection
        name = output_name(r)
        with (out_dir / name).open("w", encoding="utf-8") as f:
            for rec, ids, text in zip(records, r["token_ids"], r["texts"]):
                f.write(json.dumps({"id": rec["id"], "text": text, "token_ids": ids}, ensure_ascii=False) + "\n")
        if r.get("adapt_events") is not None:
            with (out_dir / name.replace("outputs_", "adapt_")).open("w", encoding="utf-8") as f:
                for e in r["adapt_events"]:
                    f.write(json.dumps(e) + "\n")
    summary = [{k: v for k, v in r.items() if k not in ("token_ids", "texts", "adapt_events")} for r in rows]
    (out_dir / "results.json").write_text(json.dumps({"meta": meta, "results": summary}, indent=2))
    status = "" if meta["complete"] else "\n(partial: the run has not finished every group yet)\n"
    md = f"# specblock-bench\n\n{meta['date']}, {meta['machine']['platform']}, " \
         f"{meta['machine']['cpus']} CPUs, backend {meta['machine']['backend']}\n\n" \
         f"`{meta['command']}`\n{status}\n{notes(meta)}\n\n{table(rows)}{sizing_table(rows)}\n"
    (out_dir / "results.md").write_text(md)


def replot(out_dir: Path) -> None:
    """Redraws speedup.png (and adapt_tau.png, auto_decisions.png) from a run's results.json and
    adapt_*.jsonl."""
    rows = json.loads((out_dir / "results.json").read_text())["results"]
    for r in rows:
        events = out_dir / output_name(r).replace("outputs_", "adapt_")
        if r.get("adapt") and events.exists():
            r["adapt_events"] = [json.loads(x) for x in events.read_text().splitlines()]
    plot(rows, out_dir / "speedup.png")
    if any(r.get("adapt") for r in rows):
        plot_adaptation(rows, out_dir / "adapt_tau.png")
    if any(r.get("auto_events") for r in rows):
        plot_auto(rows, out_dir / "auto_decisions.png")


def plot(rows: list[dict], path: Path) -> None:
    """Pooled speedup per method (error bars: the per-round min-max) and tau, one bar per
    (temperature, batch size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["temperature"], r["batch_size"]) for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / len(groups)
    for k, (t, b) in enumerate(groups):
        sub = {r["method"]: r for r in rows if (r["temperature"], r["batch_size"]) == (t, b)}
        x = np.arange(len(methods)) + k * width
        speedup = np.asarray([sub[m]["speedup"] for m in methods])
        spread = np.asarray([[s - min(sub[m]["round_speedups"]), max(sub[m]["round_speedups"]) - s]
                             for s, m in zip(speedup, methods)]).T
        axes[0].bar(x, speedup, width, yerr=spread, capsize=3, label=f"T={t:g}, batch {b}")
        axes[1].bar(x, [sub[m]["tau_median"] for m in methods], width, label=f"T={t:g}, batch {b}")
    titles = ("speedup vs target-only (pooled; bars: round min-max)", "tau (median over prompts)")
    for ax, title in zip(axes, titles):
        ax.set_xticks(np.arange(len(methods)) + width * (len(groups) - 1) / 2)
        ax.set_xticklabels([method_label(m) for m in methods], rotation=20, fontsize=8)
        ax.set_title(title)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_adaptation(rows: list[dict], path: Path, window: int = 8) -> None:
    """tau per batch over the run (moving average over `window` batches), one line per method
    (adapted runs dashed), one panel per (temperature, batch size); ticks along the bottom mark the
    batches after which each adapted run updated its drafter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["temperature"], r["batch_size"]) for r in rows})
    fig, axes = plt.subplots(1, len(groups), figsize=(7 * len(groups), 4.5), squeeze=False)
    for ax, (t, b) in zip(axes[0], groups):
        runs = [r for r in rows if (r["temperature"], r["batch_size"]) == (t, b) and r["method"] != "ar"]
        for n, r in enumerate(runs):
            taus = np.asarray(r["batch_taus"])
            k = min(window, len(taus))
            smooth = np.convolve(taus, np.ones(k) / k, mode="valid")
            adapted = r.get("adapt_events") is not None
            line, = ax.plot(np.arange(k - 1, len(taus)), smooth, ls="--" if adapted else "-",
                            label=method_label(r["method"]))
            if adapted:
                ups = [e["batch"] for e in r["adapt_events"] if e.get("update")]
                ax.plot(ups, [0.02 + 0.03 * n] * len(ups), "|", color=line.get_color(), ms=8,
                        transform=ax.get_xaxis_transform())
        ax.set_title(f"tau per batch, moving average of {window} (T={t:g}, batch {b})")
        ax.set_xlabel("batch (decoding order; ticks: updates)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
