"""`specblock-convert`: the released SpecBlock drafters and BlockPilot policy to ours, and back.

    specblock-convert specblock SRC OUT [--target assets/target] [--dtype bfloat16]
        SRC a released SpecBlock folder (config.json naming a SpecBlock architecture) -> OUT ours;
        SRC one of our SpecBlock folders -> OUT in the released layout (format specblock_hf)
    specblock-convert blockpilot model.pt OUT --dflash DFLASH_DIR [--target T] [--first-size 14]
        BlockPilot's released policy -> our policy folder driving the DFlash drafter DFLASH_DIR
        (z-lab's release or ours); checked against --target's vocabulary when given (loaded
        after writing), else against the DFlash folder's
    specblock-convert blockpilot POLICY_DIR OUT.pt
        our policy folder -> their model.pt (bfloat16, as released)

Each subcommand is a drafter kind's `Converter` (`DrafterKind.convert`: its arguments and what it
runs live in the kind's package). What is checked and refused: docs/released_drafters.md. torch is
imported lazily, for model.pt only (and by the SpecBlock reader for a vocab_mapping.pt); it is not
a run-time dependency.
"""

from __future__ import annotations

import argparse
import sys

from specblock_jax.drafters import registry


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="specblock-convert", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    for name in registry.kinds():
        converter = registry.get(name).convert
        if converter is not None:
            converter.arguments(sub.add_parser(name, help=converter.help))
    args = p.parse_args(argv)
    if getattr(args, "src", None) is not None and not args.src.exists():
        p.error(f"{args.src}: not found")
    try:
        print(registry.get(args.what).convert.run(args))
    except ValueError as e:
        raise SystemExit(f"specblock-convert: {e}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
