"""Issue 40 item 5: the comparison tables and the targets, from the three runs of run.sh.

    .venv/bin/python benchmarks/seed_claims/summary.py [outputs/benchmarks/seed_claims]

prints the tables of results.md (its "Tables" section; the reading above them is written by hand).

Reads each prompt set's results.json (written by `specblock-bench`) and prints, per set and per
(temperature, batch size) group, one row per method with the issue's columns, then the targets
checked at T = 0, batch 1. Also copies each run's rows (token ids dropped) to
benchmarks/seed_claims/<TAG><set>.json.gz (gzipped), so the rows behind the tables stay in the repository (TAG, the second
argument, keeps another run's copies apart; the committed copies have none).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETS = [("heldout", "the project's held-out prompts"), ("humaneval", "HumanEval"),
        ("unseen_sympy", "sympy windows (a package no drafter trained on; the corpus leaves it out)")]
LABELS = {"ar": "target-only", "prompt_lookup": "prompt lookup", "assets/drafters/eagle3": "EAGLE-3",
          "assets/drafters/specblock-data": "SpecBlock (data-matched)",
          "assets/drafters/specblock-data-all": "SpecBlock (data-matched, prefix_norm=all)",
          "assets/drafters/specblock": "SpecBlock (compute-matched, ablation)",
          "assets/drafters/dflash": "DFlash 8",
          "assets/drafters/dflash-plateau": "DFlash 8 (trained to the stopping rule)",
          "assets/drafters/blockpilot": "BlockPilot (CPU labels)",
          "assets/drafters/blockpilot-v5p": "BlockPilot (v5p-priced labels)"}
# since 2026-12-05 assets/drafters/specblock-data holds the prefix_norm=all retrain (the first run's
# "specblock-data-all"; tag "run1_" labels that run's folders as they were, docs/findings.md)
LABELS["assets/drafters/specblock-data"] = "SpecBlock (data-matched, prefix_norm=all)"
# since 2026-12-07 the data-matched drafter is assets/drafters/specblock and the compute-matched one
# assets/drafters/specblock-compute (issue 57); the committed rows keep the names they ran under
LABELS["assets/drafters/specblock-compute"] = "SpecBlock (compute-matched, ablation)"
LABELS["assets/drafters/specblock"] = "SpecBlock (data-matched, prefix_norm=all)"
RELABEL = {"run1_": {"assets/drafters/specblock-data": "SpecBlock (data-matched)",
                     "assets/drafters/specblock": "SpecBlock (compute-matched, ablation)"}}
DROP = ("token_ids", "texts", "taus", "batch_tokens_per_s")  # the copies stay small


def label(method: str) -> str:
    if method.startswith("assets/drafters/dflash:block_size="):
        return f"DFlash {method.rsplit('=', 1)[1]}"
    if method.startswith("assets/drafters/dflash-plateau:block_size="):
        return f"DFlash {method.rsplit('=', 1)[1]} (trained to the stopping rule)"
    return LABELS.get(method, method)


def set_tag(tag: str) -> None:
    """Applies the run `tag`'s relabelling (RELABEL)."""
    LABELS.update(RELABEL.get(tag, {}))


def load(root: Path) -> dict:
    runs = {}
    for name, _ in SETS:
        path = root / name / "results.json"
        if path.exists():
            data = json.loads(path.read_text())
            data["rows"] = [{k: v for k, v in r.items() if k not in DROP} for r in data.pop("results")]
            runs[name] = data
    return runs


def fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def group_table(rows: list[dict]) -> str:
    lines = ["| method | tau (run) | drafter fwd / token | CPU draft ms / token | CPU speedup [round min-max] "
             "| priced speedup | priced draft ms / token |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        rounds = r["round_speedups"]
        lines.append(f"| {label(r['method'])} | {r['tau_run']:.2f} | {r['draft_forwards_per_token']:.2f} | "
                     f"{1e3 * r['draft_s_per_token']:.3f} | {r['speedup']:.2f}x [{min(rounds):.2f}-{max(rounds):.2f}] "
                     f"| {fmt(r.get('priced_speedup'), '.2f', 'x')} | {fmt(r.get('priced_draft_ms_per_token'), '.3f')} |")
    return "\n".join(lines)


def pick(rows: list[dict], name: str) -> dict | None:
    return next((r for r in rows if label(r["method"]) == name), None)


def targets(runs: dict) -> str:
    out = ["## Targets (T = 0, batch 1)", ""]
    held = [r for r in runs.get("heldout", {}).get("rows", []) if r["temperature"] == 0 and r["batch_size"] == 1]
    e = pick(held, "EAGLE-3")
    for variant in ("SpecBlock (data-matched)", "SpecBlock (data-matched, prefix_norm=all)"):
        s = pick(held, variant)
        if not (e and s):
            continue
        checks = [("SpecBlock priced speedup / EAGLE-3's", s["priced_speedup"], e["priced_speedup"], ">=", 1.08),
                  ("SpecBlock priced draft ms per token / EAGLE-3's", s["priced_draft_ms_per_token"],
                   e["priced_draft_ms_per_token"], "<=", 0.55),
                  ("SpecBlock tau / EAGLE-3's", s["tau_run"], e["tau_run"], ">=", 0.9)]
        out += [f"{variant}, held-out prompts, priced for v5p at Qwen3-8B shapes (acceptance measured here):", "",
                "| target | SpecBlock | EAGLE-3 | ratio | wanted | met |", "|---|---|---|---|---|---|"]
        for name, a, b, op, want in checks:
            ratio = None if a is None or b is None else a / b
            met = "-" if ratio is None else ("yes" if (ratio >= want if op == ">=" else ratio <= want) else "no")
            out.append(f"| {name} | {fmt(a, '.3f')} | {fmt(b, '.3f')} | {fmt(ratio, '.3f')} | {op} {want} | {met} |")
        out.append("")
    fixed = [r for r in held if label(r["method"]).startswith("DFlash ")]
    bp = pick(held, "BlockPilot (v5p-priced labels)")
    if fixed and bp and bp.get("priced_speedup") is not None:
        best = max(fixed, key=lambda r: r["priced_speedup"] or 0)
        out += [f"BlockPilot (v5p-priced labels) priced speedup {bp['priced_speedup']:.3f}x against the best fixed "
                f"size, {label(best['method'])}, {best['priced_speedup']:.3f}x (the oracle's gain over it: "
                "docs/findings.md, blockpilot_priced).", ""]
    out += ["EAGLE-3 against target-only, measured on this CPU:", "", "| prompt set | EAGLE-3 CPU speedup [round min-max] "
            "| >= 1.0x |", "|---|---|---|"]
    for name, title in SETS:
        rows = [r for r in runs.get(name, {}).get("rows", []) if r["temperature"] == 0 and r["batch_size"] == 1]
        e = pick(rows, "EAGLE-3")
        if e:
            rounds = e["round_speedups"]
            out.append(f"| {title} | {e['speedup']:.2f}x [{min(rounds):.2f}-{max(rounds):.2f}] | "
                       f"{'yes' if e['speedup'] >= 1.0 else 'no'} |")
    return "\n".join(out)


def main(argv: list[str]) -> None:
    root = Path(argv[0]) if argv else Path("outputs/benchmarks/seed_claims")
    tag = argv[1] if len(argv) > 1 else ""
    set_tag(tag)
    runs = load(root)
    print("# The seeds' claims: one comparison, measured on this CPU and priced for v5p (issue 40, item 5)\n")
    print("Made by `sh benchmarks/seed_claims/run.sh` (commands and settings in its header), tables by "
          "`python benchmarks/seed_claims/summary.py`. Priced columns are **estimates, not measurements**: "
          "acceptance (tau of the run) from the miniature target here, step costs from the TPU compiler at "
          "Qwen3-8B shapes on v5p:2x2x1 (context 2048 + 128). CPU columns are measured on the 2-core CPU.\n")
    for name, title in SETS:
        if name not in runs:
            print(f"## {title}\n\nNot run.\n")
            continue
        meta = runs[name]["meta"]
        with gzip.open(HERE / f"{tag}{name}.json.gz", "wt") as f:
            json.dump(runs[name], f, separators=(",", ":"))
        print(f"## {title}\n\n{meta['num_prompts']} prompts (`{meta['prompts']}`), {meta['max_new_tokens']} new "
              f"tokens, {meta['rounds']} rounds, {meta['date']}; complete: {meta.get('complete')}.\n")
        rows = runs[name]["rows"]
        for key in sorted({(r["temperature"], r["batch_size"]) for r in rows}):
            group = [r for r in rows if (r["temperature"], r["batch_size"]) == key]
            print(f"### T = {key[0]:g}, batch {key[1]}\n\n{group_table(group)}\n")
    print(targets(runs))


if __name__ == "__main__":
    main(sys.argv[1:])
