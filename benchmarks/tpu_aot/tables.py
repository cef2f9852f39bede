"""Markdown tables of benchmarks/tpu_aot/results.json (run.py's rows), printed for results.md.

    python benchmarks/tpu_aot/tables.py [results.json]

ms = the roofline of the TPU compiler's per-device FLOPs and bytes on the chip (report.py
`roofline_seconds`); "compiler ms" = its own optimal_seconds where it gave one. Priced speedup =
tau x priced target_step / priced spec_step, tau measured on the embedded default (run.py TAU).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specblock_jax.aot import roofline_seconds

HERE = Path(__file__).resolve().parent
HEADER = """# Qwen3-8B on TPU topologies, compiled ahead of time on a CPU (issue 39)

**Estimates, not measurements.** No TPU ran. Every phase below is the library's own jitted
function (`specblock_jax/aot`, docs/tpu_aot.md) compiled by libtpu 0.0.42.1 (`jax[tpu]==0.10.2`)
for the named topology, from abstract bf16 arguments (no weights), on the 2-core x86-64 CPU
(Linux VM) that runs the tests. Rows of 2026-12-04 ran one at a time at normal priority, with a
drafter training job and helpers' tests beside them at nice 19 (compile times a little above the
machine alone). Rows added 2026-12-05 (v5p at batch 32 / 8k: the 90-node tree and DFlash; v6e at
batch 32: SpecBlock's shipped tree and DFlash 8; the Llama-3.1-70B training rows) ran at nice 19
beside training, benches and tests, and were paused (SIGSTOP) during benches: their compile_s
is wall time, not compile time (up to 5,066 s).

**Attention**: every row here prices the dense attention of before issue 66 (`attention="full"`:
scores over the whole cache). attention.md prices cascade attention and the TPU kernels against it
(`python benchmarks/tpu_aot/attention.py`).

```
python benchmarks/tpu_aot/run.py --only phases          # the phase rows (resumable), then this file
python benchmarks/tpu_aot/run.py --only train --only compile      # (run.py renders results.md by tables.py)
```

- **ms** = max(FLOPs / peak bf16 FLOP/s, bytes accessed / HBM bandwidth) per device, from the
  compiler's per-device counts of the layers-unrolled program (`accounting="unrolled"`), attention
  over the whole cache (context + 256 + N slots); v5p 459 TFLOP/s and 2,765 GB/s per chip, v6e
  918 and 1,640. "compiler ms" = libtpu's own `optimal_seconds` (its own roofline; `-` where it
  returned a negative value, i.e. no estimate).
- **fits** = arguments + outputs + temporaries - donated bytes per device, from the compiler's
  memory analysis, against the chip's HBM (v5e 16 GiB, v5p 95 GiB, v6e 32 GiB).
- **Mesh**: decoding all chips tensor-parallel (`data=1,model=4` on 4 chips); training all FSDP
  (`data=8` on 8 chips), the project's training plan.
- **Priced speedup** = tau x priced target_step / priced step of the method, tau = mean tokens
  committed per target forward (bonus included) measured on the embedded default (target v2, 12
  layers) at T = 0, batch 1: methods_v2's `results.json` (2026-12-02; retired, in git at cbc5fde:
  `docs/findings.md`), run "heldout" (prompt lookup
  4.09, EAGLE-3 16-node tree 3.432, SpecBlock shipped tree 1.671, DFlash block 8 2.038) and run
  "heldout_calibrated" (SpecBlock 90-node tree 1.92). Acceptance from the miniature, costs from
  the compiler at Qwen3-8B shapes; methods with no measured tau at that setting (EAGLE-3 chain,
  DFlash 4 and 16) have none.
- Drafters as released (docs/tpu_aot.md): EAGLE-3 1 layer + 32k draft vocabulary; SpecBlock 2
  layers, block 4, 32k draft vocabulary (shipped tree: 16 nodes; the reference's tree: 90 nodes,
  slot 0 drafts 10, beam 10, 2 blocks); DFlash 5 layers, features of decoder layers 1, 9, 17, 25,
  33 (z-lab Qwen3-8B-DFlash-b16), at blocks 4, 8, 16. EAGLE-3 chain of 5 = top_k 1, depth 5, 6 nodes.
- A step is priced, never the loop: `spec_step` = propose + tree forward + verification and
  commit + update, greedy; `target_step` = one target-only token (with its sampling).

"""
FOOTER = """
## Reading the tables

- **Decoding is weight-bound at batch 1**: Qwen3-8B's one-token step on 4 v5p chips is priced at
  1.42 ms (3.92 GB read per chip; DESIGN.md's anchor ~1.4 ms), and a speculative step at
  1.35-2.1x that, not ~1x.
- **Where a step's time goes** (the breakdown, v5p, batch 1, 2k): verifying the tree
  (`tree_forward`) costs 1.77-1.87 ms whatever the method, 1.25-1.32x a one-token step (the
  attention over the whole cache and the hidden states the drafter reads for N nodes instead of
  one). Drafting (propose + update) per step: EAGLE-3 0.62 ms, SpecBlock 0.86 ms (1.38x EAGLE-3's),
  DFlash 0.96-0.98 ms (five layers and the target's full-vocabulary head). Verification and
  commit cost 0.13 ms.
- **SpecBlock's update is the costliest drafting phase here, 0.49 ms** (15.2 GFLOP and 1.36 GB per
  chip, against EAGLE-3's 0.19 ms): it runs every committed pair through both layers with K = 4
  query slots each, in the smallest bucket of its row switch (2, 4 or 9 pairs for the shipped
  tree: `drafters/common.py` `switch_on_rows`) that holds the pairs a step committed. XLA's cost
  analysis prices a conditional at its costliest branch (checked: a 3-branch `lax.switch` of 1, 2
  and 3 matmuls reports the FLOPs and bytes of the 3-matmul branch). A one-off script (at
  `168506e`, `benchmarks/tpu_aot/update_branches.py`) priced the update with the switch forced to
  each bucket (`update_branches.json`; v5p, batch 1, 2k):
  **0.377 ms at 2 pairs, 0.389 at 4, 0.434 at 9**, against 0.491 ms for the switch as compiled,
  whose FLOPs are the 9-pair branch's and whose bytes are 158 MB above them (operand traffic the
  conditional adds in the cost model; whether a TPU pays it was not measured). At the taus
  measured (2-4 pairs a step) the update is ~0.39 ms and SpecBlock's step ~2.82 ms, not 2.92 ms:
  with the data-matched drafters' held-out taus that prices SpecBlock at ~1.67x against
  EAGLE-3's 1.79x (0.93), where the switch's price gave 1.62x (0.91). Its propose (0.36 ms) is
  below EAGLE-3's (0.43 ms). Besides, SpecBlock's `fuse` and `shift` weights (170 MB) match no
  rule of `parallel/mesh.py` and are replicated on every chip.
- **Width is cheap, depth is not**: EAGLE-3's 6-node chain of 5 prices as its 16-node tree at batch
  1 (2.48 ms; the drafter's weights are read once per sequential forward). At batch 32 the nodes
  cost: EAGLE-3's tree 13.1 ms against its chain's 8.9 ms and target-only's 3.1 ms.
- **DFlash's head is now vocab-split** over "model" (`head`, the target's LM head its params
  carry): 6.0 GB per chip against 6.9 GB in the earlier run, and its block-8 step 2.81 ms against
  3.49 ms. Block size barely moves the priced step at batch 1 (2.78 ms at 4, 2.81 at 5-8, 2.96 at
  16): BlockPilot's priced labels (the retired blockpilot_priced, docs/findings.md) used these rows.
- **Priced speedups use the miniature's tau**, whose drafters are small and weakly trained
  (SpecBlock 1.67, DFlash block 8 2.04): at these taus SpecBlock and DFlash price near or below
  1x. The priced step costs are the part this table adds. With the data-matched drafters of issue
  40 (`benchmarks/seed_claims/`, held-out, T = 0, batch 1: EAGLE-3 tau 3.12, SpecBlock trained
  with `prefix_norm=all` 3.33), the same step costs price EAGLE-3 at 1.79x and SpecBlock at 1.62x.
- **The 90-node SpecBlock tree** aborts libtpu 0.0.42.1 at v5p, batch 1, 2k (a failed check in its
  memory-space assignment) and compiles at 8k and batch 32, and on v6e.
- **Training memory** (recomputed this session under the current code, `accounting="memory"`:
  the rolled executable's memory analysis; SpecBlock with the public recipe's 3 blocks):
  - EAGLE-3 (7-step training-time test, 32k draft vocabulary) at 8 x 2,048 fits a v6e-8 (33.5 GB
    per chip of 34.4); at 32 x 4,096 it runs out of memory on v5e-8 (214 GB asked) and v5p-8.
  - DFlash fits everywhere it ran: 6.3 GB per v6e chip at 8 x 2,048, 14.9 GB per v5e chip at
    32 x 4,096.
  - SpecBlock's unroll does not fit at 8 x 2,048: 62.1 GB per v5e chip, 108.9 GB per v5p chip.
    Most of it is the unroll's attention scores kept for the backward pass: with
    `remat_attention` (recomputed per query chunk, the same gradients) the v5e figure drops to
    36.1 GB, still above 16 GiB. The v5p row with remat did not finish compiling (over 20 minutes
    and 11.8 GB of host memory: the 64 recomputed chunks x 3 blocks x 2 layers make a large
    program).
- **Llama-3.1-70B drafter training on v5p:2x2x2 (8 chips, FSDP), 8 x 2,048:** EAGLE-3 fits
  (66.9 GB per chip of 102 GB), DFlash fits (33.3 GB), SpecBlock's unroll does not (152.5 GB asked:
  142 GB of temporaries).
- **Not run** (41 of 130 rows; "not run" cells, and rows absent from the training table): v6e at
  8k, every method; v6e at batch 32, 2k, DFlash 4 and 16; the training rows for v5e-8 and v5p-8
  EAGLE-3 and DFlash at 8 x 2,048 (the earlier rows predated the `head` rule and were dropped),
  v6e-8 SpecBlock at 8 x 2,048, every `+remat` row but v5e's at 8 x 2,048, and every 32 x 4,096 row but three.
  `python benchmarks/tpu_aot/run.py --only phases` / `--only train` resume them (2-5 min each,
  the machine alone).
"""
DECODE = ("prefill", "target_step", "propose", "tree_forward", "verify_commit", "update", "spec_step")
GB = 1e9


def _ms(rec, chip):
    if not rec or not rec.get("compiled"):
        return None
    s = roofline_seconds(rec, chip) if rec.get("flops") is not None else None
    return None if s is None else 1000 * s


def _f(x, fmt="{:.2f}"):
    return "-" if x is None else fmt.format(x)


def _fits(rec):
    if not rec:
        return "-"
    if not rec.get("compiled"):
        gb = rec.get("device_bytes")
        return "no (OOM" + (f", {gb / GB:.1f} GB" if gb else "") + ")"
    return ("yes" if rec["fits"] else "NO") + f" ({rec['device_bytes'] / GB:.1f} GB)"


def phase_rows(rows: dict):
    out = {}
    for key, r in rows.items():
        if key.startswith("phases|"):
            _, topo, b, ctx, label = key.split("|")
            out[(topo, int(b), int(ctx), label)] = r
    return out


def ar_step_ms(rows, topo, b, ctx):
    ar = rows.get((topo, b, ctx, "target-only"))
    return None if ar is None or "phases" not in ar else _ms(ar["phases"].get("target_step"), ar["chip"])


def speedup(rows, key, r):
    topo, b, ctx, _ = key
    step = "target_step" if r["nodes"] == 0 else "spec_step"
    ar, ms = ar_step_ms(rows, topo, b, ctx), _ms(r["phases"].get(step), r["chip"])
    return None if r.get("tau") is None or not ar or not ms else r["tau"] * ar / ms


def phases_table(rows, topo, b, ctx) -> str:
    lines = [f"**{topo}, batch {b}, context {ctx}** (ms per call, per device)", "",
             "| method | N | " + " | ".join(DECODE) + " | spec_step compiler ms | fits (GB/device) | tau | priced speedup | slowest compile s |",
             "|" + "---|" * (len(DECODE) + 7)]
    for (t, bb, cc, label), r in rows.items():
        if (t, bb, cc) != (topo, b, ctx):
            continue
        if "phases" not in r:
            lines.append(f"| {label} | - | " + " | ".join("-" for _ in DECODE) +
                         f" | - | not compiled: {r['error'][:160]} | {_f(r.get('tau'))} | - | - |")
            continue
        ph = r["phases"]
        step = ph.get("spec_step") or ph.get("target_step")
        cells = [_f(_ms(ph.get(p), r["chip"]), "{:.3f}") for p in DECODE]
        comp = step.get("optimal_seconds") if step else None
        slowest = max((p.get("compile_s") or 0) for p in ph.values())
        lines.append(f"| {label} | {r['nodes']} | " + " | ".join(cells) +
                     f" | {_f(comp and 1000 * comp, '{:.3f}')} | {_fits(step)} | {_f(r.get('tau'))} | "
                     f"{_f(speedup(rows, (t, bb, cc, label), r))} | {slowest:.0f} |")
    return "\n".join(lines)


def grid_table(rows) -> str:
    keys = sorted({k[:3] for k in rows})
    labels = list(dict.fromkeys(k[3] for k in rows))
    head = " | ".join(f"{t} B={b} {c // 1024}k" for t, b, c in keys)
    lines = ["Step ms (target_step for target-only, spec_step otherwise) / fits / priced speedup", "",
             f"| method | {head} |", "|" + "---|" * (len(keys) + 1)]
    for label in labels:
        cells = []
        for t, b, c in keys:
            r = rows.get((t, b, c, label))
            if r is None or "phases" not in r:
                cells.append("not run" if r is None else "compiler crashed")
                continue
            step = r["phases"].get("spec_step") or r["phases"].get("target_step")
            sp = speedup(rows, (t, b, c, label), r)
            cells.append(f"{_f(_ms(step, r['chip']), '{:.2f}')} / {'yes' if step and step.get('fits') else 'no'}"
                         f" / {_f(sp)}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def breakdown_table(all_rows: dict, phase_rows_: dict) -> str:
    """Each phase of one step apart (`run.py --only breakdown`) beside the whole step's price."""
    parts = ("propose", "tree_forward", "verify_commit", "update")
    lines = ["| method | " + " | ".join(f"{p} ms" for p in parts) + " | sum ms | spec_step ms | "
             "slowest phase compile s |", "|" + "---|" * (len(parts) + 4)]
    for key, r in all_rows.items():
        if not key.startswith("breakdown|"):
            continue
        _, topo, b, ctx, label = key.split("|")
        if "phases" not in r:
            lines.append(f"| {label} | not compiled: {r.get('error', '')[:120]} |" + " |" * (len(parts) + 3))
            continue
        ms = [_ms(r["phases"].get(p), r["chip"]) for p in parts]
        whole = phase_rows_.get((topo, int(b), int(ctx), label))
        step = _ms(whole["phases"].get("spec_step"), whole["chip"]) if whole and "phases" in whole else None
        total = sum(ms) if all(m is not None for m in ms) else None
        slowest = max((p.get("compile_s") or 0) for p in r["phases"].values())
        lines.append(f"| {label} | " + " | ".join(_f(m, "{:.3f}") for m in ms) +
                     f" | {_f(total, '{:.3f}')} | {_f(step, '{:.3f}')} | {slowest:.0f} |")
    return "\n".join(lines)


def compile_table(all_rows: dict) -> str:
    """Whether each method's step compiles and fits at context 2k: the compile rows (v5e; rolled
    layers, memory only) and the phase rows (v5p, v6e; layers unrolled)."""
    lines = ["| topology | batch | method | compiled | fits (GB/device) | compile s | layers |",
             "|---|---|---|---|---|---|---|"]
    for key, r in sorted(all_rows.items(), key=lambda kv: kv[0].split("|")[1:3]):
        kind, topo, b = key.split("|")[:3]
        if kind == "compile":
            method, layers = key.split("|")[3], "rolled"
        elif kind == "phases" and key.split("|")[3] == "2048":
            method, layers = key.split("|")[4], "unrolled"
        else:
            continue
        if "phases" not in r:
            lines.append(f"| {topo} | {b} | {method} | no: {r.get('error', '')[:120]} | - | - | {layers} |")
            continue
        rec = r["phases"].get("spec_step") or r["phases"].get("target_step")
        lines.append(f"| {topo} | {b} | {method} | {'yes' if rec.get('compiled') else 'no'} | {_fits(rec)} | "
                     f"{rec.get('compile_s', '-')} | {layers} |")
    return "\n".join(lines)


def compile_time_summary(all_rows: dict) -> str:
    """Compile seconds per phase kind over every row: count, median, max, share within 60 s."""
    import statistics
    per: dict[str, list[float]] = {}
    for key, r in all_rows.items():
        kind = key.split("|")[0]
        if "source" in r:  # carried over from an earlier, loaded run: its times do not count
            continue
        for name, rec in r.get("phases", {}).items():
            if rec.get("compile_s") is not None:
                per.setdefault(f"{name} ({'rolled' if kind in ('compile', 'train') else 'unrolled'})",
                               []).append(rec["compile_s"])
    lines = ["| phase (layers) | compiles | median s | max s | within 60 s |", "|---|---|---|---|---|"]
    for name, xs in sorted(per.items()):
        lines.append(f"| {name} | {len(xs)} | {statistics.median(xs):.0f} | {max(xs):.0f} | "
                     f"{sum(x <= 60 for x in xs)} / {len(xs)} |")
    return "\n".join(lines)


def train_table(all_rows: dict) -> str:
    lines = ["| target | slice | mesh | batch x seq | drafter | fits (GB/device) | compile s |",
             "|---|---|---|---|---|---|---|"]
    for key, r in all_rows.items():
        if not key.startswith("train|") or "phases" not in r:
            continue
        _, target, topo, size, method = key.split("|")
        rec = r["phases"].get("train_step", {})
        note = " (earlier, loaded run)" if "source" in r else ""
        lines.append(f"| {target} | {topo} | {rec.get('train_mesh', '-')} | {size} | {method} | {_fits(rec)} | "
                     f"{rec.get('compile_s', '-')}{note} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    path = Path((argv or sys.argv[1:] or [HERE / "results.json"])[0])
    data = json.loads(path.read_text())
    rows = phase_rows(data["rows"])
    print(HEADER)
    for topo, b, ctx in sorted({k[:3] for k in rows if k[1] == 1 and k[2] == 2048}):
        print(phases_table(rows, topo, b, ctx), "\n")
    print(grid_table(rows), "\n")
    print("## Each phase apart (v5p:2x2x1, batch 1, context 2k)\n")
    print(breakdown_table(data["rows"], rows), "\n")
    print("## Every shipped method compiles\n")
    print(compile_table(data["rows"]), "\n")
    print("## Compile time on this CPU\n")
    print(compile_time_summary(data["rows"]), "\n")
    print("## Drafter training memory\n")
    print(train_table(data["rows"]))
    print(FOOTER)


if __name__ == "__main__":
    main()
