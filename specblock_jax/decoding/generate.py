"""`generate`: batched decoding of a list of prompts, target-only or speculative.

It checks and encodes the prompts into `Request`s, gathers the call's settings into
`DecodeOptions` (decoding/job.py) and hands them to `decode` (decoding/decode.py: static batches or
a continuous-batching stream), or to auto serving's and routing's own serve functions, which call
`decode` for each part of the job (`AutoServe.serve`, decoding/auto.py; `serve_routed`,
decoding/routed.py).
"""

from __future__ import annotations

from typing import Any, Sequence

from specblock_jax.decoding.auto import AutoServe
from specblock_jax.decoding.decode import OnBatch
from specblock_jax.decoding.drafter_arg import resolve_drafter
from specblock_jax.decoding.job import DecodeOptions, make_requests, stop_token_ids
from specblock_jax.decoding.results import GenerationResult
from specblock_jax.decoding.routed import serve
from specblock_jax.models.target import Target


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
    on_batch: OnBatch | None = None,
    profile: str = "off",
    refill: bool | None = None,
    refill_rows: int = 1,
    key_index: Sequence[int] | None = None,
    queue: int = 0,
) -> list[GenerationResult]:
    """Decodes every prompt (text or token ids) and returns one result per prompt, in order.

    drafter: None = target-only autoregressive decoding; "prompt_lookup"; a Drafter (see
    `specblock_jax.drafters`) or a `LoadedDrafter` (a drafter with its weights, as `load_drafter`
    returns it): speculative decoding, whose output is token-identical to autoregressive decoding
    when greedy and distributed as the target's sampling distribution otherwise; an `AutoServe`
    (decoding/auto.py): chunks of the call served by target-only decoding or speculation at a few
    tree budgets, whichever measures fastest (each result's `stats.auto` is its chunk's event); a
    routing drafter (one with `route` and `for_group`, e.g. BlockPilot): each prompt is routed
    after a prefill and every group decoded by its own drafter and compiled loop
    (decoding/routed.py). Sampling with seed s gives each prompt its own key stream
    (fold_in(seed, key_index[i]), key_index defaulting to the prompt's position), so results do
    not depend on how prompts are batched; a caller that splits one job into several calls passes
    the prompts' positions in the whole job as key_index.
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
    with them); outputs are unchanged. It weighs an update against the work this call still holds
    (it is told nothing of later calls). Each result's stats then carry its batch's "adapt" event.
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
    queue: how many waiting requests the adapter and an `AutoServe` may count as work still to do
    (besides the rows in flight), as a server holding that many knows them; 0 (default): every
    request of the call. With queue > 0 their decisions do not depend on how large the call is
    beyond the requests it holds (tests/test_long_jobs.py).
    """
    options = DecodeOptions(top_k=top_k, top_p=top_p, seed=seed, stop_ids=stop_token_ids(target, stop_tokens),
                            batch_size=batch_size, mesh=mesh, profile=profile, refill=refill, refill_rows=refill_rows,
                            queue=queue)
    requests = make_requests(target, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                             key_index=key_index, limit=max_cache_len or target.config.max_position_embeddings)
    if isinstance(drafter, AutoServe):
        if key_index is not None:
            raise ValueError("key_index: auto serving draws each chunk's keys itself; it takes no key_index")
        if adapter is not None:
            raise ValueError("auto: serving-time adaptation does not combine with auto serving yet")
        return drafter.serve(target, requests, options, on_batch)
    loaded = resolve_drafter(drafter)
    if adapter is not None:
        if loaded is None or loaded.drafter is not adapter.drafter:
            raise ValueError("adapter: pass the drafter the adapter was built for as `drafter`")
        if mesh is not None:
            raise ValueError("adapter: serving-time adaptation does not run under a mesh yet")
    return serve(target, requests, loaded, options, adapter=adapter, on_batch=on_batch)
