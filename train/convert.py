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

What is checked and refused: docs/released_drafters.md. torch is imported here, lazily, for
model.pt only (and by the SpecBlock reader for a vocab_mapping.pt); it is not a run-time dependency.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from safetensors.numpy import load_file

import specblock_jax as sbj
from specblock_jax.drafters.specblock import _released as specblock_released
from specblock_jax.drafters.blockpilot import _released as blockpilot_released
from specblock_jax.drafters.blockpilot._model import PolicyConfig, save_blockpilot


def _torch():
    try:
        import torch
    except ImportError:
        raise SystemExit("specblock-convert blockpilot: reading or writing model.pt needs torch "
                         "(pip install torch; it runs once, and serving does not need it)") from None
    return torch


def read_model_pt(file: Path) -> dict:
    """Their state dict as fp32 numpy arrays."""
    torch = _torch()
    state = torch.load(str(file), map_location="cpu", weights_only=True)
    return {k: v.float().numpy() for k, v in state.items()}


def write_model_pt(state: dict, file: Path) -> None:
    """Their state dict from fp32 numpy arrays, stored in bfloat16 as released."""
    torch = _torch()
    file.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: torch.from_numpy(v.copy()).to(getattr(torch, blockpilot_released.DTYPE))
                for k, v in state.items()}, str(file))


def _dflash_vocab(dflash: Path) -> int:
    meta = json.loads((dflash / "config.json").read_text())
    return int((meta.get("config") or {}).get("vocab_size") or meta["vocab_size"])


def blockpilot(args) -> str:
    src, out = args.src, args.out
    if src.is_dir():  # ours -> model.pt
        meta = json.loads((src / "config.json").read_text())
        raw = dict(meta["policy"], sizes=tuple(meta["policy"]["sizes"]))
        policy = PolicyConfig(**raw)
        params: dict = {}
        for name, x in load_file(str(src / "policy.safetensors")).items():  # "inp/kernel" -> nested
            *outer, leaf = name.split("/")
            node = params
            for part in outer:
                node = node.setdefault(part, {})
            node[leaf] = x
        state = blockpilot_released.state_from_policy(policy, params)
        write_model_pt(state, out)
        return f"policy {src} -> {out} (BlockPilot model.pt, {blockpilot_released.DTYPE})"
    if args.dflash is None:
        raise ValueError("importing model.pt needs --dflash: the DFlash drafter folder the policy drives")
    target = sbj.load_target(args.target, dtype="float32") if args.target else None
    vocab = target.config.vocab_size if target is not None else _dflash_vocab(args.dflash)
    policy, params = blockpilot_released.policy_from_state(read_model_pt(src), vocab, args.first_size, str(src))
    out.mkdir(parents=True, exist_ok=True)
    save_blockpilot(out, policy, params, os.path.relpath(args.dflash.resolve(), out.resolve()))
    if target is not None:
        sbj.load_drafter(out, target, dtype="float32")  # the DFlash folder and the policy, checked
    return f"{src} -> {out} (blockpilot policy, sizes {policy.sizes[0]}..{policy.sizes[-1]}, raw-logit features)"


def specblock(args) -> str:
    target = sbj.load_target(args.target, dtype="float32")
    meta = json.loads((args.src / "config.json").read_text())
    released = specblock_released.is_released(meta)
    drafter, params = sbj.load_drafter(args.src, target, dtype="float32")
    if drafter.kind != "specblock":
        raise ValueError(f"{args.src}: a {drafter.kind} drafter, not specblock")
    fmt = "specblock" if released else specblock_released.FORMAT
    chat = meta.get("chat") or (meta.get("specblock") or {}).get("chat")
    sbj.save_drafter(drafter, params, args.out, dtype=args.dtype, format=fmt, chat=chat,
                     max_positions=target.config.max_position_embeddings)
    return f"specblock drafter {args.src} -> {args.out} ({fmt}, {args.dtype})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="specblock-convert", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("specblock", help="a released SpecBlock folder <-> ours")
    s.add_argument("src", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--target", default="assets/target", help="the target's HF folder (default %(default)s)")
    s.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"))
    b = sub.add_parser("blockpilot", help="BlockPilot's model.pt <-> our policy folder")
    b.add_argument("src", type=Path, help="model.pt, or our policy folder")
    b.add_argument("out", type=Path, help="our policy folder, or model.pt")
    b.add_argument("--dflash", type=Path, help="the DFlash drafter folder the policy drives (import)")
    b.add_argument("--target", default=None, help="the target's HF folder: its vocabulary is checked")
    b.add_argument("--first-size", type=int, default=blockpilot_released.FIRST_SIZE,
                   help="block size of class 0 (their predictor: %(default)s)")
    args = p.parse_args(argv)
    if not args.src.exists():
        p.error(f"{args.src}: not found")
    try:
        print(blockpilot(args) if args.what == "blockpilot" else specblock(args))
    except ValueError as e:
        raise SystemExit(f"specblock-convert: {e}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
