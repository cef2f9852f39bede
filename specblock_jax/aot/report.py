"""Readable tables of `price_method` results (markdown) and the derived step numbers."""

from __future__ import annotations

from typing import Iterable

from specblock_jax.aot.cost import kernel_label
from specblock_jax.aot.topology import CHIPS

GB = 1e9


def roofline_seconds(record: dict, chip: str) -> float | None:
    """max(flops / peak bf16 FLOP/s, bytes accessed / HBM bandwidth) of a phase record on `chip`
    (per device): the same roofline as the compiler's `optimal_seconds`, from its counts."""
    if not record.get("compiled") or record.get("flops") is None:
        return None
    c = CHIPS[chip]
    return max(record["flops"] / (c.bf16_tflops * 1e12), record["bytes_accessed"] / (c.hbm_gbps * 1e9))


def step_seconds(result: dict, key: str = "roofline") -> float | None:
    """One decoding step: target_step for target-only decoding, else spec_step (None if missing)."""
    name = "target_step" if result["nodes"] == 0 else "spec_step"
    rec = result["phases"].get(name, {})
    return _seconds(rec, result["chip"], key)


def _seconds(rec: dict, chip: str, key: str) -> float | None:
    if not rec.get("compiled"):
        return None
    return roofline_seconds(rec, chip) if key == "roofline" else rec.get("optimal_seconds")


def priced_speedup(result: dict, tau: float, key: str = "roofline") -> float | None:
    """tau x priced target_step / priced spec_step (DESIGN.md: an estimate, not a measurement)."""
    ar = _seconds(result["phases"].get("target_step", {}), result["chip"], key)
    step = step_seconds(result, key)
    return None if ar is None or not step else tau * ar / step


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x / GB, fmt)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.3f}"


def _compiler_ms(rec: dict) -> str:
    """libtpu's optimal_seconds in ms; "no estimate" where it gave a negative value (cost.py keeps
    None; the roofline column prices the phase), "-" where the phase was not priced."""
    if rec.get("flops") is None:
        return "-"
    return "no estimate" if rec.get("optimal_seconds") is None else _ms(rec["optimal_seconds"])


def markdown_table(results: Iterable[dict]) -> str:
    """One row per (result, phase): ms by the roofline of the compiler's counts (how phases are
    priced) and by the compiler's optimal_seconds ("no estimate" where libtpu's was negative),
    GFLOP and GB accessed per device, GB per device, fits, compile s, and the Pallas kernels in
    the program with how each one's cost entered the figures (`cost.kernel_label`)."""
    lines = ["| target | method | topology | mesh | B | context | N | phase | roofline ms | compiler ms "
             "| GFLOP/dev | GB read/dev | GB/dev | fits | compile s | kernels |",
             "|" + "---|" * 16]
    for r in results:
        for name, rec in r["phases"].items():
            head = f"| {r['target']} | {r['method']} | {r['topology']} | {r['mesh']} | {r['batch']} | " \
                   f"{r['context']} | {r['nodes']} | {name} |"
            if not rec.get("compiled"):
                err = (rec.get("error") or "").splitlines()[0][:80]
                lines.append(f"{head} - | - | - | - | - | no ({err}) | {rec.get('compile_s', '-')} | - |")
                continue
            lines.append(f"{head} {_ms(roofline_seconds(rec, r['chip']))} | {_compiler_ms(rec)} | "
                         f"{_num(rec['flops'], '.2f')} | {_num(rec['bytes_accessed'], '.3f')} | "
                         f"{rec['device_bytes'] / GB:.2f} | {'yes' if rec['fits'] else 'NO'} | {rec['compile_s']} | "
                         f"{kernel_label(rec.get('kernels', []))} |")
    return "\n".join(lines)
