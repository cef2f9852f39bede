"""Routed generation: a drafter that picks a setting per request (BlockPilot's block size) serves
each request with a drafter that really has that setting, so a request pays for its own setting,
not for the largest one.

A routing drafter has
    routes -> bool                              whether it routes (False: served in one loop)
    route(params, logits [B, V]) -> [B] int32   each request's group, from the target's
                                                next-token logits after its prompt
    for_group(params, group: int) -> LoadedDrafter   the drafter serving that group
    pack_group(groups: list[int]) -> int | None  (optional) the group a batch whose rows chose
                                                `groups` is served in; None: each row in its own
and may instead have
    route_tokens(ids: list[list[int]]) -> list[int]   each prompt's group from its token ids (host;
                                                e.g. `TableRoutes`, a benchmark's per-request oracle)
`serve_routed` prefills every prompt once to route it (one compiled prefill per batch shape),
(at batch > 1 with `pack_group`, each batch of similar-length prompts, as `decode` forms them,
is moved to one group, so the groups' batches stay full), then decodes each group with its own
drafter and compiled loop (`decode`: refill, profiling and
stop rules as in `generate`). Each prompt keeps its key stream (`key_index`), so outputs do not
depend on the grouping: greedy output is the target's, and a request's tokens are those it gets decoded alone
with its group's drafter. The routing prefill's wall time is part of the job's time: it is added to
`total_time_s` of each group's first batch, split by the group's share of the prompts.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specblock_jax.decoding.compiled import compiled
from specblock_jax.decoding.decode import OnBatch, decode
from specblock_jax.decoding.job import JobSettings, Request, prepare, renumber
from specblock_jax.decoding.options import DEFAULTS, DecodeOptions
from specblock_jax.models.kv_cache import length_bucket
from specblock_jax.decoding.loop import DecodeLoop, make_loop
from specblock_jax.decoding.prefill import LoopInputs, prefill
from specblock_jax.decoding.results import GenerationResult
from specblock_jax.decoding.sampling import GREEDY, Sampling, SamplingParams
from specblock_jax.drafters.base import LoadedDrafter


def is_routing(drafter: Any) -> bool:
    return bool(getattr(drafter, "routes", False)) and callable(getattr(drafter, "route", None))


class TableRoutes:
    """A routing drafter that sends each prompt to a group given in advance (`table`: prompt token
    ids -> group), and serves the group as `inner` (a routing drafter) does. For measurements: e.g.
    a per-request oracle that gives each request its best block size from labels. A prompt missing
    from the table is an error."""

    routes = True

    def __init__(self, inner: Any, table: dict[tuple[int, ...], int], name: str = "table"):
        if not is_routing(inner):
            raise ValueError(f"{name}: routes by table only for a routing drafter, got {type(inner).__name__}")
        self.inner, self.table, self.name = inner, dict(table), name
        self.kind = getattr(inner, "kind", type(inner).__name__)

    def route(self, params, logits):
        raise TypeError(f"{self.name}: routes by prompt (route_tokens), not by logits")

    def route_tokens(self, ids: Sequence[Sequence[int]]) -> list[int]:
        out = []
        for i, toks in enumerate(ids):
            group = self.table.get(tuple(int(t) for t in toks))
            if group is None:
                raise ValueError(f"{self.name}: prompt {i} ({len(toks)} tokens) has no entry in the route table")
            out.append(int(group))
        return out

    def for_group(self, params, group: int):
        return self.inner.for_group(params, group)

    def __getattr__(self, name):  # num_nodes, forwards_per_step, ... of the inner drafter
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def _route_batch(loop: DecodeLoop, params, drafter_params, tokens, lengths):
    """[B, P] right-padded prompts -> [B] int32 groups (the prefill's logits through the loop's
    drafter's `route`; its first token, drawn greedily, is unused)."""
    b = tokens.shape[0]
    inputs = LoopInputs(tokens, lengths, jnp.ones((b,), jnp.int32), SamplingParams.make(b, 0.0),
                        jnp.full((1,), -1, jnp.int32), jax.random.split(jax.random.key(0), b))
    pre = prefill(loop.graphdef, loop.cfg, params, inputs, loop.cache_len, 1)
    return loop.drafter.route(drafter_params, pre.logits)


def route_prompts(target, drafter, drafter_params, ids: Sequence[Sequence[int]],
                  batch_size: int) -> tuple[list[int], float, float]:
    """Each prompt's group: (groups, wall seconds, compile seconds)."""
    if callable(getattr(drafter, "route_tokens", None)):
        return drafter.route_tokens(ids), 0.0, 0.0
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    groups = [0] * len(ids)
    wall = compile_s = 0.0
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        rows = chunk + [chunk[0]] * (batch_size - len(chunk))
        width = length_bucket(max(len(ids[i]) for i in rows))
        tokens = np.zeros((batch_size, width), np.int32)
        for r, i in enumerate(rows):
            tokens[r, :len(ids[i])] = ids[i]
        lengths = jnp.asarray([len(ids[i]) for i in rows], jnp.int32)
        args = (target.params, drafter_params, jnp.asarray(tokens), lengths)
        loop = make_loop(graphdef=target.graphdef, cfg=target.config, drafter=drafter, cache_len=width, max_new=1)
        exe, seconds = compiled(_route_batch, (loop,), *args)
        t0 = time.perf_counter()
        out = np.asarray(exe(*args))
        wall += time.perf_counter() - t0
        compile_s += seconds
        for r, i in enumerate(chunk):
            groups[i] = int(out[r])
    return groups, wall, compile_s


def pack_groups(groups: list[int], lengths: Sequence[int], batch_size: int, pack) -> list[int]:
    """Each request's served group: requests ordered by length (as `decode` batches them) in chunks
    of `batch_size`, each chunk moved to `pack(its groups)` (None: left as chosen)."""
    order = sorted(range(len(groups)), key=lambda i: lengths[i])
    out = list(groups)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        group = pack([groups[i] for i in chunk])
        if group is not None:
            for i in chunk:
                out[i] = int(group)
    return out


def generate_routed(target, prompts, router: LoadedDrafter, *, sampling: Sampling = GREEDY,
                    max_new_tokens: int | Sequence[int] = 256, seed: int = 0, options: DecodeOptions = DEFAULTS,
                    on_batch: OnBatch | None = None) -> list[GenerationResult]:
    """`sbj.generate`'s call with each prompt routed by `router` (a routing drafter, e.g.
    BlockPilot's) to the drafter of its group; one result per prompt, in order, each with
    `stats.route`. On one device; under a mesh the router decodes as one drafter."""
    if not isinstance(router, LoadedDrafter) or not is_routing(router.drafter):
        raise TypeError("router: expected a LoadedDrafter of a routing drafter (one with `route` and "
                        f"`for_group`, e.g. BlockPilot), got {type(getattr(router, 'drafter', router)).__name__}")
    requests, job = prepare(target, prompts, sampling=sampling, max_new_tokens=max_new_tokens, seed=seed,
                            options=options)
    if not requests:
        return []
    return serve(target, requests, router, job, on_batch=on_batch)


def serve(target, requests: Sequence[Request], drafter: LoadedDrafter | None, options: JobSettings, *,
          adapter: Any = None, on_batch: OnBatch | None = None) -> list[GenerationResult]:
    """`decode`, or `serve_routed` for a routing drafter on one device without an adapter (under
    a mesh or with an adapter a routing drafter decodes as one drafter)."""
    if drafter is not None and is_routing(drafter.drafter) and options.mesh is None and adapter is None:
        return serve_routed(target, requests, drafter, options, on_batch)
    return decode(target, requests, drafter, options, adapter=adapter, on_batch=on_batch)


def serve_routed(target, requests: Sequence[Request], drafter: LoadedDrafter, options: JobSettings,
                 on_batch: OnBatch | None = None) -> list[GenerationResult]:
    """The requests of a routing drafter (module docstring), each group through `decode` with
    its own drafter; results in the requests' order."""
    router, dparams = drafter
    n = len(requests)
    batch_size = options.batch_size or max(1, min(8, n))
    chosen, route_s, route_compile_s = route_prompts(target, router, dparams, [r.tokens for r in requests],
                                                     batch_size)
    pack = getattr(router, "pack_group", None)
    groups = (pack_groups(chosen, [len(r.tokens) for r in requests], batch_size, pack)
              if batch_size > 1 and callable(pack) else chosen)
    results: list[Any] = [None] * n
    batches = 0  # stats.batch numbers batches (or refill segments) across the whole job
    for group in sorted(set(groups)):
        part = [i for i in range(n) if groups[i] == group]
        out = decode(target, renumber(requests, part), router.for_group(dparams, group),
                     dataclasses.replace(options, batch_size=batch_size))
        first = min(res.stats.batch for res in out)
        share = route_s * len(part) / n
        for i, res in zip(part, out):
            if res.stats.batch == first:
                res.stats.total_time_s += share
                res.stats.compile_s += route_compile_s if group == min(groups) else 0.0
            res.stats.route = {"group": group, "chosen": chosen[i], "route_s": share}
            res.stats.batch += batches
            res.index = i
            results[i] = res
        batches = 1 + max(results[i].stats.batch for i in part)
        if on_batch is not None:
            on_batch([results[i] for i in part])
    return results
