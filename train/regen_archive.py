"""Pack a `train/regenerate.py` folder into a committable archive, or restore it (byte-identical).

    python -m train.regen_archive pack data/regen-v2/train assets/data/regen-v2
    python -m train.regen_archive restore assets/data/regen-v2 data/regen-v2/train \
        --tfds-dir data/tfds-v2/train

restore checks the archive's sha256 and every rebuilt file's against MANIFEST.json, then (with
--tfds-dir) builds the `specblock_regen` TFDS dataset the training configs read. Texts are decoded
with --tokenizer's tokenizer (default assets/target, the tokenizer that wrote the data).
See specblock_jax.training.regen_archive for the format.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specblock_jax.models import load_tokenizer
from specblock_jax.training.regen_archive import pack, restore
from specblock_jax.training.regen_dataset import build_tfds, built_splits


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="regen_archive", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for cmd, source, what in (("pack", "src", "regenerate folder SRC -> archive folder OUT"),
                              ("restore", "archive", "archive folder ARCHIVE -> regenerate folder OUT")):
        sp = sub.add_parser(cmd, help=what)
        for name in (source, "out"):
            sp.add_argument(name, type=Path)
        sp.add_argument("--tokenizer", type=Path, default=Path("assets/target"),
                        help="folder of the tokenizer that wrote the data (default %(default)s)")
        if cmd == "restore":
            sp.add_argument("--tfds-dir", type=Path, default=None, help="then build the TFDS dataset here")
    args = p.parse_args(argv)
    tok = load_tokenizer(args.tokenizer)
    if tok is None:
        raise SystemExit(f"--tokenizer {args.tokenizer}: no tokenizer files there")
    t0 = time.perf_counter()
    try:
        manifest = (pack(args.src, args.out, tok) if args.cmd == "pack"
                    else restore(args.archive, args.out, tok))
    except (OSError, ValueError) as e:
        raise SystemExit(str(e)) from None
    print(json.dumps({m: {k: v for k, v in s.items() if k != "jsonl_sha256"}
                      for m, s in manifest["modes"].items()}))
    print(f"{args.cmd}: {manifest['bytes'] / 2**20:.2f} MB archive -> {args.out} "
          f"in {time.perf_counter() - t0:.1f} s")
    if args.cmd == "restore" and args.tfds_dir is not None:
        print(f"{built_splits(build_tfds(args.out, args.tfds_dir))} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
