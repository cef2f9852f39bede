"""`generate`: batched decoding, autoregressive or speculative, prefill and the whole decode loop
in one jit.

Prompts are right-padded to a length bucket and the batch to a fixed size, so a job with many
prompts compiles once per (batch, prompt bucket, largest max_new_tokens, method). Every sequence
stops on its own (a stop token or its token budget); the loop ends when all have stopped.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specblock_jax.decoding.auto import AutoServe
from specblock_jax.decoding.autoregressive import ar_loop
from specblock_jax.decoding.compiled import compiled
from specblock_jax.decoding.drafter_arg import resolve_drafter
from specblock_jax.decoding.prefill import LoopOutput
from specblock_jax.decoding.refill import Finished, Request, Stream, pack_rows, pow2_at_least
from specblock_jax.decoding.results import GenerationResult, GenerationStats
from specblock_jax.decoding.routed import generate_routed, is_routing
from specblock_jax.decoding.speculative import spec_loop
from specblock_jax.decoding.step_profile import draft_seconds_per_step, step_profile
from specblock_jax.models.target import Target
from specblock_jax.parallel.decoding import DecodeLayout, run_sharded

MAX_STOP_TOKENS = 8
MIN_BUCKET = 16


def length_bucket(n: int, minimum: int = MIN_BUCKET) -> int:
    """Smallest power of two >= n (and >= minimum)."""
    return max(minimum, 1 << (max(n, 1) - 1).bit_length())


def cache_length(prompt_bucket: int, max_new_tokens: int, extra: int = 0) -> int:
    """Static cache size for a prompt bucket: room for the budget plus `extra` scratch slots,
    rounded up to a multiple of 64."""
    need = prompt_bucket + max_new_tokens + extra
    return -(-need // 64) * 64


def encode_prompts(target: Target, prompts: Sequence[str | Sequence[int]]) -> list[list[int]]:
    """Token ids per prompt; strings need the target's tokenizer. Errors name the prompt index."""
    ids = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if target.tokenizer is None:
                raise ValueError(f"prompt {i}: a text prompt needs a tokenizer; the target has none "
                                 "(pass token ids instead)")
            toks = list(target.tokenizer(prompt)["input_ids"])
        else:
            toks = [int(t) for t in prompt]
        if not toks:
            raise ValueError(f"prompt {i}: empty prompt")
        bad = [t for t in toks if not 0 <= t < target.config.vocab_size]
        if bad:
            raise ValueError(f"prompt {i}: token ids {bad[:5]} outside [0, {target.config.vocab_size})")
        ids.append(toks)
    return ids


def stop_token_ids(target: Target, extra: Sequence[int] = ()) -> list[int]:
    """The config's EOS ids, the tokenizer's EOS id and `extra`, deduplicated."""
    ids = list(target.config.eos_token_ids) + list(extra)
    tok = target.tokenizer
    if tok is not None and getattr(tok, "eos_token_id", None) is not None:
        ids.append(int(tok.eos_token_id))
    ids = list(dict.fromkeys(ids))
    if len(ids) > MAX_STOP_TOKENS:
        raise ValueError(f"at most {MAX_STOP_TOKENS} stop tokens are supported, got {ids}")
    return ids


def _per_prompt(value, n: int, name: str) -> list:
    if isinstance(value, (int, float)):
        return [value] * n
    value = list(value)
    if len(value) != n:
        raise ValueError(f"{name}: got {len(value)} values for {n} prompts")
    return value


def generate(
    target: Target,
    prompts: Sequence[str | Sequence[int]],
    drafter: Any = None,
    *,
    temperature: float | Sequence[float] = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    max_new_tokens: int | Sequence[int] = 256,
    seed: int = 0,
    stop_tokens: Sequence[int] = (),
    batch_size: int | None = None,
    max_cache_len: int | None = None,
    mesh: Any = None,
    adapter: Any = None,
    on_batch: Callable[[list[GenerationResult]], None] | None = None,
    profile: str = "off",
    refill: bool | None = None,
    refill_rows: int = 1,
    key_index: Sequence[int] | None = None,
) -> list[GenerationResult]:
    """Decodes every prompt (text or token ids) and returns one result per prompt, in order.

    drafter: None = target-only autoregressive decoding; "prompt_lookup"; a Drafter (see
    `specblock_jax.drafters`) or a (Drafter, params) pair: speculative decoding, whose output is
    token-identical to autoregressive decoding when greedy and distributed as the target's
    sampling distribution otherwise; an `AutoServe` (decoding/auto.py): chunks of the job served
    by target-only decoding or speculation at a few tree budgets, whichever measures fastest
    (each result's `stats.auto` is its chunk's event); a routing drafter (one with `route` and
    `for_group`, e.g. BlockPilot): each prompt is routed after a prefill and every group decoded by
    its own drafter and compiled loop (decoding/routed.py). Sampling with seed s gives each prompt
    its own key stream (fold_in(seed, key_index[i]), key_index defaulting to the prompt's
    position), so results do not depend on how prompts are batched; a caller that splits one job
    into several calls passes the prompts' positions in the whole job as key_index.
    batch_size: rows per compiled batch (the last batch is padded to it); default min(8, prompts).
    max_cache_len (default max_position_embeddings) bounds prompt + max_new_tokens.
    temperature and max_new_tokens may be given per prompt (sequences as long as `prompts`).
    mesh: None (one device) or a `jax.sharding.Mesh` ("data", "model"; see `specblock_jax.parallel`):
    each batch is split over "data", the target and its KV cache over "model"; outputs are
    token-identical. In a multi-host run every host calls `generate` with its own prompts (its
    `batch_size` rows join each global batch; hosts run in lockstep) and gets its own results;
    sampling keys then also fold in the process index. draft_time_s is None under a mesh.
    profile: how much of a decoding step to time apart (decoding/step_profile.py; not under a
    mesh): "off" (default) nothing (draft_time_s None for a drafter, 0 target-only); "draft" the
    drafter's propose and update, for draft_time_s = the row's steps x (one batched propose +
    update); "all" every phase, also attached to each result's stats (`stats.step_profile`, ms
    per phase). Profiling compiles and runs outside the timed decode loop (it is counted in
    neither total_time_s nor compile_s). With an `AutoServe`, only each option's first chunk per
    call is profiled.
    adapter: a `specblock_jax.adaptation.Adapter` built for this drafter: after every batch it
    learns from the verified tokens and may update the drafter's weights (the next batch drafts
    with them); outputs are unchanged. Each result's stats then carry its batch's "adapt" event.
    on_batch: called after every batch with that batch's results (e.g. to drive a progress bar;
    with refill, after every return of the loop with the requests that finished in it).
    refill: continuous batching (decoding/refill.py): a row whose request has finished takes the
    next waiting request (longest budget first) while the others keep decoding; outputs are
    unchanged. Default: on for jobs larger than one batch, off under a mesh (where it is not
    supported yet). With refill, a result's `stats.batch` numbers the loop's returns to the host
    (segments) and `total_time_s` is the wall time of the segment it finished in.
    refill_rows: with refill, the loop returns to the host once this many rows are free (while
    requests wait); 1 (default) refills every finished row at once, more means fewer returns and
    larger inserts for some idle row-steps (benchmarks/refill/ measures both).
    """
    if isinstance(drafter, AutoServe):
        if key_index is not None:
            raise ValueError("key_index: auto serving draws each chunk's keys itself; it takes no key_index")
        return _generate_auto(target, prompts, drafter, temperature=temperature, top_k=top_k, top_p=top_p,
                              max_new_tokens=max_new_tokens, seed=seed, stop_tokens=stop_tokens,
                              batch_size=batch_size, max_cache_len=max_cache_len, mesh=mesh, adapter=adapter,
                              on_batch=on_batch, profile=profile, refill=refill, refill_rows=refill_rows)
    if refill_rows < 1:
        raise ValueError(f"refill_rows must be >= 1, got {refill_rows}")
    spec = resolve_drafter(drafter)
    if profile not in ("off", "draft", "all"):
        raise ValueError(f"profile must be 'off', 'draft' or 'all', got {profile!r}")
    if adapter is not None:
        if spec is None or spec[0] is not adapter.drafter:
            raise ValueError("adapter: pass the drafter the adapter was built for as `drafter`")
        if mesh is not None:
            raise ValueError("adapter: serving-time adaptation does not run under a mesh yet")
    cfg = target.config
    limit = max_cache_len or cfg.max_position_embeddings
    ids = encode_prompts(target, prompts)
    budget = _per_prompt(max_new_tokens, len(ids), "max_new_tokens")
    temps = _per_prompt(temperature, len(ids), "temperature")
    key_ids = list(range(len(ids))) if key_index is None else [int(k) for k in key_index]
    if len(key_ids) != len(ids):
        raise ValueError(f"key_index: got {len(key_ids)} values for {len(ids)} prompts")
    for i, toks in enumerate(ids):
        if budget[i] < 1:
            raise ValueError(f"prompt {i}: max_new_tokens must be >= 1, got {budget[i]}")
        if len(toks) + budget[i] > limit:
            raise ValueError(f"prompt {i}: {len(toks)} prompt tokens + max_new_tokens={budget[i]} "
                             f"exceed the cache limit of {limit} tokens")
    if spec is not None and is_routing(spec[0]) and mesh is None and adapter is None:
        return generate_routed(generate, target, ids, spec, temps=temps, budget=budget, key_ids=key_ids,
                               batch_size=batch_size or max(1, min(8, len(ids))), bucket=length_bucket,
                               on_batch=on_batch, top_k=top_k, top_p=top_p, seed=seed, stop_tokens=stop_tokens,
                               max_cache_len=max_cache_len, profile=profile, refill=refill,
                               refill_rows=refill_rows)
    stops = stop_token_ids(target, stop_tokens)
    stop_arr = jnp.asarray(stops + [-1] * (MAX_STOP_TOKENS - len(stops)), jnp.int32)
    base_key = jax.random.key(seed)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths share a batch
    results: list[GenerationResult | None] = [None] * len(ids)
    bsz = batch_size or min(8, len(ids))
    layout = None
    if mesh is not None:
        layout = DecodeLayout(mesh, bsz or 1)
        bsz = layout.batch_size
        if jax.process_count() > 1:
            base_key = jax.random.fold_in(base_key, jax.process_index())
        if not ids:  # this host has no prompts but must join every batch: one padding row
            ids, budget, temps, key_ids = [[0]], [1], [0.0], [0]
        params = layout.put(target.params)
        if spec is not None:
            spec = (spec[0], layout.put(spec[1]))
    else:
        params = target.params
    max_new = max(budget)  # static: one compilation serves every budget up to it
    if refill is None:
        refill = mesh is None and len(ids) > bsz
    if refill:
        if mesh is not None:
            raise ValueError("refill: continuous batching does not run under a mesh yet; pass refill=False")
        _generate_stream(target, spec, ids, budget, temps, key_ids, top_k, top_p, bsz, max_new, stop_arr,
                         base_key, adapter, on_batch, profile, results, refill_rows)
        return results  # type: ignore[return-value]
    num_batches = -(-len(order) // bsz) if bsz else 0
    if layout is not None:
        max_new, num_batches = layout.agree_max(max_new, num_batches)
    for start in range(0, num_batches * bsz, bsz):
        chunk = order[start:start + bsz]
        rows = chunk + [chunk[0] if chunk else 0] * (bsz - len(chunk))  # pad to a fixed size
        greedy = all(temps[i] <= 0 for i in rows)
        bucket = length_bucket(max(len(ids[i]) for i in rows))
        if layout is not None:  # every host runs the same shapes
            greedy, bucket = layout.agree_all(greedy), layout.agree_max(bucket)[0]
        tokens, lengths, budgets, sampling, keys = pack_rows(
            [ids[i] for i in rows], [budget[i] for i in rows], [temps[i] for i in rows], [key_ids[i] for i in rows],
            bucket, base_key, top_k, top_p)
        inputs = (tokens, lengths, budgets, sampling, stop_arr, keys)
        if spec is None:
            cache_len = cache_length(bucket, max_new)
            fn, static = ar_loop, (target.graphdef, cfg, cache_len, max_new)
            args = (params, *inputs)
        else:
            d, dparams = spec
            if adapter is not None:
                dparams = adapter.params
            cache_len = cache_length(bucket, max_new, d.num_nodes)
            fn, static = spec_loop, (target.graphdef, cfg, d, cache_len, max_new, greedy, adapter is not None)
            args = (params, dparams, *inputs)
        if layout is not None:
            fn, static = run_sharded, (layout.plan, fn, *static)
            args = args[:-len(inputs)] + layout.inputs(*inputs)
        at = len(args) - len(inputs) + 2  # budgets' position: a warm-up run decodes two tokens per row
        warm = None if layout is not None else lambda a: (*a[:at], jnp.minimum(a[at], 2), *a[at + 1:])
        exe, compile_s = compiled(fn, static, *args, warm=warm)
        t0 = time.perf_counter()
        loop = exe(*args)
        # the adapter's history and features stay on the device; the rest comes to the host
        host = LoopOutput(*(jax.device_get(loop[:4]) if layout is None else layout.outputs(loop[:4])))
        wall = time.perf_counter() - t0
        call_s, prof = (None, None) if layout is not None else _profile(
            target, spec, adapter, profile, inputs, max_new, cache_len, greedy)
        event = None
        if adapter is not None:
            real = len(chunk)
            event = adapter.after_batch(
                loop.history, loop.hist_len, lengths, loop.features, real,
                tokens=int(sum(host.generated[:real]) - real), forwards=int(sum(host.forwards[:real])),
                decode_s=wall, budget=sum(budget[i] for i in chunk),
                remaining_budget=sum(budget[i] for i in order[start + bsz:]) + adapter.extra_budget)
        for r, i in enumerate(chunk):
            new = host.tokens[r, :host.generated[r]].tolist()
            text = target.tokenizer.decode(new, skip_special_tokens=True) if target.tokenizer else None
            stats = row_stats(len(ids[i]), new, int(host.forwards[r]), bool(host.stopped[r]), call_s, wall,
                              compile_s, bsz, start // bsz, event, int(np.max(host.forwards)))
            if profile == "all" and prof is not None:
                stats.step_profile = dict(prof)
            results[i] = GenerationResult(text, new, stats, i)
        if on_batch is not None:
            on_batch([results[i] for i in chunk])
    return results  # type: ignore[return-value]


def _generate_auto(target, prompts, auto: AutoServe, *, temperature, max_new_tokens, seed, batch_size,
                   adapter, on_batch, **kw) -> list[GenerationResult]:
    """`generate` with an AutoServe: the job in chunks per temperature regime, each decoded by
    the option `auto.choose` picks and measured (decoding/auto.py)."""
    if adapter is not None:
        raise ValueError("auto: serving-time adaptation does not combine with auto serving yet")
    n = len(prompts)
    temps = _per_prompt(temperature, n, "temperature")
    budget = _per_prompt(max_new_tokens, n, "max_new_tokens")
    bsz = batch_size or min(8, max(n, 1))
    size = auto.chunk or 2 * bsz
    profile, profiled = kw.pop("profile", "off"), set()  # each option's step is profiled in its first chunk only
    results: list[GenerationResult | None] = [None] * n
    batches = 0  # stats.batch numbers batches (or refill segments) across the whole job
    for r, regime in enumerate(("greedy", "sampled")):
        idx = [i for i in range(n) if (temps[i] <= 0) == (regime == "greedy")]
        for start in range(0, len(idx), size):
            part = idx[start:start + size]
            option, why = auto.choose(regime, remaining=-(-(len(idx) - start + auto.extra_requests) // size))
            # each chunk its own key streams: (seed, regime, chunk start) hashed into a seed
            chunk_seed = int(jax.random.randint(jax.random.fold_in(jax.random.key(seed), 2 * start + r), (), 0,
                                                2**31 - 1))
            out = generate(target, [prompts[i] for i in part], auto.drafter_for(option),
                           temperature=[temps[i] for i in part], max_new_tokens=[budget[i] for i in part],
                           seed=chunk_seed, batch_size=bsz,
                           profile="off" if (regime, option) in profiled else profile, **kw)
            profiled.add((regime, option))
            # the decode loops' wall time (prefills and refills included, compilation excluded), not
            # the call's: step profiling (profile="all") runs outside the loops and must not count
            loop_s = sum({res.stats.batch: res.stats.total_time_s for res in out}.values())
            compile_s = sum({res.stats.batch: res.stats.compile_s for res in out}.values())
            event = auto.record(regime, option, why, len(part), sum(res.stats.new_tokens for res in out),
                                loop_s, compile_s)
            for i, res in zip(part, out):
                res.stats.auto, res.stats.batch = event, res.stats.batch + batches
                results[i] = GenerationResult(res.text, res.token_ids, res.stats, i)
            batches = 1 + max(results[i].stats.batch for i in part)
            if on_batch is not None:
                on_batch([results[i] for i in part])
    return results  # type: ignore[return-value]


def _profile(target, spec, adapter, profile, inputs, max_new, cache_len, greedy):
    """(seconds of one batched propose + update or None, the step profile or None) for a batch of
    `inputs` (tokens, lengths, budgets, sampling, stop_ids, keys); see `generate`'s profile."""
    if spec is not None and profile == "off":
        return None, None
    if spec is None and profile != "all":
        return 0.0, None
    d, dparams = spec if spec is not None else (None, ())
    if adapter is not None:
        dparams = adapter.params
    tokens, lengths, budgets, sampling, stop_ids, keys = inputs
    prof = step_profile(target, d, dparams, tokens, lengths, max_new=max_new, cache_len=cache_len, greedy=greedy,
                        budgets=budgets, sampling=sampling, stop_ids=stop_ids, keys=keys,
                        phases=None if profile == "all" else ("propose", "update"))
    return draft_seconds_per_step(prof), prof


def _generate_stream(target, spec, ids, budget, temps, key_ids, top_k, top_p, bsz, max_new, stop_arr,
                     base_key, adapter, on_batch, profile, results, refill_rows) -> None:
    """`generate` with continuous batching: fills `results`."""
    d, dparams = spec if spec is not None else (None, ())
    bucket = length_bucket(max(len(t) for t in ids))
    cache_len = cache_length(bucket, max_new, 0 if d is None else d.num_nodes)
    greedy = all(t <= 0 for t in temps)
    order = sorted(range(len(ids)), key=lambda i: (-budget[i], len(ids[i])))  # longest budget first
    stream = Stream(target, target.params, d, dparams, batch_size=bsz, prompt_bucket=bucket, max_new=max_new,
                    cache_len=cache_len, greedy=greedy, collect=adapter is not None, top_k=top_k, top_p=top_p,
                    stop_ids=stop_arr, base_key=base_key, bucket=length_bucket, wake_rows=refill_rows)
    requests = [Request(i, ids[i], budget[i], temps[i], key_ids[i]) for i in order]
    first = requests[:bsz]
    tokens, lengths, budgets, sampling, keys = stream.inputs(first, bsz)
    call_s, prof = _profile(target, spec, adapter, profile, (tokens, lengths, budgets, sampling, stop_arr, keys),
                            max_new, cache_len, greedy)
    unfinished = set(order)

    def on_finished(finished: list[Finished], state, rows: list[int]) -> None:
        for f in finished:
            unfinished.discard(f.index)
        event = None
        if adapter is not None and finished:
            count = pow2_at_least(len(rows), bsz)  # gathered row counts are bucketed like inserts
            idx = jnp.asarray(rows + [rows[0]] * (count - len(rows)), jnp.int32)
            plen = jnp.asarray([len(ids[f.index]) for f in finished] + [len(ids[finished[0].index])] * (count - len(rows)),
                               jnp.int32)
            event = adapter.after_batch(
                state.history[idx], state.hist_len[idx], plen, state.features[idx, :state.history.shape[1]],
                len(rows), tokens=sum(len(f.tokens) - 1 for f in finished), forwards=sum(f.forwards for f in finished),
                decode_s=finished[0].segment_wall_s, budget=sum(budget[f.index] for f in finished),
                remaining_budget=sum(budget[i] for i in unfinished) + adapter.extra_budget)
        for f in finished:
            text = target.tokenizer.decode(f.tokens, skip_special_tokens=True) if target.tokenizer else None
            stats = row_stats(len(ids[f.index]), f.tokens, f.forwards, f.stopped, call_s, f.segment_wall_s,
                              f.segment_compile_s, bsz, f.segment, event, f.segment_steps)
            if profile == "all" and prof is not None:
                stats.step_profile = dict(prof)
            results[f.index] = GenerationResult(text, f.tokens, stats, f.index)
        if on_batch is not None and finished:
            on_batch([results[f.index] for f in finished])

    stream.run(requests, on_finished, adapter)


def row_stats(prompt_tokens: int, new: list[int], forwards: int, stopped: bool, draft_call_s: float | None,
              wall: float, compile_s: float, batch_size: int, batch: int, event: dict | None,
              batch_steps: int) -> GenerationStats:
    """One row's statistics. tau: tokens committed per decoding forward, bonus included (the
    prefill's token is not counted, nor is its forward); exactly 1 for autoregressive decoding.
    batch_steps: decoding steps its batch (or segment) ran."""
    return GenerationStats(
        prompt_tokens=prompt_tokens, new_tokens=len(new), target_forwards=forwards + 1,
        tau=(len(new) - 1) / forwards if forwards else None, finish_reason="stop" if stopped else "length",
        draft_time_s=None if draft_call_s is None else forwards * draft_call_s, total_time_s=wall,
        compile_s=compile_s, batch_size=batch_size, batch=batch, adapt=event,
        batch_draft_time_s=None if draft_call_s is None else batch_steps * draft_call_s, batch_steps=batch_steps)
