"""The issue-39 tables: Qwen3-8B (and Llama-3.1-70B for training) compiled ahead of time for TPU
topologies on this CPU with `specblock_jax.aot`, priced by the TPU compiler's cost analysis.

    python benchmarks/tpu_aot/run.py [--only phases|compile|train] [--out benchmarks/tpu_aot/results.json]

Rows are written to the JSON after each one (a rerun skips rows already there: resumable) and
results.md is rebuilt from it with `--table`. Issue 66's attention before / after (attention.md)
has its own rows: `python benchmarks/tpu_aot/attention.py` (tables by attention_tables.py). Nothing here runs on a TPU: every number is the
compiler's estimate (docs/tpu_aot.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from specblock_jax import aot

HERE = Path(__file__).resolve().parent
TARGET = "qwen3-8b"
# the must-show methods: (label, method, nodes, block)
METHODS = [
    ("target-only", "ar", None, None),
    ("prompt lookup", "prompt_lookup", None, None),
    ("EAGLE-3 tree 16", "eagle3", None, None),
    ("EAGLE-3 chain 5", "eagle3:top_k=1:depth=5", 6, None),
    ("SpecBlock shipped tree 16", "specblock", None, None),
    ("SpecBlock tree 90", "specblock:root_topk=10:beam=10:max_blocks=2", 90, None),
    ("DFlash block 4", "dflash", None, 4),
    ("DFlash block 8", "dflash", None, 8),
    ("DFlash block 16", "dflash", None, 16),
]
# tau measured on the embedded default: methods_v2's results.json (retired study, in git at cbc5fde:
# docs/findings.md), run "heldout" (T=0,
# batch 1, tau_mean = mean tokens committed per target forward, bonus included); the 90-node
# SpecBlock tree from its run "heldout_calibrated". None: no measured tau at that setting.
TAU = {"target-only": 1.0, "prompt lookup": 4.09, "EAGLE-3 tree 16": 3.432, "SpecBlock shipped tree 16": 1.671,
       "SpecBlock tree 90": 1.92, "DFlash block 8": 2.038}
# BlockPilot's candidate window, sizes 4-8: the shipped DFlash drafter's training size (8) and below
# (decoding caps the block at it): priced at v5p:2x2x1, batch 1, context 2k only (issue 40's labels)
WINDOW = [(f"DFlash block {k}", "dflash", None, k) for k in (5, 6, 7)]
PHASE_GRID = [(topo, b, ctx) for topo in ("v5p:2x2x1", "v6e:2x2") for b in (1, 32) for ctx in (2048, 8192)]
COMPILE_TOPOS = ("v5e:2x2", "v5p:2x2x1", "v6e:2x2")
SHIPPED = ("ar", "prompt_lookup", "eagle3", "specblock", "dflash", "blockpilot")
# Llama-3.1-70B on 8 v5p chips: both batch sizes split over the FSDP "data" axis (on 32 chips a
# batch of 8 cannot split over data=32)
TRAIN = [(TARGET, "v5e:2x4"), (TARGET, "v5p:2x2x1"), (TARGET, "v6e:2x4"), ("llama-3.1-70b", "v5p:2x2x2")]
TRAIN_SIZES = [(8, 2048), (32, 4096)]


def _step(method: str) -> tuple[str, ...]:
    return ("target_step",) if method == "ar" else ("spec_step",)


def phase_jobs():
    """The whole step of every method at batch 1, context 2k, on both topologies (the prefill
    of the target-only rows too; BlockPilot's window on v5p), then batch 32 at 2k on both, then 8k."""
    grid = sorted(PHASE_GRID, key=lambda g: (g[1] != 1 or g[2] != 2048, g[2], g[1], g[0]))
    for topo, b, ctx in grid:
        window = WINDOW if (topo, b, ctx) == ("v5p:2x2x1", 1, 2048) else []
        for label, method, nodes, block in METHODS + window:
            yield (f"phases|{topo}|{b}|{ctx}|{label}",
                   dict(target_cfg=TARGET, method=method, topology=topo, batch=b, context=ctx, nodes=nodes,
                        block=block, phases_wanted=_step(method) + (("prefill",) if method == "ar" and
                                                                    (b, ctx) == (1, 2048) else ())), label)


def breakdown_jobs():
    """Every phase of one step (propose, tree_forward, verify_commit, update) of every drafter
    method on v5p at batch 1, context 2k (the 90-node SpecBlock tree aborts libtpu: left out)."""
    for label, method, nodes, block in METHODS:
        if method != "ar" and label != "SpecBlock tree 90":
            yield (f"breakdown|v5p:2x2x1|1|2048|{label}",
                   dict(target_cfg=TARGET, method=method, topology="v5p:2x2x1", batch=1, context=2048,
                        nodes=nodes, block=block,
                        phases_wanted=("propose", "tree_forward", "verify_commit", "update")), label)


def compile_jobs():
    """Every shipped method's step compiled (rolled layers: memory and fits only) on v5e; on v5p
    and v6e the phase grid compiles every method but BlockPilot, whose rows are here."""
    for topo in COMPILE_TOPOS:
        for b in (1, 32):
            for method in SHIPPED if topo.startswith("v5e") else ("blockpilot",):
                wanted = _step(method)
                yield (f"compile|{topo}|{b}|{method}",
                       dict(target_cfg=TARGET, method=method, topology=topo, batch=b, context=2048,
                            phases_wanted=wanted, accounting="memory"), method)


# SpecBlock's unroll as it trains by default, and with its attention recomputed per query chunk in
# the backward pass (`remat_attention`): the same loss and gradients
TRAIN_METHODS = [("eagle3", None), ("specblock", None), ("specblock+remat", {"remat_attention": True}),
                 ("dflash", None)]


def train_jobs():
    for b, seq in TRAIN_SIZES:
        for target, topo in TRAIN:
            for label, settings in TRAIN_METHODS:
                yield (f"train|{target}|{topo}|{b}x{seq}|{label}",
                       dict(target_cfg=target, method=label.split("+")[0], topology=topo, train_batch=b,
                            train_seq=seq, phases_wanted=("train_step",), accounting="memory",
                            train_settings=settings), label)


MACHINE = {"platform": platform.platform(), "cpus": 2, "compiler": "libtpu 0.0.42.1 (jax[tpu]==0.10.2)",
           "note": "rows run one at a time, at normal priority; a drafter training job and helpers' tests ran "
                   "beside them at nice 19 (autogroup off, so they yield the CPU)"}


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"rows": {}}


def jobs(groups) -> dict:
    """The rows of `groups`: batch 1 / context 2k phase rows first, then the breakdown, then the
    rest in group order."""
    table = {"phases": phase_jobs, "breakdown": breakdown_jobs, "compile": compile_jobs, "train": train_jobs}
    rows = [(key, kw, label) for g in groups for key, kw, label in table[g]()]
    first = sorted(rows, key=lambda r: 0 if r[0].startswith("phases|") and r[0].endswith(f"|1|2048|{r[2]}")
                   else 1 if r[0].startswith("breakdown|") else 2)
    return {key: (kw, label) for key, kw, label in first}


def run_row(key: str, kw: dict, label: str, out: Path) -> None:
    """Prices one row and adds it to `out` (re-read first: another run.py may have added rows)."""
    t0 = time.perf_counter()
    try:
        result = aot.price_method(**kw)
    except Exception as e:  # noqa: BLE001 - a row's failure is a row
        result = {"error": f"{type(e).__name__}: {e}"[:2000]}
    _write(out, key, result, label, time.perf_counter() - t0)


def _write(out: Path, key: str, result: dict, label: str, seconds: float) -> None:
    result.update(label=label, tau=TAU.get(label), wall_s=round(seconds, 1),
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    data = _load(out)
    data["rows"][key] = result
    data["machine"] = MACHINE
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=("phases", "breakdown", "compile", "train"), action="append")
    ap.add_argument("--out", type=Path, default=HERE / "results.json")
    ap.add_argument("--row", default=None, help="price this one row in this process (used by the loop)")
    args = ap.parse_args(argv)
    groups = args.only or ("phases", "breakdown", "compile", "train")
    todo = jobs(("phases", "breakdown", "compile", "train") if args.row else groups)
    if args.row:
        run_row(args.row, *todo[args.row], args.out)
        return
    for key, (kw, label) in todo.items():
        if key in _load(args.out)["rows"]:
            continue
        # one process per row: a compiler crash (libtpu aborts on some programs) ends only its row
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--row", key, "--out", str(args.out)],
                              capture_output=True, text=True)
        if key not in _load(args.out)["rows"]:
            lines = proc.stderr.splitlines()
            tail = [ln for ln in lines if "Check failed" in ln][-1:] or [
                ln for ln in lines if ln.strip() and "worker hostname" not in ln and "WARNING" not in ln][-2:]
            _write(args.out, key, {"error": f"the compile process died (exit {proc.returncode}): "
                                            + " | ".join(tail)[:1500]}, label, time.perf_counter() - t0)
        print(key, round(time.perf_counter() - t0, 1), "s", flush=True)
    # the study's one entry: results.md is rendered from the rows by tables.py (a helper, not run alone)
    with open(args.out.with_name("results.md"), "w") as md:
        subprocess.run([sys.executable, str(HERE / "tables.py"), str(args.out)], stdout=md, check=True)


if __name__ == "__main__":
    main()
