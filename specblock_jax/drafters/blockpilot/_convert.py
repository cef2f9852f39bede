"""`specblock-convert blockpilot`: BlockPilot's released policy (`model.pt`, `_released.py`) to our
policy folder, and back.

    specblock-convert blockpilot model.pt OUT --dflash DFLASH_DIR [--target T] [--first-size 14]
        -> our policy folder driving the DFlash drafter DFLASH_DIR (z-lab's release or ours);
        checked against --target's vocabulary when given (loaded after writing), else against the
        DFlash folder's
    specblock-convert blockpilot POLICY_DIR OUT.pt
        our policy folder -> their model.pt (bfloat16, as released)

torch is imported here, lazily, for model.pt only; it is not a run-time dependency.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors.numpy import load_file

from specblock_jax.drafters.blockpilot import _released
from specblock_jax.drafters.blockpilot._model import PolicyConfig, save_blockpilot
from specblock_jax.drafters.io import load_drafter
from specblock_jax.drafters.registry import Converter
from specblock_jax.models.hf_io import load_target


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
    torch.save({k: torch.from_numpy(v.copy()).to(getattr(torch, _released.DTYPE))
                for k, v in state.items()}, str(file))


def _dflash_vocab(dflash: Path) -> int:
    meta = json.loads((dflash / "config.json").read_text())
    return int((meta.get("config") or {}).get("vocab_size") or meta["vocab_size"])


def arguments(b) -> None:
    b.add_argument("src", type=Path, help="model.pt, or our policy folder")
    b.add_argument("out", type=Path, help="our policy folder, or model.pt")
    b.add_argument("--dflash", type=Path, help="the DFlash drafter folder the policy drives (import)")
    b.add_argument("--target", default=None, help="the target's HF folder: its vocabulary is checked")
    b.add_argument("--first-size", type=int, default=_released.FIRST_SIZE,
                   help="block size of class 0 (their predictor: %(default)s)")


def run(args) -> str:
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
        state = _released.state_from_policy(policy, params)
        write_model_pt(state, out)
        return f"policy {src} -> {out} (BlockPilot model.pt, {_released.DTYPE})"
    if args.dflash is None:
        raise ValueError("importing model.pt needs --dflash: the DFlash drafter folder the policy drives")
    target = load_target(args.target, dtype="float32") if args.target else None
    vocab = target.config.vocab_size if target is not None else _dflash_vocab(args.dflash)
    policy, params = _released.policy_from_state(read_model_pt(src), vocab, args.first_size, str(src))
    out.mkdir(parents=True, exist_ok=True)
    save_blockpilot(out, policy, params, os.path.relpath(args.dflash.resolve(), out.resolve()))
    if target is not None:
        load_drafter(out, target, dtype="float32")  # the DFlash folder and the policy, checked
    return f"{src} -> {out} (blockpilot policy, sizes {policy.sizes[0]}..{policy.sizes[-1]}, raw-logit features)"


CONVERTER = Converter("BlockPilot's model.pt <-> our policy folder", arguments, run)
