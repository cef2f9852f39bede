"""Prices the configurations of published TPU decoding measurements (published.json) with the TPU
compiler (`specblock_jax.aot.price_method`, from this CPU) and compares: ratio = estimate /
published figure.

    .venv/bin/python benchmarks/tpu_validation/validate.py            # every point; resumes
    .venv/bin/python benchmarks/tpu_validation/validate.py --only qwen4b_v5p_ar --fresh

For a per-token latency the estimate is the priced target-only step (`target_step`: one token per
row per step). For a speedup it is tau x priced target_step / priced spec_step, at the acceptance
length the point names (published with it, or taken from elsewhere: published.json says where).
Each estimate is given twice:
  compiler   the compiler's own `optimal_seconds`
  roofline   max(FLOPs / peak bf16 FLOP/s, bytes accessed / HBM bandwidth) of the chip, from the
             compiler's FLOP and byte counts (a check on `optimal_seconds`)
and beside them the floor of reading the target's weights once per step (its parameter bytes that a
step reads / HBM bandwidth; the embedding table is gathered, not read, unless tied to the head).

A point measured with TP=1 on one chip ("chips": 1) is priced with one replica per chip of the
smallest topology of that generation (mesh data=n,model=1, batch n x its batch): each device then
runs exactly the one-chip step (v5p has no one-chip topology). Results go to results.json after
every point (a rerun skips the points already there; --fresh reprices).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent


def method_string(price: dict) -> str:
    """published.json's method -> price_method's: a chain of nodes - 1 drafts is top_k 1."""
    if price.get("chain"):
        return f"{price['method']}:top_k=1:depth={price['nodes'] - 1}"
    return price["method"]


def mesh_and_batch(price: dict, devices: int) -> tuple[str, int]:
    """(mesh, global batch): all chips tensor-parallel at the published batch, or one replica per
    chip (data=devices) for a point measured on one chip."""
    if price["chips"] == devices:
        return f"data=1,model={devices}", price["batch"]
    if price["chips"] == 1:
        return f"data={devices},model=1", price["batch"] * devices
    raise ValueError(f"{price['chips']} chips on a {devices}-chip topology: no mesh for that")


def weight_read_bytes(cfg) -> int:
    """Bytes of target weights one decoding step reads: every parameter but the embedding table
    (gathered row by row), which a tied head reads in full."""
    from specblock_jax.models.target import abstract_target
    from specblock_jax.parallel.mesh import path_str
    import jax

    _, params = abstract_target(cfg)
    total = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        nbytes = leaf.size * leaf.dtype.itemsize
        if "embed_tokens" in path_str(path) and not cfg.tie_word_embeddings:
            continue
        total += nbytes
    return total


def step_ms(rec: dict, chip) -> dict:
    """One phase record -> {compiler, roofline} ms (None where the record has no usable figure)."""
    if not rec.get("compiled"):
        return {"compiler": None, "roofline": None}
    opt = rec["optimal_seconds"]
    roof = max(rec["flops"] / (chip.bf16_tflops * 1e12), rec["bytes_accessed"] / (chip.hbm_gbps * 1e9))
    return {"compiler": 1e3 * opt if opt and opt > 0 else None, "roofline": 1e3 * roof}


def price_point(pt: dict, accounting: str) -> dict:
    from specblock_jax import aot

    p = pt["price"]
    topo = aot.get_topology(p["topology"])
    mesh, batch = mesh_and_batch(p, topo.num_devices)
    cfg = aot.load_preset(p["target"])
    common = dict(mesh=mesh, batch=batch, context=p["context"], max_new=p["max_new"], accounting=accounting)
    t0 = time.perf_counter()
    ar = aot.price_method(cfg, "ar", p["topology"], phases_wanted=("target_step",), **common)
    out = {"mesh": mesh, "global_batch": batch, "cache_len": ar["cache_len"],
           "weight_floor_ms": 1e3 * weight_read_bytes(cfg) / (topo.chip.hbm_gbps * 1e9) / (
               topo.num_devices if p["chips"] == topo.num_devices else 1),
           "phases": {"ar": ar["phases"]}}
    base = step_ms(ar["phases"]["target_step"], topo.chip)
    out["target_step_ms"] = base
    if pt["unit"] == "ms":
        out["estimate"] = base
    else:
        spec = aot.price_method(cfg, method_string(p), p["topology"], nodes=p.get("nodes"),
                                block=p.get("block_size"), phases_wanted=("spec_step",), **common)
        out["phases"]["spec"] = spec["phases"]
        step = step_ms(spec["phases"]["spec_step"], topo.chip)
        out["spec_step_ms"] = step
        out["estimate"] = {k: (pt["tau"] * base[k] / step[k] if base[k] and step[k] else None) for k in base}
    out["ratio"] = {k: (v / pt["value"] if v else None) for k, v in out["estimate"].items()}
    out["price_s"] = round(time.perf_counter() - t0, 1)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma list of point ids (default: all)")
    ap.add_argument("--fresh", action="store_true", help="reprice points already in results.json")
    ap.add_argument("--out", type=Path, default=HERE / "results.json")
    ap.add_argument("--accounting", default="unrolled", choices=("unrolled", "multiplied"),
                    help="how the target's layer loop is counted (price_method's accounting)")
    args = ap.parse_args(argv)
    points = json.loads((HERE / "published.json").read_text())["points"]
    only = {x for x in args.only.split(",") if x}
    done = json.loads(args.out.read_text()) if args.out.exists() else {"points": {}}
    done["meta"] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *(sys.argv[1:] if argv is None else argv)]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "jax": metadata.version("jax"), "libtpu": metadata.version("libtpu"), "accounting": args.accounting,
    }
    for pt in points:
        if (only and pt["id"] not in only) or (pt["id"] in done["points"] and not args.fresh):
            continue
        print(f"pricing {pt['id']}: {pt['what']}", flush=True)
        try:
            rec = price_point(pt, args.accounting)
        except Exception as e:  # noqa: BLE001 - recorded (an unsupported topology, a failed compile)
            rec = {"error": f"{type(e).__name__}: {e}"[:1000]}
        done["points"][pt["id"]] = {"published": pt["value"], "unit": pt["unit"], "tau": pt.get("tau"), **rec}
        args.out.write_text(json.dumps(done, indent=1) + "\n")
        print(json.dumps({k: rec.get(k) for k in ("estimate", "ratio", "weight_floor_ms", "price_s", "error")}),
              flush=True)
    print(table(points, done["points"]))
    return 0


def table(points: list[dict], priced: dict) -> str:
    """The markdown table of results.md: one row per point."""
    lines = ["| point | published | estimate: compiler | estimate: roofline | weights-read floor | "
             "ratio compiler | ratio roofline |", "|---|---|---|---|---|---|---|"]
    for pt in points:
        r = priced.get(pt["id"])
        if r is None:
            continue
        u = " ms" if pt["unit"] == "ms" else "x"
        if "error" in r:
            lines.append(f"| {pt['id']} | {pt['value']}{u} | not priced: {r['error'][:120]} | | | | |")
            continue
        est, ratio = r["estimate"], r["ratio"]
        cell = lambda v, d=2: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
        lines.append(f"| {pt['id']} | {pt['value']}{u} | {cell(est['compiler'])}{u} | {cell(est['roofline'])}{u} | "
                     f"{cell(r['weight_floor_ms'])} ms | {cell(ratio['compiler'])} | {cell(ratio['roofline'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
