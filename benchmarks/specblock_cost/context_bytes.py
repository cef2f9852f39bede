"""Issue 57: how much of each drafter's priced update (and propose) grows with the context. The
update (SpecBlock's at one row bucket) and propose priced for v5p:2x2x1 at Qwen3-8B shapes at
prompt buckets 512, 1024 and 2048 (+ 128 new tokens): bytes that do not move with the context are
weights and activations; those that do are the drafter's KV cache and what attention builds over
it (SpecBlock keeps K = 4 entries per committed position in each of its 2 layers, EAGLE-3 one in
its 1). Estimates from the TPU compiler, not measurements.

    python benchmarks/specblock_cost/context_bytes.py      # -> context_bytes.json
"""

from __future__ import annotations

import json
from pathlib import Path

from specblock_jax import aot
from specblock_jax.aot import roofline_seconds

HERE = Path(__file__).resolve().parent
CONTEXTS = (512, 1024, 2048)
RUNS = {"specblock (bucket 9)": ("specblock", 9), "specblock (bucket 2)": ("specblock", 2), "eagle3": ("eagle3", None)}


def main() -> None:
    path = HERE / "context_bytes.json"
    out = json.loads(path.read_text()) if path.exists() else {}
    for label, (method, bucket) in RUNS.items():
        for context in CONTEXTS:
            key = f"{label} @ {context}"
            if key in out:
                continue
            rec = aot.price_method("qwen3-8b", method, "v5p:2x2x1", batch=1, context=context, max_new=128,
                                   phases_wanted=("update",), row_bucket=bucket)
            out[key] = {ph: {"ms": 1e3 * roofline_seconds(rec["phases"][ph], rec["chip"]),
                             "bytes_accessed_mb": rec["phases"][ph]["bytes_accessed"] / 1e6,
                             "device_mb": rec["phases"][ph].get("device_bytes", 0) / 1e6}
                        for ph in ("propose", "update")}
            path.write_text(json.dumps(out, indent=1) + "\n")
            print(key, json.dumps({k: round(v["bytes_accessed_mb"]) for k, v in out[key].items()}), flush=True)


if __name__ == "__main__":
    main()
