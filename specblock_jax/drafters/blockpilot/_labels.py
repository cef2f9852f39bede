"""BlockPilot label folders (`specblock-train blockpilot labels`): per candidate block size,
size_<s>.jsonl {"id", "tau", "forwards", "new_tokens"} per prompt, costs.json {"step_ms": {size:
ms}, ...} and settings.json (the prompt file they were made from). Reading them gives each prompt's
oracle size, the one with the best measured tau or speed (tau / step cost); `oracle_table` maps a
prompt's token ids to it, so a bench can route each request to its labelled size. The step costs
are the folder's measured costs.json unless a costs file is given (the same {"step_ms": {size: ms}}
layout, e.g. each size's step priced for a TPU: assets/drafters/blockpilot-v5p/provenance/costs_v5p.json).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specblock_jax.prompts import read_prompts


def oracle_labels(score: np.ndarray, sizes: list[int], prefer: int | None = None) -> list[int]:
    """score [prompts, sizes] -> per prompt the index of the best size. Ties (within 1e-9) go to
    the size nearest `prefer` (the drafter's training block size, as BlockPilot breaks them; then
    the smaller), or to the smaller size when `prefer` is None."""
    sizes_arr = np.asarray(sizes)
    rank = np.abs(sizes_arr - prefer) if prefer is not None else np.zeros(len(sizes))
    order = np.lexsort((sizes_arr, rank))  # candidates in tie-break order
    best = score.max(axis=1, keepdims=True)
    tied = score >= best - 1e-9  # [prompts, sizes]
    return [int(order[np.argmax(row[order])]) for row in tied]


def step_costs(path: Path, sizes: list[int]) -> np.ndarray:
    """[len(sizes)] step ms of each size from a costs file {"step_ms": {size: ms}, ...}."""
    costs = json.loads(Path(path).read_text())["step_ms"]
    missing = [s for s in sizes if str(s) not in costs]
    if missing:
        raise ValueError(f"{path}: no step cost for sizes {missing} (rerun `labels` to time them, "
                         f"or give a costs file that has them)")
    return np.asarray([costs[str(s)] for s in sizes], np.float64)


def read_labels(folder: Path, metric: str = "tau", prefer: int | None = None, costs: Path | None = None
                ) -> tuple[list[str], list[int], np.ndarray, list[int]]:
    """(ids, sizes, tau [prompts, sizes], oracle label index per prompt) of a label folder; ties
    go to the size nearest `prefer` (`oracle_labels`). metric "speed" divides tau by each size's
    step ms from `costs` (a costs file), else from the folder's measured costs.json."""
    per_size = {int(p.stem.split("_")[1]): {json.loads(x)["id"]: json.loads(x)["tau"]
                                             for x in p.read_text().splitlines() if x.strip()}
                for p in folder.glob("size_*.jsonl")}
    sizes = sorted(per_size)
    ids = [i for i in per_size[sizes[0]] if all(i in per_size[s] for s in sizes)]
    tau = np.asarray([[per_size[s][i] or 1.0 for s in sizes] for i in ids], np.float64)
    score = tau
    if metric == "speed":
        score = tau / step_costs(costs if costs is not None else folder / "costs.json", sizes)
    return ids, sizes, tau, oracle_labels(score, sizes, prefer)


def oracle_table(folder: Path, encode, sizes, prefer: int | None = None) -> dict[tuple[int, ...], int]:
    """Prompt token ids -> the labelled best block size (measured speed, ties to `prefer`) of every
    prompt in a label folder; its prompts are those of the folder's settings.json (the file the
    labels were made from), token ids by `encode` (list of texts -> list of id lists). `sizes`: the
    sizes the serving drafter has; the labels must be for exactly these."""
    settings = json.loads((folder / "settings.json").read_text())
    ids, label_sizes, _, labels = read_labels(folder, "speed", prefer)
    if sorted(label_sizes) != sorted(int(s) for s in sizes):
        raise ValueError(f"{folder}: labels for sizes {label_sizes}, the drafter has {sorted(sizes)}")
    records, _ = read_prompts(Path(settings["prompts"]))
    text = {r["id"]: r["prompt"] for r in records}
    missing = [i for i in ids if i not in text]
    if missing:
        raise ValueError(f"{folder}: labelled ids not in {settings['prompts']}: {missing[:3]}")
    toks = encode([text[i] for i in ids])
    return {tuple(t): label_sizes[k] for t, k in zip(toks, labels)}


def oracle_drafter(loaded, folder: str, target):
    """A bench method's `:oracle=LABELS_DIR` (the registry's `DrafterKind.method_settings`): the
    BlockPilot drafter of `loaded` with each request given its label's best size in place of the
    policy's choice (`oracle_table`: measured speed, ties to the DFlash training block size),
    served as the policy is (per-row sizes in one loop). ValueError for a missing or mismatched
    label folder."""
    import dataclasses

    from specblock_jax.prompts import encode_prompts
    from specblock_jax.drafters.base import LoadedDrafter

    inner, params = loaded
    if not folder:
        raise ValueError("oracle takes a label folder")
    try:
        table = oracle_table(Path(folder), lambda texts: encode_prompts(target, texts), inner.policy.sizes,
                             inner.dflash.config.block_size)
    except (OSError, KeyError) as e:
        raise ValueError(str(e)) from None
    return LoadedDrafter(dataclasses.replace(inner, oracle=table), params)
