"""`specblock-export`: a drafter folder into another layout (ours or a serving engine's).

    specblock-export DRAFTER_DIR OUT_DIR --format speculators [--target assets/target]
        [--dtype bfloat16] [--verifier Qwen/Qwen3-8B] [--overwrite]

DRAFTER_DIR may be any folder `sbj.load_drafter` reads: ours (any kind), an engine layout
(EAGLE-3 / SGLang, speculators / vLLM, DFlash) or SpecBlock's release, so the same command imports
a public drafter into ours (`--format specblock`) and exports ours for serving. The target is
loaded to check the drafter against it (vocabulary, widths, auxiliary layers, RoPE, positions) and
to write the position limit engines check. Formats: specblock (every kind), eagle3 and speculators
(EAGLE-3), dflash (DFlash), specblock_hf (SpecBlock's released layout). BlockPilot's released
policy converts with `specblock-convert blockpilot` (docs/released_drafters.md). OUT_DIR under the
shipped assets/ is refused (exit 2) unless --overwrite.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import specblock_jax as sbj
from specblock_jax import writing
from specblock_jax.drafters import hf_format


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="specblock-export", description=__doc__.split("\n\n")[0])
    p.add_argument("drafter", type=Path, help="drafter folder (ours or a serving engine's layout)")
    p.add_argument("out", type=Path, help="output folder")
    p.add_argument("--format", required=True, choices=hf_format.formats())
    p.add_argument("--target", default="assets/target", help="the target's HF folder (default %(default)s)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"))
    p.add_argument("--verifier", default="", help="speculators: the target's name or path for vLLM "
                                                  "(default: --target)")
    p.add_argument("--overwrite", action="store_true", help="allow OUT to be a shipped folder under assets/")
    args = p.parse_args(argv)
    if not (args.drafter / "config.json").exists():
        p.error(f"{args.drafter}: not a drafter folder (config.json is missing)")
    try:
        writing.check_writable(args.out, args.overwrite, flag="--overwrite")  # before loading anything
    except writing.ShippedFolderError as e:
        p.error(str(e))
    target = sbj.load_target(args.target, dtype="float32")
    try:
        drafter, params = sbj.load_drafter(args.drafter, target, dtype="float32")
        meta = json.loads((args.drafter / "config.json").read_text())
        chat = meta.get("chat") or (meta.get(hf_format.NATIVE) or {}).get("chat")
        engine = {"chat": chat}
        if args.format != hf_format.NATIVE:  # the target's position limit, name and architectures
            engine.update(target=target, verifier=args.verifier or str(args.target))
        sbj.save_drafter(drafter, params, args.out, dtype=args.dtype, format=args.format,
                         overwrite=args.overwrite, **engine)
    except ValueError as e:
        raise SystemExit(f"specblock-export: {e}") from None
    print(f"{drafter.kind} drafter {args.drafter} -> {args.out} ({args.format}, {args.dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
