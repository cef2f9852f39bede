"""DFlash propose at Qwen3-8B on v5p:2x2x1 (memory accounting): argument bytes per device with
the "head" sharding rule and without it (the rule removed, as before the fix). libtpu's compiler on
this CPU: estimates, no TPU ran.

    .venv/bin/python benchmarks/tpu_aot/dflash_head_memory.py
"""
import json, sys
from specblock_jax import aot
from specblock_jax.parallel import mesh

def run():
    out = aot.price_method("qwen3-8b", "dflash", "v5p:2x2x1", batch=1, context=2048,
                           accounting="memory", phases_wanted=("propose",))
    rec = out["phases"]["propose"]
    return {k: rec.get(k) for k in ("compiled", "device_bytes", "compile_s")} | {"memory": rec.get("memory"), "error": rec.get("error", "")[:300]}

with_rule = run()
mesh.PARAM_RULES = tuple((p, a) for p, a in mesh.PARAM_RULES if "head)" not in p) + ((r"(^|/)lm_head$", ("embed", "vocab")),)
without = run()
print(json.dumps({"with_rule": with_rule, "without_rule": without}, indent=1))
