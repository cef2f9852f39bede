"""`specblock-convert specblock SRC OUT [--target assets/target] [--dtype bfloat16]`: a released
SpecBlock folder (config.json naming a SpecBlock architecture) -> OUT ours; one of our SpecBlock
folders -> OUT in the released layout (format "specblock_hf", `_released.py`)."""

from __future__ import annotations

import json
from pathlib import Path

from specblock_jax.drafters import hf_format
from specblock_jax.drafters.io import load_drafter, save_drafter
from specblock_jax.drafters.registry import Converter
from specblock_jax.drafters.specblock import _released
from specblock_jax.drafters.specblock._model import SpecBlockDrafter
from specblock_jax.models.hf_io import load_target


def arguments(s) -> None:
    s.add_argument("src", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--target", default="assets/target", help="the target's HF folder (default %(default)s)")
    s.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"))


def run(args) -> str:
    kind = SpecBlockDrafter.kind
    target = load_target(args.target, dtype="float32")
    meta = json.loads((args.src / "config.json").read_text())
    released = _released.is_released(meta)
    drafter, params = load_drafter(args.src, target, dtype="float32")
    if drafter.kind != kind:
        raise ValueError(f"{args.src}: a {drafter.kind} drafter, not {kind}")
    fmt = hf_format.NATIVE if released else _released.FORMAT
    chat = meta.get("chat") or (meta.get(hf_format.NATIVE) or {}).get("chat")
    save_drafter(drafter, params, args.out, dtype=args.dtype, format=fmt, chat=chat,
                 max_positions=target.config.max_position_embeddings)
    return f"{kind} drafter {args.src} -> {args.out} ({fmt}, {args.dtype})"


CONVERTER = Converter("a released SpecBlock folder <-> ours", arguments, run)
