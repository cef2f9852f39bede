"""The flags of BlockPilot's training command (`specblock-train blockpilot labels|train`, run by
the command-line package's train/blockpilot.py, which decodes and trains), its YAML config's
sections, and what a label folder says about its making (settings.json)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specblock_jax.drafters.blockpilot._labels import read_labels


def training_block_size(dflash_dir: str | Path) -> int:
    """The block size the DFlash drafter in `dflash_dir` was trained with."""
    return int(json.loads((Path(dflash_dir) / "config.json").read_text())["config"]["block_size"])


def label_source(folder: Path) -> tuple[Path, int]:
    """(the prompt file, the DFlash drafter's training block size) a label folder was made from
    (its settings.json: the `labels` command's arguments)."""
    settings = json.loads((Path(folder) / "settings.json").read_text())
    return Path(settings["prompts"]), training_block_size(settings["dflash"])


def label_dflash(folder: Path) -> Path:
    """The DFlash drafter folder a label folder's labels were measured with (its settings.json)."""
    return Path(json.loads((Path(folder) / "settings.json").read_text())["dflash"])


def summarise(folder: Path, prefer: int | None = None) -> dict:
    """A label folder's prompt and label counts per metric, mean tau per size, the oracle's."""
    out = {}
    for metric in ("tau", "speed"):
        if metric == "speed" and not (folder / "costs.json").exists():
            continue
        ids, sizes, tau, labels = read_labels(folder, metric, prefer)
        out[metric] = {"prompts": len(ids), "label_counts": {s: labels.count(i) for i, s in enumerate(sizes)}}
    out["mean_tau"] = {s: float(tau[:, i].mean()) for i, s in enumerate(sizes)}
    out["oracle_mean_tau"] = float(tau.max(1).mean())
    if (folder / "costs.json").exists():
        out["ms_per_step_batch1"] = json.loads((folder / "costs.json").read_text())
    return out


def apply_config(path: Path, subparsers: dict[str, argparse.ArgumentParser]) -> None:
    """A YAML config's sections ({"labels": {...}, "train": {...}}) become the subcommands'
    defaults (flags still override them); an unknown section or key is a clear error."""
    import yaml

    cfg = yaml.safe_load(path.read_text()) or {}
    if set(cfg) - set(subparsers):
        raise SystemExit(f"{path}: unknown sections {sorted(set(cfg) - set(subparsers))} "
                         f"(sections: {sorted(subparsers)})")
    for name, sp in subparsers.items():
        section = {k.replace("-", "_"): v for k, v in (cfg.get(name) or {}).items()}
        dests = {a.dest for a in sp._actions}
        if set(section) - dests:
            raise SystemExit(f"{path}: {name}: unknown keys {sorted(set(section) - dests)}")
        sp.set_defaults(**section)
        for action in sp._actions:
            if action.required and action.dest in section:
                action.required = False


def parsers(prog: str, description: str = "") -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command's parser and its subcommands' parsers ({"labels", "train"})."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    sub = p.add_subparsers(dest="cmd", required=True)
    lab = sub.add_parser("labels")
    lab.add_argument("--target", default="assets/target")
    lab.add_argument("--dflash", default="assets/drafters/dflash")
    lab.add_argument("--prompts", required=True)
    lab.add_argument("--out", required=True)
    lab.add_argument("--sizes", default="14,15,16,17,18")
    lab.add_argument("--skip", type=int, default=0)
    lab.add_argument("--limit", type=int, default=0)
    lab.add_argument("--max-new-tokens", type=int, default=64)
    lab.add_argument("--temperature", type=float, default=0.0)
    lab.add_argument("--batch-size", type=int, default=16)
    lab.add_argument("--cost-prompts", type=int, default=8)
    lab.add_argument("--seed", type=int, default=0)
    tr = sub.add_parser("train")
    tr.add_argument("--target", default="assets/target")
    tr.add_argument("--labels", required=True)
    tr.add_argument("--eval-labels", required=True)
    tr.add_argument("--features", default="topk", choices=("topk", "full"))
    tr.add_argument("--top-k", type=int, default=32)
    tr.add_argument("--metric", default="speed", choices=("tau", "speed"))
    tr.add_argument("--costs", default="", help="step costs JSON {\"step_ms\": {size: ms}} for --metric "
                    "speed (e.g. priced for a TPU); default: each label folder's measured costs.json")
    tr.add_argument("--loss", default="ce", choices=("ce", "regret"))
    tr.add_argument("--width", type=int, default=256)
    tr.add_argument("--steps", type=int, default=400)
    tr.add_argument("--lr", type=float, default=1e-3)
    tr.add_argument("--dropout", type=float, default=0.2)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--run-dir", default="runs/dflash_blockpilot")
    tr.add_argument("--out", default="", help="the drafter folder; default: <run>/export")
    tr.add_argument("--dflash-dir", default="../dflash")
    return p, {"labels": lab, "train": tr}
