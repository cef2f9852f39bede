"""attention.md from attention.json (attention.py's rows): issue 66's before / after tables. Every
ms is the roofline of the TPU compiler's per-device counts (plus each Pallas kernel's analytic
cost where the compiler cannot see into it): estimates, not measurements.

    python benchmarks/tpu_aot/attention_tables.py > benchmarks/tpu_aot/attention.md
"""

from __future__ import annotations

import json
from pathlib import Path

from attention import rows as wanted_rows  # the row list of the entry script beside this one
from specblock_jax import aot

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GB = 1e9


def _rec(rows, key, phase):
    return rows.get(key, {}).get("phases", {}).get(phase, {})


def _ms(rec, chip="v5p"):
    s = aot.roofline_seconds(rec, chip) if rec.get("compiled") else None
    return None if s is None else 1000 * s


def _f(x, fmt=".3f"):
    return "-" if x is None else format(x, fmt)


def _kernels(rec):
    """e.g. "splash_causal x1 analytic": calls in the compiled program (the rolled layer loop's
    body once; a step's switch over tree sizes has one set per branch)."""
    return aot.kernel_label(rec.get("kernels", []))


def _matmul_flops(cfg, tokens: int, logits: int) -> float:
    """2 x the target's layer weights x tokens + 2 x H x V per logit row."""
    h, n, k, d, i = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    per_layer = h * (n + 2 * k) * d + n * d * h + 3 * h * i
    return 2 * cfg.num_layers * per_layer * tokens + 2 * h * cfg.vocab_size * logits


def prefill(rows, cfg, chip) -> list[str]:
    out = ["**Prefill, v5p:2x2x1, batch 1** (ms per call per chip; FLOP roofline = (2 x layer weights x T + "
           "causal attention 2 x 2 x N x D x T(T+1)/2 x L + one logit row) / 4 chips / peak bf16)", "",
           "| context | before ms | after ms | FLOP roofline ms | after / roofline | before temp GB | after temp GB | "
           "after kernels |", "|---|---|---|---|---|---|---|---|"]
    for ctx in (2048, 8192, 32768):
        b, a = _rec(rows, f"prefill|{ctx}|full", "prefill"), _rec(rows, f"prefill|{ctx}|cascade", "prefill")
        mark = ""
        if not b and ctx == 2048:  # results.md's prefill row (attention "full", unrolled, 2026-12-04)
            res = json.loads((HERE / "results.json").read_text())["rows"]
            b, mark = _rec(res, "phases|v5p:2x2x1|1|2048|target-only", "prefill"), " (c)"
        attn = 2 * 2 * cfg.num_heads * cfg.head_dim * ctx * (ctx + 1) / 2 * cfg.num_layers
        floor = 1000 * (_matmul_flops(cfg, ctx, 1) + attn) / 4 / (chip.bf16_tflops * 1e12)
        after = _ms(a)
        temp = [r.get("memory", {}).get("temp") for r in (b, a)]
        out.append(f"| {ctx} | {_f(_ms(b))}{mark if b else ''} | {_f(after)} | {floor:.3f} | {_f(after and after / floor, '.2f')} | "
                   f"{_f(temp[0] and temp[0] / GB, '.2f')} | {_f(temp[1] and temp[1] / GB, '.2f')} | {_kernels(a)} |")
    return out + ["", "(c) results.md's prefill row (attention \"full\", layers unrolled, max_new 256, "
                      "2026-12-04), where attention.py's own \"full\" row is not priced.", ""]


def memory(rows) -> list[str]:
    out = ["**32k prefill memory** (rolled layer loop, `accounting=\"memory\"`; GB per chip)", "",
           "| topology | batch | before temp | before total (fits) | after temp | after total (fits) |",
           "|---|---|---|---|---|---|"]
    for topo, b in (("v5p:2x2x1", 1), ("v5p:2x2x1", 8), ("v5e:2x2", 1)):
        cells = []
        for attn in ("full", "cascade"):
            r = _rec(rows, f"memory|{topo}|{b}|32768|{attn}", "prefill")
            if not r:
                cells += ["-", "-"]
            elif not r.get("compiled"):
                total = r.get("device_bytes")
                cells += ["-", f"{_f(total and total / GB, '.2f')} (no: {(r.get('error') or '')[:60]})"]
            else:
                cells += [f"{r['memory']['temp'] / GB:.2f}",
                          f"{r['device_bytes'] / GB:.2f} ({'yes' if r['fits'] else 'NO'})"]
        out.append(f"| {topo} | {b} | " + " | ".join(cells) + " |")
    return out + [""]


def batch1(rows) -> tuple[list[str], dict]:
    out = ["**Batch 1, context 2048, v5p:2x2x1** (ms per call per chip; 128 new tokens of room; verify = "
           "tree_forward, the target's forward over the tree)", "",
           "| method | verify before | verify after | step before | step after | after kernels |",
           "|---|---|---|---|---|---|"]
    tail = ["", "Before cells marked (a) are benchmarks/specblock_cost/after.json / priced.json (2026-12-07, "
                "attention \"full\", max_new 128, an earlier code state), (b) results.json's breakdown row "
                "(2026-12-04, max_new 256): where attention.py's own \"full\" row is not priced yet."]
    committed = _committed_b1()
    got = {}
    for label, method in (("target-only", "ar"), ("prompt lookup", "prompt_lookup"), ("EAGLE-3 tree 16", "eagle3"),
                          ("EAGLE-3 paper tree 61", "eagle3:depth=8:top_k=10:num_nodes=61"),
                          ("SpecBlock shipped tree 16", "specblock")):
        cells = []
        for phase in (("target_step", "target_step") if method == "ar" else ("tree_forward", "spec_step")):
            for attn in ("full", "cascade"):
                got[(label, phase, attn)] = _ms(_rec(rows, f"b1|2048|{label}|{attn}", phase))
                cells.append(_f(got[(label, phase, attn)]))
                if attn == "full" and got[(label, phase, attn)] is None and (label, phase) in committed:
                    got[(label, phase, attn)] = committed[(label, phase)][0]
                    cells[-1] = f"{committed[(label, phase)][0]:.3f} {committed[(label, phase)][1]}"
        step = "target_step" if method == "ar" else "spec_step"
        out.append(f"| {label} | " + " | ".join(cells) + f" | {_kernels(_rec(rows, f'b1|2048|{label}|cascade', step))} |")
    out.append("")
    for attn in ("full", "cascade"):
        v61, v16 = got[("EAGLE-3 paper tree 61", "tree_forward", attn)], got[("EAGLE-3 tree 16", "tree_forward", attn)]
        v8, one = got[("prompt lookup", "tree_forward", attn)], got[("target-only", "target_step", attn)]
        out.append(f"- {'before' if attn == 'full' else 'after'}: 61-node verify / 16-node verify = "
                   f"{_f(v61 and v16 and v61 / v16, '.2f')} (must show <= 1.1); 8-node verify / one-token step = "
                   f"{_f(v8 and one and v8 / one, '.2f')} (<= 1.1)")
    return out + tail + [""], got


def _committed_b1() -> dict:
    """Before-figures committed earlier with attention "full" (layers unrolled, v5p, batch 1,
    context 2048), for rows attention.py has not priced: (label, phase) -> (ms, mark)."""
    out = {}
    after = json.loads((ROOT / "benchmarks/specblock_cost/after.json").read_text())["methods"]
    names = {"specblock": "SpecBlock shipped tree 16", "eagle3": "EAGLE-3 tree 16",
             "eagle3:depth=8:top_k=10:num_nodes=61": "EAGLE-3 paper tree 61"}
    for m, label in names.items():
        for phase in ("tree_forward", "spec_step"):
            out[(label, phase)] = (after[m]["phases"][phase]["ms"], "(a)")
    priced = json.loads((ROOT / "benchmarks/specblock_cost/priced.json").read_text())
    out[("target-only", "target_step")] = (priced["target_step_ms"], "(a)")
    res = json.loads((HERE / "results.json").read_text())["rows"]
    pl = res.get("breakdown|v5p:2x2x1|1|2048|prompt lookup", {}).get("phases", {}).get("tree_forward", {})
    if pl.get("compiled"):
        out[("prompt lookup", "tree_forward")] = (_ms(pl), "(b)")
    return out


def _committed_b32(ctx: int, label: str) -> float | None:
    """The step results.md priced with attention "full" (2026-12-04/05, max_new 256, unrolled)."""
    row = json.loads((HERE / "results.json").read_text())["rows"].get(f"phases|v5p:2x2x1|32|{ctx}|{label}", {})
    return _ms(row.get("phases", {}).get("target_step" if label == "target-only" else "spec_step", {}))


def batch32(rows, cfg, chip) -> list[str]:
    taus = {r.get("label"): r.get("tau") for r in json.loads((HERE / "results.json").read_text())["rows"].values()}
    out = ["**Batch 32, v5p:2x2x1** (step ms per chip; priced speedup = tau x target-only step / step, tau of "
           "the miniature at batch 1 as in results.md; max_new 256; where attention.py's \"full\" row is not "
           "priced, before = results.md's row, attention \"full\", 2026-12-04/05, an earlier code state)", "",
           "| context | method | tau | step before | step after | speedup before | speedup after |",
           "|---|---|---|---|---|---|---|"]
    for ctx in (2048, 8192):
        ar = {a: _ms(_rec(rows, f"b32|{ctx}|target-only|{a}", "target_step")) for a in ("full", "cascade")}
        ar["full"] = ar["full"] if ar["full"] is not None else _committed_b32(ctx, "target-only")
        for label in ("target-only", "prompt lookup", "EAGLE-3 tree 16", "SpecBlock shipped tree 16", "DFlash block 8"):
            phase = "target_step" if label == "target-only" else "spec_step"
            step = {a: _ms(_rec(rows, f"b32|{ctx}|{label}|{a}", phase)) for a in ("full", "cascade")}
            step["full"] = step["full"] if step["full"] is not None else _committed_b32(ctx, label)
            tau = taus.get(label)
            sp = {a: tau * ar[a] / step[a] if tau and ar[a] and step[a] else None for a in step}
            out.append(f"| {ctx} | {label} | {_f(tau, '.2f')} | {_f(step['full'])} | {_f(step['cascade'])} | "
                       f"{_f(sp['full'], '.2f')} | {_f(sp['cascade'], '.2f')} |")
    # EAGLE-3's 16-node step at 8k against its floor: 512 verified tokens' matrix work, or the
    # target's weights and the 8k cache read once (the drafter's own work left out of the floor)
    cache_len = 8192 + 256 + 16
    weights = 2 * _matmul_flops(cfg, 1, 1) / 2  # bf16 bytes of the layers and the LM head
    cache = 2 * 2 * cfg.num_layers * 32 * cfg.num_kv_heads * cache_len * cfg.head_dim
    flops_ms = 1000 * _matmul_flops(cfg, 32 * 16, 32 * 16) / 4 / (chip.bf16_tflops * 1e12)
    bytes_ms = 1000 * (weights + cache) / 4 / (chip.hbm_gbps * 1e9)
    e = {a: _ms(_rec(rows, f"b32|8192|EAGLE-3 tree 16|{a}", "spec_step")) for a in ("full", "cascade")}
    e["full"] = e["full"] if e["full"] is not None else _committed_b32(8192, "EAGLE-3 tree 16")
    floor = max(flops_ms, bytes_ms)
    out += ["", f"EAGLE-3's 16-node step at batch 32, 8k: floor = max({flops_ms:.2f} ms of matrix FLOPs, "
                f"{bytes_ms:.2f} ms reading weights and cache once) = {floor:.2f} ms; priced step before "
                f"{_f(e['full'])} ms ({_f(e['full'] and e['full'] / floor, '.2f')}x the floor), after "
                f"{_f(e['cascade'])} ms ({_f(e['cascade'] and e['cascade'] / floor, '.2f')}x; must show <= 1.5x).", ""]
    return out


def issue57(rows) -> list[str]:
    """SpecBlock against EAGLE-3 (shipped and paper tree), re-priced with each attention: tau and
    SpecBlock's update mix from benchmarks/specblock_cost/priced.json, steps from these rows."""
    priced = json.loads((ROOT / "benchmarks/specblock_cost/priced.json").read_text())
    names = {"specblock": "SpecBlock shipped tree 16", "eagle3": "EAGLE-3 tree 16",
             "eagle3:depth=8:top_k=10:num_nodes=61": "EAGLE-3 paper tree 61"}
    out = ["**Issue 57 re-priced** (v5p:2x2x1, batch 1, context 2048 + 128; tau and SpecBlock's update "
           "row-bucket mix measured in benchmarks/specblock_cost/priced.json; SpecBlock's step = spec_step - "
           "the update switch's price + the mix's)", "",
           "| set | attention | SpecBlock / EAGLE-3 paper tree (>= 1.08) | SpecBlock / EAGLE-3 shipped (>= 1.0) |",
           "|---|---|---|---|"]
    for name, set_rows in priced["sets"].items():
        out.append(f"| {name} | committed (priced.json) | {set_rows['targets']['speedup_vs_paper (>= 1.08)']:.3f} | "
                   f"{set_rows['targets']['speedup_vs_shipped_eagle3 (>= 1.0)']:.3f} |")
        for attn in ("full", "cascade"):
            ar = _ms(_rec(rows, f"b1|2048|target-only|{attn}", "target_step"))
            speed = {}
            for m, label in names.items():
                step = _ms(_rec(rows, f"b1|2048|{label}|{attn}", "spec_step"))
                r = set_rows[m]
                if step is None or ar is None:
                    speed[m] = None
                    continue
                step = step - r["update_switch_ms"] + r["update_ms"]
                speed[m] = r["tau"] * ar / step
            s, e, p = (speed[m] for m in names)
            out.append(f"| {name} | {attn} | {_f(s and p and s / p)} | {_f(s and e and s / e)} |")
    return out + [""]


def main() -> None:
    data = json.loads((HERE / "attention.json").read_text())
    rows = data["rows"]
    cfg = aot.load_preset("qwen3-8b")
    chip = aot.CHIPS["v5p"]
    lines = ["# Issue 66: attention before / after, priced (TPU compiler estimates)", "",
             "Before = `attention=\"full\"` (dense softmax over a [B, T, S] mask, the whole cache: every table of "
             "results.md); after = `attention=\"cascade\"` (models/attention.py: splash attention for prompts, the "
             "committed-prefix Pallas kernel plus the [T, T] tree part merged by log-sum-exp for steps). Rows "
             "that attention.py priced (`python benchmarks/tpu_aot/attention.py`) are one code state, compiled by "
             "libtpu from this CPU; cells marked (a), (b), (c) are earlier committed figures, where its own row is "
             "missing (the rows still unpriced are listed at the end); "
             "Qwen3-8B bf16, all 4 chips tensor-parallel; step costs from the layers-unrolled programs, prefill costs "
             "from 2- and 3-layer cuts extrapolated to 36 layers (`accounting=\"multiplied\"`: FLOPs exact, bytes "
             "rough, aot/price.py), memory from the rolled program. Kernel costs: splash's is analytic "
             "(added: the compiler sees no FLOPs in it), the prefix kernel's is its CostEstimate (which the "
             "compiler's counts include). No TPU ran.", ""]
    lines += prefill(rows, cfg, chip) + memory(rows)
    b1, _ = batch1(rows)
    lines += b1 + batch32(rows, cfg, chip) + issue57(rows)
    missing = [k for k in wanted_rows() if k not in rows]
    failed = [f"{k} ({v['error'][:120]})" for k, v in rows.items() if "error" in v]
    lines += [f"Rows not priced yet ({len(missing)}): {', '.join(missing) or 'none'}.", "",
              f"Rows whose compile failed: {'; '.join(failed) or 'none'}."]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
