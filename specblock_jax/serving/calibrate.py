"""Pick a drafter's tree shape for this machine (EAGLE's `total_token=-1` idea, measured end to end).

How many tree nodes pay off depends on how verification cost grows with the node count on the
hardware at hand (flat on an accelerator up to dozens of tokens, steep on a small CPU) and on what
drafting costs there. EAGLE times the target at a few node counts; here the whole decoder is timed
instead: real speculative decoding of a few calibration prompts at every setting of the drafter
kind's shape knobs, keeping the setting with the highest tokens/s (decode-loop wall time,
compilation excluded):

    eagle3          num_nodes x depth (top_k fixed)
    specblock       num_nodes x max_blocks
    dflash          block_size (<= the block size it was trained with)
    prompt_lookup   num_nodes

BlockPilot picks each request's block size itself: nothing to calibrate.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specblock_jax.decoding.compiled import cached_count, release
from specblock_jax.decoding.generate import generate
from specblock_jax.decoding.step_profile import median_seconds
from specblock_jax.decoding.options import DecodeOptions
from specblock_jax.decoding.sampling import Sampling
from specblock_jax.drafters import registry
from specblock_jax.drafters.base import LoadedDrafter
from specblock_jax.models.kv_cache import init_cache
from specblock_jax.models.target import Target
from specblock_jax.models.transformer import apply

def _kind(drafter) -> registry.DrafterKind:
    kind = registry.kind_of(drafter)
    if kind.grid is None:
        calibrated = [k for k in registry.kinds() if registry.get(k).grid is not None]
        raise ValueError(f"calibrate: a {kind.name!r} drafter has no tree-shape knobs to calibrate "
                         f"(calibrated kinds: {calibrated})")
    return kind


def _allowed(drafter, kind: registry.DrafterKind, knob: str) -> tuple[int, int]:
    """The [low, high] range of a knob's values for this drafter (the kind's `knob_range`)."""
    return kind.knob_range(drafter, knob) if kind.knob_range is not None else (1, 1 << 30)


def default_grid(drafter) -> dict[str, tuple[int, ...]]:
    """The kind's default candidates (its registry entry's `grid`) merged with the drafter's current
    setting, within the kind's `knob_range` (e.g. DFlash sizes up to its trained block size)."""
    kind = _kind(drafter)
    grid = {}
    for knob, values in kind.grid.items():
        low, high = _allowed(drafter, kind, knob)
        values = {v for v in set(values) | {int(getattr(drafter, knob))} if low <= v <= high}
        grid[knob] = tuple(sorted(values))
    return grid


def check_grid(drafter, grid: dict[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """ValueError unless every knob belongs to the drafter's kind and every value is allowed."""
    kind = _kind(drafter)
    bad = set(grid) - set(kind.grid)
    if bad or not grid:
        raise ValueError(f"calibrate: a {kind.name} drafter's knobs are {sorted(kind.grid)}, got {sorted(grid)}")
    out = {}
    for knob, values in grid.items():
        values = tuple(int(v) for v in values)
        if not values or min(values) < 1:
            raise ValueError(f"calibrate: {knob} needs positive values, got {values}")
        low, high = _allowed(drafter, kind, knob)
        if not all(low <= v <= high for v in values):
            raise ValueError(f"calibrate: a {kind.name} drafter's {knob} must be in [{low}, {high}], got {values}")
        out[knob] = values
    return out


def settings(grid: dict[str, Sequence[int]]) -> list[dict[str, int]]:
    """Every combination of the grid's values, knobs in the grid's order."""
    knobs = list(grid)
    return [dict(zip(knobs, combo)) for combo in itertools.product(*(grid[k] for k in knobs))]


def verify_seconds(target: Target, num_nodes: int, context: int = 256, reps: int = 10) -> float:
    """Median time of one target forward over `num_nodes` tree tokens after `context` tokens."""
    cfg = target.config
    cache = init_cache(cfg, 1, context + num_nodes)._replace(lengths=jnp.asarray([context], jnp.int32))
    tokens = jnp.zeros((1, num_nodes), jnp.int32)
    positions = context + jnp.arange(num_nodes, dtype=jnp.int32)[None]
    mask = jnp.tril(jnp.ones((1, num_nodes, num_nodes), bool))
    fn = jax.jit(lambda p, c: apply(target.graphdef, p, tokens, positions, mask, c).logits)
    return median_seconds(fn, target.params, cache, reps=reps)


def calibrate(target: Target, loaded: LoadedDrafter, prompts: Sequence, grid: dict[str, Sequence[int]] | None = None, *,
              max_new_tokens: int = 64, batch_size: int = 1, temperature: float = 0.0, seed: int = 0,
              verify_timing: bool = True, draft_timing: bool = False) -> dict:
    """Decodes `prompts` with the drafter at every setting of `grid` (default `default_grid`) and
    returns
        {"kind", "knobs": [knob, ...], "best": {knob: value},
         "table": [{knob: value, ..., "tokens_per_s", "tau"[, "draft_ms_per_token"]}, ...],
         "verify_ms": {N: ms of a target forward over N tokens, for N = 1 and every node budget}
                      ({} without verify_timing),
         "calibrate_s": wall time of the whole calibration, compilation included}.
    tokens_per_s: new tokens / decode-loop wall time over the prompts (compilation excluded), at
    `batch_size` and `temperature`; the best setting has the highest. tau: mean over prompts.
    draft_ms_per_token (with draft_timing; each setting's propose and update are then compiled and
    timed apart too): estimated drafting time (propose + update) per new token. The candidates'
    executables are released once measured (the chosen setting compiles again where it is used).
    The result is JSON data; `with_setting(loaded, result["best"])` gives the calibrated drafter."""
    start = time.perf_counter()
    drafter, params = loaded
    grid = check_grid(drafter, grid) if grid is not None else default_grid(drafter)
    table = []
    for setting in settings(grid):
        candidate = LoadedDrafter(dataclasses.replace(drafter, **setting), params)
        mark = cached_count()
        res = generate(target, prompts, drafter=candidate, sampling=Sampling(temperature), max_new_tokens=max_new_tokens,
                       seed=seed, options=DecodeOptions(batch_size=batch_size, profile="draft" if draft_timing else "off"))
        release(mark)  # a candidate's executables are one-off: XLA:CPU runs out of code memory otherwise
        walls = {r.stats.batch: r.stats.total_time_s for r in res}  # one loop wall time per batch
        drafts = {r.stats.batch: r.stats.batch_draft_time_s or 0.0 for r in res}
        tokens = sum(len(r.token_ids) for r in res)
        taus = [r.stats.tau for r in res if r.stats.tau]
        row = {**setting, "tokens_per_s": tokens / sum(walls.values()), "tau": float(np.mean(taus)) if taus else 1.0}
        if draft_timing:
            row["draft_ms_per_token"] = 1000 * sum(drafts.values()) / tokens
        table.append(row)
    best_row = max(table, key=lambda r: r["tokens_per_s"])
    best = {k: best_row[k] for k in grid}
    node_counts = sorted({1, *(dataclasses.replace(drafter, **s).num_nodes for s in settings(grid))})
    verify_ms = {n: 1000 * verify_seconds(target, n) for n in node_counts} if verify_timing else {}
    return {"kind": drafter.kind, "knobs": list(grid), "best": best, "table": table,
            "verify_ms": verify_ms, "calibrate_s": time.perf_counter() - start}


def with_setting(loaded: LoadedDrafter, setting: dict[str, int]) -> LoadedDrafter:
    """The drafter with `setting` applied, with its params."""
    return LoadedDrafter(dataclasses.replace(loaded.drafter, **setting), loaded.params)
