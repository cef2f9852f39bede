"""The step-cost model of step sizing: ms of one decoding step at each size of a loop's menu.

Measured on the machine at hand (`attach_costs`): the loop's own step, compiled once with the
size forced through the state (`SpeculativeState.force`, a traced value: one executable serves
every size), is timed at a mid-decode state (the step profile's: the batch's real prefill,
advanced by max_new // 2 tokens) for each size in turn, interleaved over `ROUNDS` rounds; each
size's lower quartile is kept (other work on a shared machine only adds time), made
non-decreasing along the menu (`nondecreasing`). A step at size k costs the drafter's propose and update (paid at every size),
the target's forward over k nodes, verification and the commit. The figures are cached per
machine in `step_costs.json` beside the compile cache (decoding/compiled.py `default_cache_dir`),
keyed by backend, XLA flags, the target's and the drafter's settings, the batch, the cache length, the
greedy flag and the menu, so a second process reads them; with the compile cache off
($SPECBLOCK_JAX_COMPILE_CACHE=off) they live in the process only. $SPECBLOCK_JAX_STEP_COSTS=off
measures nothing: without a cost model each step verifies the whole tree (`SpeculativeLoop.step_ms`)
and never skips its draft (the test suite's default: tests/conftest.py; step sizing's own tests
give costs).

Or priced: `priced_costs` takes the figures of a TPU price (aot) instead, labelled an estimate by
whoever reports them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specblock_jax.decoding.compiled import cached_count, compiled, default_cache_dir, release
from specblock_jax.decoding.loop_core import LoopInputs
from specblock_jax.decoding.speculative import SpeculativeLoop
from specblock_jax.decoding.step_profile import mid_decode_state

COSTS_ENV = "SPECBLOCK_JAX_STEP_COSTS"  # "off": no measurement (every size costs the same; the tests' default)
ROUNDS = 5  # interleaved rounds over the sizes
REPS = 3  # timed calls per size and round
QUANTILE = 0.25  # of each size's times: a shared machine's other work only ever adds time
_MEMORY: dict[str, list[float]] = {}
_STATS = {"measured": 0, "measure_s": 0.0}


def cost_file() -> Path | None:
    """Where measured costs persist: beside the compile cache in use (jax's configured folder, else
    `default_cache_dir()`), or None (this process only) with $SPECBLOCK_JAX_COMPILE_CACHE=off."""
    if os.environ.get("SPECBLOCK_JAX_COMPILE_CACHE") == "off":
        return None
    folder = jax.config.jax_compilation_cache_dir or default_cache_dir()
    return Path(folder).parent / "step_costs.json"


def cost_key(loop: SpeculativeLoop, batch: int) -> str:
    """What a measured cost depends on: the backend and its device, the target's config, the
    drafter (settings and architecture), the batch, the cache length, greedy and the menu."""
    device = jax.devices()[0]
    parts = [jax.default_backend(), getattr(device, "device_kind", ""), os.environ.get("XLA_FLAGS", ""),
             repr(loop.cfg), repr(loop.drafter),
             f"batch={batch}", f"cache={loop.cache_len}", f"greedy={loop.greedy}", f"sizes={loop.sizes}"]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def _read(file: Path | None) -> dict:
    if file is None or not file.exists():
        return {}
    try:
        table = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError):
        return {}  # a damaged cache is measured again, not trusted
    return table if isinstance(table, dict) else {}


def _write(file: Path, key: str, ms: list[float], note: str) -> None:
    table = _read(file)
    table[key] = {"step_ms": ms, "note": note}
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(table, indent=1))
    tmp.replace(file)


def attach_costs(loop, params, drafter_params, inputs: LoopInputs):
    """The loop with its `step_ms` (module docstring), read from the cache or measured now on the
    rows of `inputs` (the batch the loop will run). A loop without step sizing, or with costs
    already, comes back as it is."""
    if not isinstance(loop, SpeculativeLoop) or not loop.sizes or loop.step_ms:
        return loop
    if os.environ.get(COSTS_ENV) == "off":  # no cost model: every size costs the same
        return loop
    batch = int(inputs.tokens.shape[0])
    key = cost_key(loop, batch)
    file = cost_file()
    ms = _MEMORY.get(key) or (_read(file).get(key) or {}).get("step_ms")
    if not ms or len(ms) != len(loop.sizes):
        ms = measure(loop, params, drafter_params, inputs)
        _MEMORY[key] = ms
        if file is not None:
            _write(file, key, ms, f"{loop.label} batch {batch} cache {loop.cache_len} sizes {loop.sizes}")
    return dataclasses.replace(loop, step_ms=tuple(float(x) for x in ms))


def priced_costs(loop: SpeculativeLoop, step_ms_by_size: dict[int, float]) -> SpeculativeLoop:
    """The loop with costs given per menu size (e.g. a TPU price's ms per step); every size of
    the menu must be given."""
    missing = [k for k in loop.sizes if k not in step_ms_by_size]
    if missing:
        raise ValueError(f"priced step costs: no figure for sizes {missing} of the menu {loop.sizes}")
    return dataclasses.replace(loop, step_ms=tuple(float(step_ms_by_size[k]) for k in loop.sizes))


def _step(loop, params, dparams, state, stop_ids):
    return loop.step(params, dparams, state, stop_ids)


def measure(loop: SpeculativeLoop, params, drafter_params, inputs: LoopInputs) -> list[float]:
    """[M] ms of the loop's step at each menu size: the lower quartile of its timed calls (module
    docstring)."""
    t0 = time.perf_counter()
    mark = cached_count()
    loop = dataclasses.replace(loop, step_ms=(1.0,) * len(loop.sizes))  # every size compiled, each forced in turn
    try:
        state = compiled(mid_decode_state, (loop,), params, drafter_params, inputs)[0](params, drafter_params, inputs)
        exe = compiled(_step, (loop,), params, drafter_params, state, inputs.stop_ids, donate_argnums=(2,))[0]
        times: list[list[float]] = [[] for _ in loop.sizes]
        for r in range(ROUNDS + 1):  # round 0 warms every size up
            for i in range(len(loop.sizes)):
                for _ in range(REPS):
                    s = jax.tree.map(jnp.copy, state._replace(force=jnp.full_like(state.force, i)))
                    jax.block_until_ready(s)
                    a = time.perf_counter()
                    jax.block_until_ready(exe(params, drafter_params, s, inputs.stop_ids))
                    if r:
                        times[i].append(time.perf_counter() - a)
    finally:
        release(mark)
    _STATS["measured"] += 1
    _STATS["measure_s"] += time.perf_counter() - t0
    return [round(x, 4) for x in nondecreasing([1000 * float(np.quantile(t, QUANTILE)) for t in times])]


def nondecreasing(ms: list[float]) -> list[float]:
    """The closest non-decreasing sequence (least squares; pool-adjacent-violators): a step over
    more nodes never costs less, so a lower median further along the menu is timing noise (a
    shared machine's), pooled with its neighbours."""
    blocks: list[list[float]] = []  # [mean, count]
    for x in ms:
        blocks.append([x, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, c2), (m1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return [m for m, c in blocks for _ in range(int(c))]


def measured_count() -> tuple[int, float]:
    """(cost models measured in this process, seconds spent measuring them, compiles included)."""
    return _STATS["measured"], _STATS["measure_s"]
