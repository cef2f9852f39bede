"""The committed per-request tau table of the priced-label study, and label folders rebuilt from it.

    .venv/bin/python benchmarks/blockpilot_priced/tau_table.py export    # data/blockpilot-v5p/* -> tau.json
    .venv/bin/python benchmarks/blockpilot_priced/tau_table.py restore   # tau.json -> data/blockpilot-v5p/*

tau.json: {"sizes": [4, .., 8], "splits": {split: {"prompts", "skip", "limit", "ids" [n],
"new_tokens" [n], "forwards" [n][sizes], "tau" [n][sizes]}}, settings}. Per request and size:
`forwards` = the target's decoding forwards + the prefill, tau = (new_tokens - 1) / (forwards - 1)
(GenerationStats), greedy, 64 new tokens, measured on this CPU by `specblock-train blockpilot
labels` (configs/drafters/blockpilot-v5p.yaml). Greedy decoding is lossless, so a request's new
tokens are the same at every size (export checks it). `restore` writes label folders
(size_<s>.jsonl + settings.json) that `specblock-train blockpilot train` and `specblock-bench
:oracle=` read, with costs_v5p.json copied in as their costs.json (priced step costs).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
LABELS = Path("data/blockpilot-v5p")
SPLITS = ("train", "heldout", "humaneval")
KEEP = ("target", "dflash", "prompts", "skip", "limit", "max_new_tokens", "temperature", "seed")


def read_folder(folder: Path) -> tuple[dict, list[int]]:
    """One label folder -> (its split record, its sizes); only prompts done at every size."""
    rows = {int(p.stem.split("_")[1]): {r["id"]: r for r in map(json.loads, p.read_text().splitlines())}
            for p in folder.glob("size_*.jsonl")}
    sizes = sorted(rows)
    settings = json.loads((folder / "settings.json").read_text())
    ids = [i for i in rows[sizes[0]] if all(i in rows[s] for s in sizes)]
    for i in ids:
        new = {rows[s][i]["new_tokens"] for s in sizes}
        if len(new) != 1:
            raise SystemExit(f"{folder}: {i}: new tokens differ across sizes {new} (greedy must be lossless)")
    split = {k: settings[k] for k in KEEP if k in settings}
    split.update(ids=ids, new_tokens=[rows[sizes[0]][i]["new_tokens"] for i in ids],
                 forwards=[[rows[s][i]["forwards"] for s in sizes] for i in ids],
                 tau=[[rows[s][i]["tau"] for s in sizes] for i in ids])
    return split, sizes


def export(labels: Path, out: Path) -> dict:
    table, sizes = {"splits": {}}, None
    for name in SPLITS:
        split, s = read_folder(labels / name)
        if sizes is not None and s != sizes:
            raise SystemExit(f"{labels / name}: sizes {s}, other splits {sizes}")
        sizes, table["splits"][name] = s, split
    table["sizes"] = sizes
    out.write_text(json.dumps(table, separators=(",", ":")) + "\n")
    return {name: len(sp["ids"]) for name, sp in table["splits"].items()}


def restore(table_path: Path, labels: Path, costs: Path) -> None:
    table = json.loads(table_path.read_text())
    for name, sp in table["splits"].items():
        folder = labels / name
        folder.mkdir(parents=True, exist_ok=True)
        for k, size in enumerate(table["sizes"]):
            (folder / f"size_{size}.jsonl").write_text("".join(
                json.dumps({"id": i, "tau": t[k], "forwards": f[k], "new_tokens": n}) + "\n"
                for i, t, f, n in zip(sp["ids"], sp["tau"], sp["forwards"], sp["new_tokens"])))
        settings = {k: sp[k] for k in KEEP if k in sp}
        (folder / "settings.json").write_text(json.dumps({**settings, "sizes": ",".join(map(str, table["sizes"])),
                                                          "restored_from": str(table_path)}, indent=2))
        shutil.copyfile(costs, folder / "costs.json")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cmd", choices=("export", "restore"))
    p.add_argument("--labels", type=Path, default=LABELS)
    p.add_argument("--table", type=Path, default=HERE / "tau.json")
    p.add_argument("--costs", type=Path, default=HERE / "costs_v5p.json")
    args = p.parse_args(argv)
    if args.cmd == "export":
        print(export(args.labels, args.table))
    else:
        restore(args.table, args.labels, args.costs)


if __name__ == "__main__":
    main()
