"""SpecBlock's update priced at each bucket of its row switch (v5p:2x2x1, Qwen3-8B shapes, batch 1,
context 2k): XLA's cost analysis prices a `lax.switch` at its costliest branch, so the table's
update is an upper bound; this prices the update with the switch forced to each bucket
(`aot.price_method(row_bucket=...)`).

    python benchmarks/tpu_aot/update_branches.py > benchmarks/tpu_aot/update_branches.json

Estimates from the TPU compiler (libtpu), not measurements.
"""
import json
import sys

from specblock_jax.aot import price_method
from specblock_jax.aot.report import roofline_seconds
from specblock_jax.drafters.common import row_buckets

rows = []
for forced in (None, *row_buckets(9)):  # the shipped tree: 2 blocks x K=4 + 1 = 9 path rows
    rec = price_method("qwen3-8b", "specblock", "v5p:2x2x1", batch=1, context=2048, phases_wanted=("update",),
                       row_bucket=forced)
    up = rec["phases"]["update"]
    rows.append({"bucket": forced or "switch (all buckets)", "ms": 1e3 * roofline_seconds(up, "v5p") if up.get("compiled") else None,
                 "flops": up.get("flops"), "bytes_accessed": up.get("bytes_accessed"), "compiled": up.get("compiled"),
                 "error": up.get("error")})
    print(rows[-1], file=sys.stderr, flush=True)
json.dump({"target": "qwen3-8b", "topology": "v5p:2x2x1", "batch": 1, "context": 2048, "method": "specblock",
           "rows": rows}, sys.stdout, indent=1)
