"""BlockPilot with priced labels against every fixed block size and the per-request oracle, priced
for v5p (results.md, results.json and scatter.png beside this file).

    .venv/bin/python benchmarks/blockpilot_priced/compare.py [--drafter assets/drafters/blockpilot-v5p]

Inputs, all committed: tau.json (per-request tau and target forwards at sizes 4-8, measured on
this CPU; tau_table.py), costs_v5p.json (each size's DFlash step and the target-only step priced at
Qwen3-8B shapes on v5p:2x2x1, batch 1, context 2048; costs.py) and the shipped policy. Per split
(train, held-out, HumanEval) and method (each fixed size; the oracle = each request at its priced
label; the policy = each request at the size the policy picks from its prefill; "best tau" = each
request at its highest-tau size, ties to 8: the labels without pricing):
- mean tau over requests;
- priced speedup = total tokens / total priced time, over target-only: target_ms x sum_r
  (new_r - 1) / sum_r (forwards_r(s_r) - 1) x step_ms(s_r), with s_r the method's size for request
  r (the decoding phase: the prefill and its token are the same for every method and left out);
  beside it the per-request mean of tau_r x target_ms / step_ms(s_r);
- how often each size is chosen.
Targets (issue 40): the policy's priced speed >= the best fixed size's, and its gain over that size
>= 50% of the oracle's. The measured CPU bench of the same methods is run.sh's step 5 (BENCH=1).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
from pathlib import Path

import jax.numpy as jnp
import numpy as np

HERE = Path(__file__).resolve().parent
SPLITS = {"train": "train", "heldout": "held-out", "humaneval": "HumanEval"}
PLANNED = {"train": 320, "heldout": 200, "humaneval": 24}  # labels.sh's prompts per split
TRAINING_BLOCK = 8  # the shipped DFlash drafter's training block size: ties go to it


def priced_labels(table: dict, costs: dict, split: str) -> list[int]:
    """The oracle's size index per request of `split`: the best tau / priced step ms, ties to 8."""
    from specblock_jax.drafters.blockpilot import oracle_labels
    tau = np.asarray(table["splits"][split]["tau"], np.float64)
    step = np.asarray([costs["step_ms"][str(s)] for s in table["sizes"]], np.float64)
    return oracle_labels(tau / step, table["sizes"], TRAINING_BLOCK)


def method_row(sp: dict, choice: np.ndarray, step: np.ndarray, target_ms: float, n_sizes: int) -> dict:
    """Mean tau, priced speedups and size counts of one method (`choice` [n] size indices)."""
    r = np.arange(len(choice))
    tau = np.asarray(sp["tau"], np.float64)[r, choice]
    steps = np.asarray(sp["forwards"], np.float64)[r, choice] - 1
    tokens = np.asarray(sp["new_tokens"], np.float64) - 1
    return {"mean_tau": float(tau.mean()),
            "priced_speedup": float(target_ms * tokens.sum() / (steps * step[choice]).sum()),
            "priced_speedup_request_mean": float(np.mean(tau * target_ms / step[choice])),
            "counts": np.bincount(choice, minlength=n_sizes).tolist()}


def policy_choices(drafter_dir: Path, table: dict) -> dict[str, np.ndarray]:
    """Per split, the size index the shipped policy picks for each request from its prefill."""
    from flax import nnx

    import specblock_jax as sbj
    from specblock_jax.decoding.prompts import read_prompts
    from specblock_jax.drafters.blockpilot import prefill_features

    target = sbj.load_target("assets/target")
    drafter, params = sbj.load_drafter(drafter_dir, target)
    if list(drafter.policy.sizes) != table["sizes"]:
        raise SystemExit(f"{drafter_dir}: policy sizes {drafter.policy.sizes}, the table has {table['sizes']}")
    mlp = nnx.merge(drafter.policy_graphdef, params["policy"])
    out = {}
    for name, sp in table["splits"].items():
        text = {r["id"]: r["prompt"] for r in read_prompts(Path(sp["prompts"]))[0]}
        x = prefill_features(target, [text[i] for i in sp["ids"]], drafter.policy.features, drafter.policy.top_k)
        out[name] = np.asarray(jnp.argmax(mlp(jnp.asarray(x)), -1))
    return out


def compare(table: dict, costs: dict, choices: dict[str, np.ndarray]) -> dict:
    from specblock_jax.drafters.blockpilot import oracle_labels
    sizes, target_ms = table["sizes"], costs["target_step_ms"]
    step = np.asarray([costs["step_ms"][str(s)] for s in sizes], np.float64)
    out = {}
    for name, sp in table["splits"].items():
        n, tau = len(sp["ids"]), np.asarray(sp["tau"], np.float64)
        oracle = np.asarray(priced_labels(table, costs, name))
        methods = {f"DFlash {s}": np.full(n, k) for k, s in enumerate(sizes)}
        methods.update({"oracle (priced labels)": oracle, "BlockPilot-v5p": choices[name],
                        "best tau (unpriced)": np.asarray(oracle_labels(tau, sizes, TRAINING_BLOCK))})
        rows = {m: method_row(sp, c, step, target_ms, len(sizes)) for m, c in methods.items()}
        best = max((m for m in rows if m.startswith("DFlash")), key=lambda m: rows[m]["priced_speedup"])
        pol, orc, fix = (rows[m]["priced_speedup"] for m in ("BlockPilot-v5p", "oracle (priced labels)", best))
        gain = (pol - fix) / (orc - fix) if orc > fix else None
        out[name] = {"prompts": n, "methods": rows, "best_fixed": best,
                     "policy_accuracy": float(np.mean(choices[name] == oracle)),
                     "policy_vs_best_fixed": pol / fix, "oracle_vs_best_fixed": orc / fix,
                     "policy_share_of_oracle_gain": gain,
                     "target_at_least_best_fixed": bool(pol >= fix),
                     "target_half_oracle_gain": None if gain is None else bool(gain >= 0.5),
                     "oracle_size": [sizes[k] for k in oracle], "policy_size": [sizes[k] for k in choices[name]],
                     "title": f"{SPLITS[name]} (prompts {sp.get('skip', 0)}-{sp.get('skip', 0) + n - 1})"}
    return out


def scatter(res: dict, sizes: list[int], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ("heldout", "humaneval") if n in res]
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4.6), squeeze=False)
    rng = np.random.default_rng(0)
    for ax, name in zip(axes[0], names):
        o, p = np.asarray(res[name]["oracle_size"]), np.asarray(res[name]["policy_size"])
        ax.scatter(o + rng.uniform(-0.25, 0.25, len(o)), p + rng.uniform(-0.25, 0.25, len(p)), s=12, alpha=0.6)
        for a in sizes:
            for b in sizes:
                c = int(np.sum((o == a) & (p == b)))
                if c:
                    ax.annotate(str(c), (a + 0.3, b + 0.3), fontsize=8, color="C3")
        ax.plot([min(sizes), max(sizes)], [min(sizes), max(sizes)], "k:", lw=0.8)
        lim = (min(sizes) - 0.6, max(sizes) + 0.7)
        ax.set(xticks=sizes, yticks=sizes, xlim=lim, ylim=lim, xlabel="oracle size (priced labels)",
               ylabel="BlockPilot-v5p size",
               title=f"{res[name]['title']}: accuracy {res[name]['policy_accuracy']:.2f}")
    fig.suptitle("Per request: the policy's block size against the priced oracle's (v5p:2x2x1, Qwen3-8B)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(res: dict, table: dict, costs: dict, command: str) -> str:
    sizes = table["sizes"]
    src = costs["source"]
    lines = [
        "# BlockPilot with labels priced for TPU (v5p:2x2x1, Qwen3-8B shapes)", "",
        f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, "
        f"{platform.platform()}: `{command}` (run.sh has every step).", "",
        "**Estimates, not measurements.** tau is measured on this CPU with the miniature target "
        "(`assets/target`) and the DFlash drafter shipped until 2026-12-05 (`configs/drafters/dflash-v2.yaml`; greedy, 64 new tokens, per request at "
        "each size: tau.json); each size's step cost is the TPU compiler's priced DFlash step at "
        f"Qwen3-8B shapes on {src['topology']}, batch {src['batch']}, context {src['context']} "
        f"({src['compiler']}; costs_v5p.json, copied from `{src['file']}` rows "
        + ", ".join(f"`{v}`" for v in src["rows"].values()) + ").", "",
        "| | target-only | " + " | ".join(f"DFlash {s}" for s in sizes) + " |",
        "|---|---|" + "---|" * len(sizes),
        "| priced step ms | " + f"{costs['target_step_ms']:.3f} | "
        + " | ".join(f"{costs['step_ms'][str(s)]:.3f}" for s in sizes) + " |", "",
        "Candidates: sizes 4-8, a one-sided window below the drafter's training block size 8 "
        "(decoding caps the block at the training size; the public BlockPilot picks 14-18 around "
        "16). Labels: the size of highest priced speed, tau / priced step ms, ties to 8. Priced "
        "speedup = total tokens / total priced time against target-only (module docstring of "
        "compare.py); the per-request mean of tau x target / step is in results.json.", ""]
    short = [f"{SPLITS[n]} {r['prompts']} of {PLANNED[n]}" for n, r in res.items() if r["prompts"] < PLANNED[n]]
    if short:
        lines += ["**Prompts covered:** " + ", ".join(short) + " (the tau runs did not finish on the shared "
                  "CPU; `sh benchmarks/blockpilot_priced/run.sh` resumes them and remakes everything below).", ""]
    lines += ["## Priced labels", "",
              "| split | prompts | priced labels " + " / ".join(map(str, sizes))
              + " | best-tau labels " + " / ".join(map(str, sizes)) + " | policy's choices |", "|---|---|---|---|---|"]
    for name, r in res.items():
        m = r["methods"]
        lines.append(f"| {r['title']} | {r['prompts']} | "
                     + " / ".join(map(str, m["oracle (priced labels)"]["counts"])) + " | "
                     + " / ".join(map(str, m["best tau (unpriced)"]["counts"])) + " | "
                     + " / ".join(map(str, m["BlockPilot-v5p"]["counts"])) + " |")
    lines += ["", "## Comparison", ""]
    for name, r in res.items():
        lines += [f"**{r['title']}** (policy accuracy against the priced labels {r['policy_accuracy']:.3f})", "",
                  "| method | mean tau | priced speedup (total) | per-request mean | sizes " + " / ".join(map(str, sizes)) + " |",
                  "|---|---|---|---|---|"]
        for meth, row in r["methods"].items():
            bold = "**" if meth in ("BlockPilot-v5p", r["best_fixed"]) else ""
            lines.append(f"| {bold}{meth}{bold} | {row['mean_tau']:.3f} | {row['priced_speedup']:.3f}x | "
                         f"{row['priced_speedup_request_mean']:.3f}x | " + " / ".join(map(str, row["counts"])) + " |")
        lines.append("")
    lines += ["## Targets (T = 0, batch 1, priced for v5p)", "",
              "| split | best fixed | policy / best fixed | oracle / best fixed | policy's share of the oracle's gain "
              "| policy >= best fixed | >= 50% of the oracle's gain |", "|---|---|---|---|---|---|---|"]
    for name in ("heldout", "humaneval"):
        r = res[name]
        share = "-" if r["policy_share_of_oracle_gain"] is None else f"{100 * r['policy_share_of_oracle_gain']:.0f}%"
        ok = lambda b: "n/a" if b is None else ("**met**" if b else "**missed**")  # noqa: E731
        lines.append(f"| {r['title']} | {r['best_fixed']} | {r['policy_vs_best_fixed']:.4f} | "
                     f"{r['oracle_vs_best_fixed']:.4f} | {share} | {ok(r['target_at_least_best_fixed'])} | "
                     f"{ok(r['target_half_oracle_gain'])} |")
    lines += ["", "![policy size against oracle size](scatter.png)", "",
              "## Measured on the CPU (to run on an idle machine)", "",
              "Not run here: `BENCH=1 sh benchmarks/blockpilot_priced/run.sh` (its step 5) benches target-only, "
              "DFlash at sizes 4-8, BlockPilot-v5p and the priced-label oracle (`:oracle=data/blockpilot-v5p/<split>`, "
              "label folders restored from tau.json with the priced costs) on held-out prompts 0-31 and "
              "HumanEval 0-23: 128 new tokens, T = 0 and 1, batch 1 and 8, 3 interleaved rounds, "
              "`--price v5p:2x2x1,qwen3-8b`.", ""]
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--drafter", type=Path, default=Path("assets/drafters/blockpilot-v5p"))
    p.add_argument("--table", type=Path, default=HERE / "tau.json")
    p.add_argument("--costs", type=Path, default=HERE / "costs_v5p.json")
    p.add_argument("--out-dir", type=Path, default=HERE)
    args = p.parse_args(argv)
    table, costs = json.loads(args.table.read_text()), json.loads(args.costs.read_text())
    res = compare(table, costs, policy_choices(args.drafter, table))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    scatter(res, table["sizes"], args.out_dir / "scatter.png")
    command = ".venv/bin/python benchmarks/blockpilot_priced/compare.py"
    (args.out_dir / "results.json").write_text(json.dumps(
        {"command": command, "sizes": table["sizes"], "costs": costs, "splits": res}, indent=1) + "\n")
    (args.out_dir / "results.md").write_text(markdown(res, table, costs, command))
    print((args.out_dir / "results.md").read_text())


if __name__ == "__main__":
    main()
