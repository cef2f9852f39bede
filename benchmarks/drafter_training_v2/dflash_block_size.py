"""Which DFlash block size pays on this hardware: measured step cost per size, and the speedup each
size would give at a range of per-draft acceptance rates.

    python benchmarks/drafter_training_v2/dflash_block_size.py [--target assets/target] \
        [--sizes 4,6,8,12,16] [--prompts assets/prompts/heldout.jsonl --limit 8] [--out FILE.json]

A DFlash drafter of the v2 recipe (configs/drafters/dflash-v2.yaml: 3 layers, the target's widths)
is built with random weights: a step's cost does not depend on the weights. For each block size b
the step profile (decoding/step_profile.py: propose, update, the target's forward over the b-node
chain, verify + commit, at the decode loop's exact shapes, batch 1, mid-decode length) is timed on
each prompt, and target-only's one-token step beside it; medians over prompts.

A block of size b verifies the root and b - 1 drafts and commits at most b tokens. With each draft
accepted with probability alpha given its prefix, tau(b) = 1 + alpha + ... + alpha^(b-1), and

    speedup(b) = tau(b) * forward_1 / step(b),      break-even tau(b) = step(b) / forward_1.

The script prints one JSON line per size and, per alpha, the size that maximises the speedup.
Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import specblock_jax as sbj
from specblock_jax.decoding.prompts import encode_prompts
from specblock_jax.serving.prompt_profile import median_step_profile
from specblock_jax.decoding.step_profile import step_ms
from specblock_jax.drafters.common import init_model, target_head
from specblock_jax.drafters.dflash import DFlashConfig, DFlashDrafter, DFlashModel

ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def expected_tau(size: int, alpha: float) -> float:
    """1 + alpha + ... + alpha^(size - 1): committed tokens per step of a size-`size` block."""
    return float(sum(alpha ** i for i in range(size)))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="assets/target")
    ap.add_argument("--sizes", default="4,6,8,12,16")
    ap.add_argument("--prompts", default="assets/prompts/heldout.jsonl")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--num-layers", type=int, default=3, help="drafter layers (dflash-v2.yaml: 3)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    target = sbj.load_target(args.target)
    records, _ = sbj.read_prompts(Path(args.prompts))
    ids = encode_prompts(target, [r["prompt"] for r in records[:args.limit]])

    rows = []
    for size in sizes:
        cfg = DFlashConfig.for_target(target.config, num_layers=args.num_layers, block_size=size)
        graphdef, draft = init_model(DFlashModel, cfg)
        drafter = DFlashDrafter(cfg, graphdef, block_size=size)
        params = {"draft": draft, "embed": target.params["embed_tokens"], "head": target_head(target)}
        med = median_step_profile(target, drafter, params, ids, max_new=args.max_new_tokens, reps=args.reps)
        step = step_ms(med)
        row = {"block_size": size, **{k: round(v, 4) for k, v in med.items()},
               "step_ms": round(step, 4), "break_even_tau": round(step / med["forward_1_ms"], 3),
               "speedup_at_alpha": {str(a): round(expected_tau(size, a) * med["forward_1_ms"] / step, 3)
                                    for a in ALPHAS}}
        rows.append(row)
        print(json.dumps(row), flush=True)

    best = {str(a): max(rows, key=lambda r: r["speedup_at_alpha"][str(a)])["block_size"] for a in ALPHAS}
    print(json.dumps({"best_size_at_alpha": best}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": "python benchmarks/drafter_training_v2/dflash_block_size.py "
                                              + " ".join(sys.argv[1:] if argv is None else argv), "rows": rows,
                                              "best_size_at_alpha": best}, indent=1) + "\n")


if __name__ == "__main__":
    main()
