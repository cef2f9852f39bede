"""Issue 66: the target's attention before (dense over the whole cache, `attention="full"`) and
after (cascade attention and the TPU kernels, `attention="cascade"`), priced for v5p:2x2x1 (and
v5e:2x2 for fit) at Qwen3-8B shapes by the TPU compiler from this CPU. Estimates, not
measurements: the roofline of the compiler's per-device counts, each Pallas kernel's own cost
added where the compiler cannot see it (the record's `kernels` say which: aot/cost.py). Step
costs are the layers-unrolled programs' (`accounting="unrolled"`, as results.md); prefill costs are
`accounting="multiplied"` (2- and 3-layer cuts extrapolated to 36 layers: exact FLOPs, rough bytes,
aot/price.py; a prefill is FLOP-bound, and its unrolled 36-layer programs take too long to compile
on this shared 2-core machine); memory from the rolled 36-layer program.

    python benchmarks/tpu_aot/attention.py [--only prefill,b1,b32,memory]   # -> attention.json, attention.md

Rows are resumable (a rerun skips rows already in attention.json); one process per row; loops
over disjoint groups (--only) may run side by side.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specblock_jax import aot

HERE = Path(__file__).resolve().parent
OUT = HERE / "attention.json"
TARGET = "qwen3-8b"
V5P = "v5p:2x2x1"
# issue 57's methods (max_new 128, as benchmarks/specblock_cost priced them) and the issue's small trees
B1 = [("target-only", "ar"), ("prompt lookup", "prompt_lookup"), ("EAGLE-3 tree 16", "eagle3"),
      ("EAGLE-3 paper tree 61", "eagle3:depth=8:top_k=10:num_nodes=61"), ("SpecBlock shipped tree 16", "specblock")]
B32 = [("target-only", "ar", None), ("prompt lookup", "prompt_lookup", None), ("EAGLE-3 tree 16", "eagle3", None),
       ("SpecBlock shipped tree 16", "specblock", None), ("DFlash block 8", "dflash", 8)]


def rows() -> dict[str, dict]:
    """key -> price_method keywords, in the order they are priced (most wanted first)."""
    out = {}

    def prefill(attn):
        for ctx in (2048, 8192, 32768):
            out[f"prefill|{ctx}|{attn}"] = dict(method="ar", topology=V5P, batch=1, context=ctx,
                                                phases_wanted=("prefill",), attention=attn)

    def batch1(attn):
        for label, method in B1:
            wanted = ("target_step",) if method == "ar" else ("tree_forward", "spec_step")
            out[f"b1|2048|{label}|{attn}"] = dict(method=method, topology=V5P, batch=1, context=2048, max_new=128,
                                                  phases_wanted=wanted, attention=attn)

    def batch32(ctx, attn):
        for label, method, block in B32:
            wanted = ("target_step",) if method == "ar" else ("spec_step",)
            out[f"b32|{ctx}|{label}|{attn}"] = dict(method=method, topology=V5P, batch=32, context=ctx, block=block,
                                                    phases_wanted=wanted, attention=attn)

    def memory(attn):
        for topo, b in ((V5P, 1), (V5P, 8), ("v5e:2x2", 1)):
            out[f"memory|{topo}|{b}|32768|{attn}"] = dict(method="ar", topology=topo, batch=b, context=32768,
                                                          phases_wanted=("prefill",), attention=attn,
                                                          accounting="memory")

    prefill("cascade")
    batch1("cascade")
    batch32(8192, "cascade")
    batch1("full")
    memory("cascade")
    memory("full")
    prefill("full")
    batch32(8192, "full")
    batch32(2048, "cascade")
    batch32(2048, "full")
    return {k: {"accounting": "multiplied" if k.startswith("prefill") else "unrolled", **kw} for k, kw in out.items()}


def _load() -> dict:
    return json.loads(OUT.read_text()) if OUT.exists() else {"rows": {}}


def run_row(key: str) -> None:
    t0 = time.perf_counter()
    try:
        result = aot.price_method(TARGET, **rows()[key])
    except Exception as e:  # noqa: BLE001 - a row's failure is a row
        result = {"error": f"{type(e).__name__}: {e}"[:2000]}
    result.update(wall_s=round(time.perf_counter() - t0, 1),
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    _put(key, result)


def _put(key: str, result: dict) -> None:
    """Adds one row to attention.json under a lock (two loops may price disjoint groups)."""
    with open(Path(tempfile.gettempdir()) / "sbj_attention_rows.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = _load()
        data["rows"][key] = result
        tmp = OUT.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(OUT)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=None, help="comma-separated key prefixes: a group (prefill, b1, b32, "
                                                 "memory) or more, e.g. 'b32|8192|EAGLE-3 tree 16'")
    ap.add_argument("--row", default=None, help="price this one row in this process (used by the loop)")
    args = ap.parse_args(argv)
    if args.row:
        run_row(args.row)
        return
    prefixes = None if args.only is None else tuple(args.only.split(","))
    for key in rows():
        if key in _load()["rows"] or (prefixes and not key.startswith(prefixes)):
            continue
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--row", key], capture_output=True, text=True)
        if key not in _load()["rows"]:
            tail = [ln for ln in proc.stderr.splitlines() if ln.strip() and "WARNING" not in ln][-2:]
            _put(key, {"error": f"the compile process died (exit {proc.returncode}): " + " | ".join(tail)})
        print(key, round(time.perf_counter() - t0, 1), "s", flush=True)
    with open(HERE / "attention.md", "w") as md:
        subprocess.run([sys.executable, str(HERE / "attention_tables.py")], stdout=md, check=True)


if __name__ == "__main__":
    main()
