"""An adapter's whole state on disk, so that a resumed job continues adapting where it stopped.

    save_state(adapter, "job.adapter")     # weights, optimizer, replay buffer, controller, events
    load_state(adapter, "job.adapter")     # into an Adapter built for the same drafter and config

The folder holds `arrays.npz` (the trainable weights, the optimizer state, the replay buffer, the
pending update's old weights and optimizer state, the PRNG key: pytree leaves in a fixed order)
and `state.json` (the controller, counters, events, and a fingerprint of the drafter, config and
trainable shapes, checked on load: a state saved for another drafter or setting is refused).
Writes go to a temporary folder renamed into place, so a kill leaves the old state or the new.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specblock_jax.adaptation.buffer import ReplayBuffer

CONTROLLER_FIELDS = ("tokens", "seconds", "updates", "gain_estimate", "cost_estimate")
COUNTERS = ("time_s", "compile_s", "budget_seen", "tokens_seen", "round_steps", "step_s", "last_round")


def fingerprint(adapter) -> str:
    """A hash of what a saved state must match: drafter kind and settings, the adapt config, the
    trainable parameters' names and shapes."""
    d = adapter.drafter
    settings = {f.name: repr(getattr(d, f.name)) for f in dataclasses.fields(d) if f.name != "graphdef"}
    shapes = {name: list(x.shape) for name, x in adapter.trainable.items()}
    text = json.dumps([getattr(d, "kind", type(d).__name__), settings, dataclasses.asdict(adapter.config), shapes],
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _tree(adapter) -> dict:
    tree = {"trainable": adapter.trainable, "opt_state": adapter.opt_state,
            "key": jax.random.key_data(adapter.key)}
    if adapter.buffer is not None:
        tree["buffer"] = adapter.buffer.data
    if adapter.pending is not None:
        tree["pending"] = adapter.pending[:2]
    return tree


def save_state(adapter, path: str | os.PathLike) -> Path:
    """Writes the adapter's state into folder `path` (atomically replaced)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    leaves = jax.tree.leaves(_tree(adapter))
    np.savez(tmp / "arrays.npz", *[np.asarray(jax.device_get(x)) for x in leaves])
    buf = adapter.buffer
    meta = {"fingerprint": fingerprint(adapter), "num_leaves": len(leaves),
            "controller": {k: getattr(adapter.controller, k) for k in CONTROLLER_FIELDS},
            **{k: getattr(adapter, k) for k in COUNTERS},
            "buffer": None if buf is None else {"size": buf.size, "next": buf.next, "shape": [
                buf.capacity, buf.window, buf.num_features, buf.hidden_size], "dtype": buf.dtype},
            "pending_index": None if adapter.pending is None else adapter.pending[2],
            "fresh": adapter.fresh, "events": adapter.events}
    (tmp / "state.json").write_text(json.dumps(meta, default=float))
    old = path.with_name(path.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def load_state(adapter, path: str | os.PathLike) -> None:
    """Restores a state `save_state` wrote into `adapter` (built for the same drafter, weights
    and config); ValueError naming the folder when it was saved for something else."""
    path = Path(path)
    meta = json.loads((path / "state.json").read_text())
    if meta["fingerprint"] != fingerprint(adapter):
        raise ValueError(f"{path}: the adapter state was saved for another drafter or adapt setting")
    if meta["buffer"] is not None:
        c, w, n, h = meta["buffer"]["shape"]
        adapter.buffer = ReplayBuffer(c, w, n, h, meta["buffer"]["dtype"])
    if meta["pending_index"] is not None:
        adapter.pending = (adapter.trainable, adapter.opt_state, meta["pending_index"])
    template = _tree(adapter)
    arrays = np.load(path / "arrays.npz")
    leaves = [arrays[f"arr_{i}"] for i in range(meta["num_leaves"])]
    treedef = jax.tree.structure(template)
    if treedef.num_leaves != len(leaves):
        raise ValueError(f"{path}: {len(leaves)} saved arrays, the adapter has {treedef.num_leaves}")
    tree = jax.tree.unflatten(treedef, [jnp.asarray(x) for x in leaves])
    adapter.trainable, adapter.opt_state = tree["trainable"], tree["opt_state"]
    adapter.key = jax.random.wrap_key_data(tree["key"])
    if adapter.buffer is not None:
        adapter.buffer.data = tuple(tree["buffer"])
        adapter.buffer.size, adapter.buffer.next = meta["buffer"]["size"], meta["buffer"]["next"]
    if adapter.pending is not None:
        adapter.pending = (*tree["pending"], meta["pending_index"])
    for k, v in meta["controller"].items():
        setattr(adapter.controller, k, v)
    for k in COUNTERS:
        setattr(adapter, k, meta[k])
    adapter.fresh, adapter.events = list(meta["fresh"]), list(meta["events"])
