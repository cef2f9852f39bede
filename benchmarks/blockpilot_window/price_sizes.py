"""Issue 58 item 3: each DFlash block size's decoding step priced for v5p:2x2x1 at Qwen3-8B shapes
(context 2048 + 128 new tokens), batch 1 and 8, beside target-only's one-token step: the roofline of
the TPU compiler's per-device FLOP and byte counts (`aot.report.roofline_seconds`). Estimates, not
measurements. Writes costs_v5p.json {"step_ms": {size: ms} (batch 1), "step_ms_batch8": {...},
"target_ms": {"1": ms, "8": ms}, ...}, the costs file the speed labels divide tau by.

    python benchmarks/blockpilot_window/price_sizes.py [--sizes 6,7,8,9,10,11,12]
"""
import argparse
import json
import time
from pathlib import Path

from specblock_jax import aot
from specblock_jax.aot import roofline_seconds

HERE = Path(__file__).resolve().parent


def ms(rec, phase):
    p = rec["phases"][phase]
    if not p.get("compiled"):
        raise SystemExit(f"{rec['method']} block {rec.get('block')}: {phase} failed: {p.get('error')}")
    return 1e3 * roofline_seconds(p, rec["chip"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="6,7,8,9,10,11,12")
    ap.add_argument("--out", type=Path, default=HERE / "costs_v5p.json")
    args = ap.parse_args()
    out = json.loads(args.out.read_text()) if args.out.exists() else {}
    common = dict(topology="v5p:2x2x1", context=2048, max_new=128)
    out.update(target="qwen3-8b", **common, method="dflash (released shape, aot.released_drafter)",
               estimate="roofline of the TPU compiler's counts (libtpu), not a measurement")
    for batch in (1, 8):
        key = "step_ms" if batch == 1 else f"step_ms_batch{batch}"
        tgt = out.setdefault("target_ms", {})
        if str(batch) not in tgt:
            tgt[str(batch)] = ms(aot.price_method("qwen3-8b", "ar", batch=batch, phases_wanted=("target_step",),
                                                  **common), "target_step")
        for size in map(int, args.sizes.split(",")):
            if str(size) in out.get(key, {}):
                continue
            t0 = time.perf_counter()
            rec = aot.price_method("qwen3-8b", "dflash", batch=batch, block=size, phases_wanted=("spec_step",), **common)
            out.setdefault(key, {})[str(size)] = ms(rec, "spec_step")
            print(f"batch {batch} block {size}: {out[key][str(size)]:.4f} ms ({time.perf_counter() - t0:.0f} s)", flush=True)
            args.out.write_text(json.dumps(out, indent=1) + "\n")
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
