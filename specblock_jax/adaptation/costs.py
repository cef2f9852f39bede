"""Measured update-round costs, reused by later jobs of the same round shape so that each does not
pay a calibration round of its own.

    entry = lookup(adapter.cost_key(), "outputs/adapt_costs.json")   # {"cost_s", "step_s"} or None
    record(adapter.cost_key(), "outputs/adapt_costs.json", cost_s=1.9, step_s=0.12)

An entry is the controller's latest estimate of one round at the config's `steps` (its optimizer
steps and the evaluation) and the measured cost of one more optimizer step. In a process they live
in `MEASURED_COSTS`; with a file (`AdaptConfig.costs_file`) they also outlive it: the file maps a
digest of the key and of the machine (processor, CPU count, backend: a cost measured elsewhere is
not this machine's) to the entry and when it was measured. Writes merge into the file and replace
it atomically.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
from pathlib import Path

import jax

# round shape (`Adapter.cost_key`) -> {"cost_s": seconds of a round at `steps`, "step_s": one more step}
MEASURED_COSTS: dict[tuple, dict] = {}


def key_digest(key: tuple) -> str:
    """A digest of a round shape and of this machine, stable across processes (drafters and
    configs are frozen dataclasses whose repr holds their settings)."""
    machine = (platform.machine(), platform.processor(), os.cpu_count(), jax.default_backend(),
               [d.device_kind for d in jax.devices()])
    return hashlib.sha256(repr((key, machine)).encode()).hexdigest()[:32]


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ValueError(f"adapt costs_file {path}: unreadable ({e}); delete it to start afresh") from None


def lookup(key: tuple, path: str | os.PathLike = "") -> dict | None:
    """The entry measured for `key` in this process, else in the file at `path` (when given)."""
    if key in MEASURED_COSTS:
        return MEASURED_COSTS[key]
    if path:
        entry = _read(Path(path)).get(key_digest(key))
        if entry is not None:
            MEASURED_COSTS[key] = {"cost_s": float(entry["cost_s"]), "step_s": float(entry["step_s"])}
            return MEASURED_COSTS[key]
    return None


def record(key: tuple, path: str | os.PathLike, cost_s: float, step_s: float) -> None:
    """Keeps the entry for `key` in this process and, with a `path`, in the file."""
    MEASURED_COSTS[key] = {"cost_s": float(cost_s), "step_s": float(step_s)}
    if not path:
        return
    path = Path(path)
    data = _read(path)
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    data[key_digest(key)] = {**MEASURED_COSTS[key], "measured_at": when}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)
