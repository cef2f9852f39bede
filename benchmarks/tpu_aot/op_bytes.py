"""Where a priced phase's bytes go: the largest instructions of the TPU compiler's optimised program.

    python benchmarks/tpu_aot/op_bytes.py --method specblock --phase update [--topology v5p:2x2x1] [--top 15] [--by-op] [--row-bucket 9]

Compiles one decode phase as `specblock_jax.aot.price_method` does (Qwen3-8B preset, batch 1, context
2048, layers unrolled) and lists the instructions of the optimised HLO (outside fused computations:
each fusion counts once) by operand + output bytes per device, read from the shapes the HLO text
prints; a conditional's branches are listed apart (XLA's cost analysis prices a conditional at its
costliest branch). These are the compiler's operands, not a trace of HBM traffic: a first look at
what a priced phase spends its bytes on.
"""

from __future__ import annotations

import argparse
import re

import jax.numpy as jnp

from specblock_jax.aot import cost, phases
from specblock_jax.aot.presets import load_target_config, released_drafter
from specblock_jax.aot.price import needed, run_chain
from specblock_jax.drafters.common import forced_row_bucket
from specblock_jax.aot.topology import get_topology, topology_mesh
from specblock_jax.models.kv_cache import cache_length
from specblock_jax.parallel.mesh import ShardingPlan

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
          "f64": 8, "s64": 8, "u64": 8}
_SHAPE = re.compile(r"\b(pred|[su](?:8|16|32|64)|bf16|f16|f32|f64)\[([0-9,]*)\]")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z\-]+)\((.*)$")


def shape_bytes(text: str) -> int:
    """Bytes of every array shape written in `text` (e.g. 'bf16[4096,128]{1,0}')."""
    total = 0
    for dtype, dims in _SHAPE.findall(text):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _BYTES[dtype]
    return total


def lines_by_computation(hlo: str):
    """(computation name, line) of every instruction line of the HLO text."""
    comp = None
    for line in hlo.splitlines():
        head = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if head and "=" not in line.split("{")[0]:
            comp = head.group(2)
        elif comp is not None:
            yield comp, line


def instructions(hlo: str):
    """(computation, name, opcode, output bytes, operand bytes) of every instruction outside fused
    computations; an operand's bytes are the output bytes of the instruction it names."""
    size, rows = {}, []
    for comp, line in lines_by_computation(hlo):
        m = _INSTR.match(line)
        if not m:
            continue
        _, name, out, op, rest = m.groups()
        size[name] = shape_bytes(out)
        if "fused_computation" in comp or comp.startswith("fused") or op in (
                "parameter", "constant", "get-tuple-element", "tuple", "bitcast"):
            continue
        operands = re.findall(r"%([\w.\-]+)", rest.split(")")[0])
        rows.append((comp, name, op, operands))
    for comp, name, op, operands in rows:
        yield comp, name, op, size[name], sum(size.get(o, 0) for o in operands)


def copies_by_shape(hlo: str) -> list:
    """[((op, buffer shape), (count, bytes read + written))] of the copy and copy-start
    instructions outside fused computations, most bytes first: layout changes and prefetches of
    whole buffers (a KV cache copied into another layout on every call shows up here)."""
    acc = {}
    for comp, line in lines_by_computation(hlo):
        m = re.match(r"^\s*(ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s(copy|copy-start)\(", line)
        if m and "fused" not in comp:
            shape = _SHAPE.search(m.group(2))  # a copy-start's output tuple starts with its destination
            key = (m.group(3), f"{shape.group(1)}[{shape.group(2)}]")
            n, b = acc.get(key, (0, 0))
            buffer = shape_bytes(shape.group(0))
            acc[key] = (n + 1, b + 2 * buffer)  # the buffer read and written once
    return sorted(acc.items(), key=lambda kv: -kv[1][1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="specblock")
    ap.add_argument("--phase", default="update")
    ap.add_argument("--topology", default="v5p:2x2x1")
    ap.add_argument("--target", default="qwen3-8b")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--row-bucket", type=int, default=None,
                    help="compile a row-switched update at the bucket holding this many rows only")
    ap.add_argument("--by-op", action="store_true", help="also total the bytes by opcode and list the collectives")
    a = ap.parse_args(argv)
    cfg = load_target_config(a.target, None).replace(attention="full")
    topo = get_topology(a.topology)
    plan = ShardingPlan(topology_mesh(topo, None))
    drafter, dparams = released_drafter(a.method, cfg, None, None)
    dparams = phases.with_shardings(dparams, plan.param_shardings(dparams))
    variant = cost.Variant(cost.unrolled(cfg), drafter)
    with forced_row_bucket(a.row_bucket):
        done = run_chain(variant, plan, 1, 2048, 256, cache_length(2048, 256, drafter.num_nodes), dparams,
                         needed((a.phase,)))
    compiled = done[a.phase][0]
    rows = sorted(instructions(compiled.as_text()), key=lambda r: -(r[3] + r[4]))
    total = sum(r[3] + r[4] for r in rows)
    c = cost.costs(compiled)
    print(f"{a.method} {a.phase} on {a.topology}: compiler {c['bytes_accessed'] / 1e6:.0f} MB, "
          f"{c['flops'] / 1e9:.2f} GFLOP per device; instructions' operands + outputs {total / 1e6:.0f} MB "
          "(every conditional branch counted)")
    print("| computation | instruction | op | operands MB | output MB |\n|---|---|---|---|---|")
    for comp, name, op, out_b, in_b in rows[:a.top]:
        print(f"| {comp} | {name} | {op} | {in_b / 1e6:.1f} | {out_b / 1e6:.1f} |")
    if a.by_op:
        by: dict[str, list] = {}
        for _, _, op, out_b, in_b in rows:
            acc = by.setdefault(op, [0, 0, 0])
            acc[0], acc[1], acc[2] = acc[0] + 1, acc[1] + in_b, acc[2] + out_b
        print("\n| op | count | operands MB | output MB |\n|---|---|---|---|")
        for op, (n, in_b, out_b) in sorted(by.items(), key=lambda kv: -(kv[1][1] + kv[1][2])):
            print(f"| {op} | {n} | {in_b / 1e6:.1f} | {out_b / 1e6:.1f} |")
        shapes = [ln.strip()[:160] for ln in compiled.as_text().splitlines()
                  if re.search(r"= .*\b(all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter)(-start)?\(", ln)]
        print(f"\ncollectives ({len(shapes)}):", *shapes[:a.top], sep="\n  ")
        print("\n| copies of one shape (outside fusions) | count | bytes read + written MB |\n|---|---|---|")
        for (op, shape), (n, b) in copies_by_shape(compiled.as_text())[:a.top]:
            print(f"| {op} {shape} | {n} | {b / 1e6:.1f} |")


if __name__ == "__main__":
    main()
