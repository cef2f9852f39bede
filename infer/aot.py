"""specblock-aot: compile a decoding method's step phases for a TPU topology from this CPU and
price them with the TPU compiler's cost model (an estimate, not a measurement; docs/tpu_aot.md).

    specblock-aot --target qwen3-8b --method eagle3 --topology v5p:2x2x1 --batch-size 1 \
        --context 2048 --out eagle3.json
    specblock-aot --target qwen3-8b --method specblock:num_nodes=90:root_topk=10 --topology v6e:2x2 --out sb90.json
    specblock-aot --target qwen3-8b --method dflash --block-size 8 --topology v5e:2x4 --train --out dflash.json

Writes the JSON of `specblock_jax.aot.price_method` and prints its markdown table. Needs libtpu:
pip install 'specblock-jax[tpu]'.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specblock_jax import aot
from specblock_jax.aot.presets import methods
from specblock_jax.aot.report import markdown_table
from specblock_jax.aot.train import parse_train_settings


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="specblock-aot", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True,
                    help=f"a preset ({', '.join(aot.PRESETS)}), an HF folder or a config.json")
    ap.add_argument("--method", required=True,
                    help=f"{', '.join(methods())} or a drafter folder, with optional :key=value decoding "
                         "overrides")
    ap.add_argument("--topology", required=True, help="e.g. v5e:2x2, v5p:2x2x1, v6e:2x4")
    ap.add_argument("--mesh", default=None, help="data=D,model=K (default: all chips tensor-parallel; "
                                                   "training: all FSDP)")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--context", type=int, default=2048, help="prompt tokens (the prefill's length)")
    ap.add_argument("--max-new", type=int, default=256, help="new-token room in the KV cache")
    ap.add_argument("--nodes", type=int, default=None, help="tree node budget (default: the method's)")
    ap.add_argument("--block-size", type=int, default=None, help="DFlash / BlockPilot block size")
    ap.add_argument("--train", action="store_true", help="also price the drafter's train step")
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--train-seq", type=int, default=2048)
    ap.add_argument("--train-setting", action="append", default=[], metavar="KEY=VALUE",
                    help="a training-config key of the drafter's kind (repeatable), e.g. remat_attention=true "
                         "for SpecBlock")
    ap.add_argument("--accounting", choices=("unrolled", "multiplied", "memory"), default="unrolled",
                    help="how the target's layer loop is counted (docs/tpu_aot.md)")
    ap.add_argument("--attention", choices=("cascade", "full", "bucketed"), default="cascade",
                    help="the target's cache attention priced: cascade (the TPU kernels; the default), "
                         "full (dense over the whole cache: the reference) or bucketed (docs/tpu_aot.md)")
    ap.add_argument("--dtype", default=None, help="override the target's dtype (presets: bfloat16)")
    ap.add_argument("--out", type=Path, required=True, help="the JSON to write")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        settings = parse_train_settings(args.train_setting)
        result = aot.price_method(args.target, args.method, args.topology, mesh=args.mesh,
                                  batch=args.batch_size, context=args.context, nodes=args.nodes,
                                  block=args.block_size, train=args.train, train_batch=args.train_batch,
                                  train_seq=args.train_seq, max_new=args.max_new,
                                  accounting=args.accounting, attention=args.attention,
                                  dtype=args.dtype, train_settings=settings)
    except (aot.MissingLibtpuError, ValueError) as e:
        print(f"specblock-aot: {e}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(markdown_table([result]))
    print("Estimates from the TPU compiler's cost model (no TPU ran); see docs/tpu_aot.md.")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
