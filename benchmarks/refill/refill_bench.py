"""Continuous batching against static batching, one process, one run.

A job of --requests prompts (HumanEval, then the held-out and training prompt sets, in file order)
with max_new_tokens drawn uniformly from [--min-new, --max-new] (seeded; stop tokens end rows
earlier), decoded greedily by each method at each batch size with refill off and on, back to
back; then a job of equal budgets (--equal-requests x --equal-new). Reports tokens/s (decode-loop
wall, compilation excluded, summed over batches / segments), the share of idle row-steps (row
slots of the loop's steps whose row was done or padding: 1 - active row-steps / (B x steps)), and
whether outputs are identical.

    python benchmarks/refill/refill_bench.py --methods ar,assets/drafters/eagle3 --batch-sizes 8,16 \\
        --refill-rows 1,4 --out outputs/refill/results.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import specblock_jax as sbj
from specblock_jax.decoding.compiled import cached_count, release
from specblock_jax.serving.methods import resolve_method

PROMPT_FILES = ("assets/prompts/humaneval.jsonl", "assets/prompts/heldout.jsonl", "assets/prompts/train.jsonl")


def load_prompts(n: int) -> list[str]:
    out = []
    for path in PROMPT_FILES:
        for line in Path(path).read_text().splitlines():
            out.append(json.loads(line)["prompt"])
            if len(out) == n:
                return out
    raise SystemExit(f"only {len(out)} prompts in {PROMPT_FILES}")


def measure(target, drafter, prompts, budgets, batch_size: int, refill: bool, refill_rows: int = 1) -> dict:
    start, mark = time.perf_counter(), cached_count()
    res = sbj.generate(target, prompts, drafter=drafter, max_new_tokens=budgets, batch_size=batch_size,
                       refill=refill, refill_rows=refill_rows)
    release(mark)  # XLA:CPU runs out of code memory with a few hundred live executables
    batches = {r.stats.batch: (r.stats.total_time_s, r.stats.batch_steps, r.stats.compile_s) for r in res}
    wall = sum(w for w, _, _ in batches.values())
    tokens = sum(len(r.token_ids) for r in res)
    active = sum(r.stats.target_forwards - 1 for r in res)
    steps = sum(s for _, s, _ in batches.values())
    row_steps = batch_size * steps
    return {"refill": refill, "refill_rows": refill_rows if refill else None, "batch_size": batch_size,
            "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "idle_row_step_share": 1 - active / max(row_steps, 1),
            "loop_steps": steps, "batches_or_segments": len(batches),
            "stopped": sum(r.stats.finish_reason == "stop" for r in res),
            "compile_s": sum(c for _, _, c in batches.values()), "elapsed_s": time.perf_counter() - start,
            "outputs": [r.token_ids for r in res]}


def run_job(name, target, methods, prompts, budgets, batch_sizes, refill_rows, rows, save) -> None:
    for method in methods:
        drafter = resolve_method(method, target)
        for b in batch_sizes:
            off = measure(target, drafter, prompts, budgets, b, refill=False)
            ons = [measure(target, drafter, prompts, budgets, b, refill=True, refill_rows=k)
                   for k in refill_rows if k <= b]
            reference = off.pop("outputs")
            for r in (off, *ons):
                same = r.pop("outputs", reference) == reference
                rows.append({"job": name, "method": method, **r, "same_outputs": same,
                             "speedup_vs_static": r["tokens_per_s"] / off["tokens_per_s"]})
                print(json.dumps(rows[-1]), flush=True)
            save(rows)  # after every batch size: a crash loses at most one


def table(rows) -> str:
    lines = ["| job | method | batch | refill (rows per return) | tokens/s | vs static | idle row-steps | loop steps | "
             "segments | same outputs |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mode = f"on ({r['refill_rows']})" if r["refill"] else "off"
        lines.append(f"| {r['job']} | {r['method']} | {r['batch_size']} | {mode} | "
                     f"{r['tokens_per_s']:.0f} | {r['speedup_vs_static']:.2f}x | {r['idle_row_step_share']:.1%} | "
                     f"{r['loop_steps']} | {r['batches_or_segments']} | {r['same_outputs']} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="assets/target")
    p.add_argument("--methods", default="ar,assets/drafters/eagle3")
    p.add_argument("--batch-sizes", default="8,16")
    p.add_argument("--refill-rows", default="1", help="refill variants: rows free before the loop returns")
    p.add_argument("--requests", type=int, default=512)
    p.add_argument("--min-new", type=int, default=16)
    p.add_argument("--max-new", type=int, default=512)
    p.add_argument("--equal-requests", type=int, default=128)
    p.add_argument("--equal-new", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("outputs/refill/results.json"))
    a = p.parse_args()
    target = sbj.load_target(a.target)
    methods = a.methods.split(",")
    sizes = [int(x) for x in a.batch_sizes.split(",")]
    refill_rows = [int(x) for x in a.refill_rows.split(",")]
    prompts = load_prompts(max(a.requests, a.equal_requests))
    budgets = np.random.default_rng(a.seed).integers(a.min_new, a.max_new + 1, a.requests).tolist()
    rows: list[dict] = []
    a.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"target": a.target, "requests": a.requests, "budgets": [a.min_new, a.max_new],
            "equal": [a.equal_requests, a.equal_new], "seed": a.seed}

    def save(rows) -> None:
        a.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        a.out.with_suffix(".md").write_text(table(rows) + "\n")

    run_job(f"spread {a.min_new}-{a.max_new}", target, methods, prompts[:a.requests], budgets, sizes, refill_rows, rows,
            save)
    if a.equal_requests:
        run_job(f"equal {a.equal_new}", target, methods, prompts[:a.equal_requests],
                [a.equal_new] * a.equal_requests, sizes, refill_rows, rows, save)
    print(table(rows))


if __name__ == "__main__":
    main()
