"""`run_requests`: one call's requests through static batches or one continuous-batching stream, each
batch's prefill and whole decode loop in one jit (decoding/loop.py).

Every sequence stops on its own (a stop token or its token budget); a static batch's loop ends
when all its rows have stopped, a stream's rows take the next waiting request (decoding/refill.py).
`generate` (decoding/generate.py) is the public entry; auto serving (serving/auto.py) calls
`run_requests` for each part of a job. A drafter whose rows choose a size at the prefill (BlockPilot)
runs the prefill apart and each batch's loop at its rows' largest size (decoding/sized.py).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specblock_jax.decoding.compiled import compiled
from specblock_jax.decoding.job import MAX_STOP_TOKENS, JobSettings, Request, held
from specblock_jax.decoding.loop import DecodeLoop, decode_loop, finish_loop, make_loop
from specblock_jax.decoding.loop_core import LoopInputs, LoopOutput
from specblock_jax.decoding.refill import Finished, Stream, one_more_step, pack_rows, pow2_at_least
from specblock_jax.decoding.results import GenerationResult, GenerationStats
from specblock_jax.decoding.sized import settle
from specblock_jax.decoding.sizing import sizing_rows
from specblock_jax.decoding.step_costs import attach_costs
from specblock_jax.decoding.step_profile import draft_seconds_per_step, step_profile
from specblock_jax.drafters.base import DecodeAdapter, LoadedDrafter, conform
from specblock_jax.models.kv_cache import length_bucket
from specblock_jax.models.target import Target
from specblock_jax.parallel.decoding import DecodeLayout, run_sharded

OnBatch = Callable[[list[GenerationResult]], None]


def run_requests(target: Target, requests: Sequence[Request], drafter: LoadedDrafter | None, settings: JobSettings, *,
           adapter: Any = None, on_batch: OnBatch | None = None) -> list[GenerationResult]:
    """One result per request, in the order given (request i has index i). drafter None:
    target-only decoding. adapter and on_batch as `generate` takes them."""
    if any(r.index != i for i, r in enumerate(requests)):
        raise ValueError("run_requests: request i must have index i (job.renumber numbers a part of a job)")
    bsz = settings.batch_size or min(8, len(requests))
    refill = settings.refill
    if refill is None:
        refill = settings.mesh is None and len(requests) > bsz
    if adapter is not None:
        conform(adapter, DecodeAdapter, "adapter")
    d, dparams = drafter if drafter is not None else (None, ())  # make_loop tells the two apart
    if refill:
        if settings.mesh is not None:
            raise ValueError("refill: continuous batching does not run under a mesh yet; pass refill=False")
        return _decode_stream(target, requests, d, dparams, settings, bsz, adapter, on_batch)
    return _decode_batches(target, requests, d, dparams, settings, bsz, adapter, on_batch)


def _stop_array(settings: JobSettings) -> jax.Array:
    """[MAX_STOP_TOKENS] int32 stop ids, -1 padded."""
    return jnp.asarray(list(settings.stop_ids) + [-1] * (MAX_STOP_TOKENS - len(settings.stop_ids)), jnp.int32)


def two_tokens(inputs: LoopInputs) -> LoopInputs:
    """`compiled`'s warm-up inputs for a whole loop: every row's budget capped at two tokens, so
    each kernel runs once (decoding/compiled.py)."""
    return inputs._replace(budgets=jnp.minimum(inputs.budgets, 2))


def _decode_batches(target, requests, d, dparams, settings, bsz, adapter, on_batch) -> list[GenerationResult]:
    """Static batches of `bsz` rows, similar prompt lengths together; the last batch padded."""
    base_key = jax.random.key(settings.seed)
    stop_arr = _stop_array(settings)
    order = sorted(range(len(requests)), key=lambda i: len(requests[i].tokens))  # similar lengths share a batch
    results: list[GenerationResult | None] = [None] * len(requests)
    pad = list(requests) or [Request(0, [0], 1, 0.0, 0)]  # a host with no prompts still joins every batch
    params, layout = target.params, None
    if settings.mesh is not None:
        layout = DecodeLayout(settings.mesh, bsz or 1)
        bsz = layout.batch_size
        if jax.process_count() > 1:
            base_key = jax.random.fold_in(base_key, jax.process_index())
        params, dparams = layout.put(target.params), layout.put(dparams)
    max_new = max(r.budget for r in pad)  # static: one compilation serves every budget up to it
    num_batches = -(-len(order) // bsz) if bsz else 0
    if layout is not None:
        max_new, num_batches = layout.agree_max(max_new, num_batches)
    for start in range(0, num_batches * bsz, bsz):
        chunk = order[start:start + bsz]
        rows = [pad[i] for i in chunk + [chunk[0] if chunk else 0] * (bsz - len(chunk))]  # a fixed size
        greedy = all(r.temperature <= 0 for r in rows)
        bucket = length_bucket(max(len(r.tokens) for r in rows))
        if layout is not None:  # every host runs the same shapes
            greedy, bucket = layout.agree_all(greedy), layout.agree_max(bucket)[0]
        inputs = pack_rows([r.tokens for r in rows], [r.budget for r in rows], [r.temperature for r in rows],
                           [r.key for r in rows], bucket, base_key, settings.top_k, settings.top_p, stop_arr)
        loop = make_loop(graphdef=target.graphdef, cfg=target.config, drafter=d, prompt_len=bucket, max_new=max_new,
                         greedy=greedy, collect=adapter is not None)
        loop_dparams = adapter.params if adapter is not None else dparams
        loop = attach_costs(loop, params, loop_dparams, inputs)  # step sizing's cost model (measured once)
        sizes = None
        if layout is None and loop.sized:  # the prefill apart: its rows' sizes pick the loop (decoding/sized.py)
            ran, sizes, loop, compile_s, wall = _start_then_finish(loop, params, loop_dparams, inputs, rows)
            t0 = time.perf_counter()
        else:
            if layout is None:
                exe, compile_s = compiled(decode_loop, (loop,), params, loop_dparams, inputs,
                                          warm=lambda _: (params, loop_dparams, two_tokens(inputs)))
                args = (params, loop_dparams, inputs)
            else:
                args = (params, loop_dparams, layout.inputs(inputs))
                exe, compile_s = compiled(run_sharded, (layout.plan, decode_loop, loop), *args)
            t0 = time.perf_counter()
            ran = exe(*args)
        # the adapter's history and features stay on the device; the rest comes to the host
        if layout is None:
            host = jax.device_get(ran.without_labels())
        else:
            host = LoopOutput(*layout.outputs((ran.tokens, ran.generated, ran.stopped, ran.forwards)),
                              commits=None if ran.commits is None else layout.outputs((ran.commits,))[0])
        if sizes is None:
            wall = time.perf_counter() - t0
        else:
            wall += time.perf_counter() - t0
        call_s, prof = (None, None) if layout is not None else _profile(target, loop, dparams, adapter, inputs,
                                                                         settings.profile)
        event = None
        if adapter is not None:
            real = len(chunk)
            event = adapter.after_batch(
                ran.history, ran.hist_len, inputs.lengths, ran.features, real,
                tokens=int(sum(host.generated[:real]) - real), forwards=int(sum(host.forwards[:real])),
                decode_s=wall, budget=sum(requests[i].budget for i in chunk),
                remaining_budget=sum(requests[i].budget for i in held(order[start + bsz:], 0, settings.queue)))
        tallies = sizing_rows(loop, host.sizing, range(len(chunk)))
        for r, i in enumerate(chunk):
            new = host.tokens[r, :host.generated[r]].tolist()
            stats = row_stats(prompt_tokens=len(requests[i].tokens), new=new, forwards=int(host.forwards[r]),
                              stopped=bool(host.stopped[r]), draft_call_s=call_s, wall=wall, compile_s=compile_s,
                              batch_size=bsz, batch=start // bsz, event=event, batch_steps=int(np.max(host.forwards)),
                              block_size=None if sizes is None else int(sizes[r]),
                              commits=None if host.commits is None else host.commits[r], sizing=tallies[r])
            results[i] = _result(target, new, stats, prof, settings.profile, i)
        if on_batch is not None:
            on_batch([results[i] for i in chunk])
    return results  # type: ignore[return-value]


def _start_then_finish(loop, params, dparams, inputs: LoopInputs, rows: Sequence[Request]):
    """A sized drafter's static batch: the prefill (the loop's start, at the drafter's largest
    size), one host read of the rows' chosen sizes, then the decoding steps in the loop at the
    largest of them (decoding/sized.py). Returns (the loop's output on the device, sizes [B], the
    loop that ran, compile seconds, wall seconds so far without compilation)."""
    start_loop = loop.prefill_loop  # shared with refill's
    exe, compile_s = compiled(type(start_loop).start, (start_loop,), params, dparams, inputs, warm=lambda args: args)
    t0 = time.perf_counter()
    state = exe(params, dparams, inputs)
    state, sizes, loop = settle(loop, state, range(len(rows)), [r.tokens for r in rows], range(len(rows)))
    running = state
    exe, seconds = compiled(finish_loop, (loop,), params, dparams, state, inputs.stop_ids,
                            warm=lambda _: (params, dparams, one_more_step(running), inputs.stop_ids))
    ran = exe(params, dparams, state, inputs.stop_ids)
    return ran, sizes, loop, compile_s + seconds, time.perf_counter() - t0 - seconds


def _decode_stream(target, requests, d, dparams, settings, bsz, adapter, on_batch) -> list[GenerationResult]:
    """Continuous batching (decoding/refill.py): one stream of `bsz` rows, longest budget first."""
    bucket = length_bucket(max(len(r.tokens) for r in requests))
    max_new = max(r.budget for r in requests)
    loop = make_loop(graphdef=target.graphdef, cfg=target.config, drafter=d, prompt_len=bucket, max_new=max_new,
                     greedy=all(r.temperature <= 0 for r in requests), collect=adapter is not None, stream=True)
    stream = Stream(loop, target.params, dparams, batch_size=bsz, top_k=settings.top_k, top_p=settings.top_p,
                    stop_ids=_stop_array(settings), base_key=jax.random.key(settings.seed), bucket=length_bucket,
                    wake_rows=settings.refill_rows)
    queue = sorted(requests, key=lambda r: (-r.budget, len(r.tokens)))  # longest budget first
    first = stream.inputs(queue[:bsz], bsz)
    loop = stream.loop = attach_costs(loop, target.params, adapter.params if adapter is not None else dparams, first)
    call_s, prof = _profile(target, loop, dparams, adapter, first, settings.profile)
    results: list[GenerationResult | None] = [None] * len(requests)
    unfinished = {r.index for r in requests}

    def on_finished(finished: list[Finished], state, rows: list[int]) -> None:
        for f in finished:
            unfinished.discard(f.index)
        event = None
        if adapter is not None and finished:
            count = pow2_at_least(len(rows), bsz)  # gathered row counts are bucketed like inserts
            idx = jnp.asarray(rows + [rows[0]] * (count - len(rows)), jnp.int32)
            plen = [len(requests[f.index].tokens) for f in finished]
            plen = jnp.asarray(plen + [plen[0]] * (count - len(rows)), jnp.int32)
            event = adapter.after_batch(
                state.history[idx], state.hist_len[idx], plen, state.features[idx, :state.history.shape[1]],
                len(rows), tokens=sum(len(f.tokens) - 1 for f in finished), forwards=sum(f.forwards for f in finished),
                decode_s=finished[0].segment_wall_s, budget=sum(requests[f.index].budget for f in finished),
                remaining_budget=sum(r.budget for r in held([r for r in queue if r.index in unfinished], bsz,
                                                               settings.queue)))
        for f in finished:
            stats = row_stats(prompt_tokens=len(requests[f.index].tokens), new=f.tokens, forwards=f.forwards,
                              stopped=f.stopped, draft_call_s=call_s, wall=f.segment_wall_s,
                              compile_s=f.segment_compile_s, batch_size=bsz, batch=f.segment, event=event,
                              batch_steps=f.segment_steps, block_size=f.block_size, commits=f.commits,
                              sizing=f.sizing)
            results[f.index] = _result(target, f.tokens, stats, prof, settings.profile, f.index)
        if on_batch is not None and finished:
            on_batch([results[f.index] for f in finished])

    stream.run(queue, on_finished, adapter)
    return results  # type: ignore[return-value]


def _result(target, new: list[int], stats: GenerationStats, prof, profile: str, index: int) -> GenerationResult:
    text = target.tokenizer.decode(new, skip_special_tokens=True) if target.tokenizer else None
    if profile == "all" and prof is not None:
        stats.step_profile = dict(prof)
    return GenerationResult(text, new, stats, index)


def _profile(target, loop: DecodeLoop, dparams, adapter, inputs: LoopInputs, profile: str):
    """(seconds of one batched propose + update or None, the step profile or None) of the loop
    `loop` on `inputs`' rows; see `generate`'s profile."""
    if not loop.draft_phases and profile != "all":  # target-only: no drafting to time
        return 0.0, None
    if profile == "off":
        return None, None
    if adapter is not None:
        dparams = adapter.params
    prof = step_profile(loop, target.params, dparams, inputs,
                        phases=None if profile == "all" else ("propose", "update"))
    return draft_seconds_per_step(prof), prof


def row_stats(*, prompt_tokens: int, new: list[int], forwards: int, stopped: bool, draft_call_s: float | None,
              wall: float, compile_s: float, batch_size: int, batch: int, event: dict | None,
              batch_steps: int, block_size: int | None = None, commits=None,
              sizing: dict | None = None) -> GenerationStats:
    """One row's statistics. tau: tokens committed per decoding forward, bonus included (the
    prefill's token is not counted, nor is its forward); exactly 1 for autoregressive decoding.
    batch_steps: decoding steps its batch (or segment) ran. commits: the speculative loop's [N + 1]
    steps by the batch's most committed tokens (`commit_hist`)."""
    return GenerationStats(
        prompt_tokens=prompt_tokens, new_tokens=len(new), target_forwards=forwards + 1,
        tau=(len(new) - 1) / forwards if forwards else None, finish_reason="stop" if stopped else "length",
        draft_time_s=None if draft_call_s is None else forwards * draft_call_s, total_time_s=wall,
        compile_s=compile_s, batch_size=batch_size, batch=batch, adapt=event,
        batch_draft_time_s=None if draft_call_s is None else batch_steps * draft_call_s, batch_steps=batch_steps,
        block_size=block_size, commit_hist=None if commits is None else [int(x) for x in commits], sizing=sizing)
