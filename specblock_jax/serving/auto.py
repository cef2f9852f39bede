"""Serving that is never slower than target-only: measure as the job runs, serve with the fastest.

    auto = sbj.serving.AutoServe(drafter, budgets=(8, 16))      # or --method auto:DRAFTER_DIR
    results = auto.generate(target, prompts, options=sbj.DecodeOptions(batch_size=8))
    auto.events                                                 # one event per chunk

The options are target-only decoding ("ar") and speculation with the drafter at each tree budget
(the kind's `budget_knob` in its registry entry, e.g. `num_nodes` for a tree drafter; a kind
without one is the single option "spec"). `serve` (what `AutoServe.generate` calls) decodes the job in chunks of requests (`chunk`, default two
batches), greedy and sampled requests apart (a temperature regime each: speculation pays very
differently in the two). Every measurement is kept under its chunk's attention bucket
(`length_bucket` of the chunk's longest prompt: the prompt bucket its decode loops size their
caches by), and options are ranked on measurements in the current chunk's bucket: a chunk holding
a long prompt (slower per token whatever serves it) counts only against options measured in that
bucket. Each chunk's option is chosen by `choose`:
  1. exploration: an option with no measurement in the chunk's bucket and no re-check pending is
     explored there, target-only first, then the budgets from the smallest up; a budget larger
     than one that ran below `slow` x the bucket's fastest is not explored but waits as a slow
     option's re-check does (a larger tree rarely rescues a losing one on a compute-bound machine);
  2. then the fastest option: the best tokens/s pooled over its last `window` chunks in the bucket
     (their new tokens over their seconds); while no option has a measurement in the bucket, the
     fastest pooled over all buckets (its chunk is then the bucket's first measurement). An option
     with a re-check pending is not measured in a new bucket before its re-check;
  3. re-checks, because speeds drift with the prompts and an option's first chunks may have been
     unlucky: each slower option is measured again once it is due, in the bucket of the chunk it
     falls on. After each measurement that finds it slower, its wait grows: `recheck_every` chunks
     after the first, then twice as long each time, or four times when it ran below `slow` x the
     fastest's speed. An option that measures fastest becomes the one served and the one it
     overtook waits `recheck_every` chunks. Drift brings re-checks forward: when a chunk served as
     the fastest runs more than `drift` (relative) away from that option's speed pooled over its
     previous chunks in the bucket (at least two), every re-check due later than `recheck_every`
     chunks from now is brought to `recheck_every` chunks and its wait starts over (the speeds it
     was ranked on may no longer hold). Near the end of the queue (fewer than `recheck_every`
     chunks of the call's requests after it) a re-check is skipped. Like a server, it counts only
     the requests it holds: the call's, or with `DecodeOptions(queue=N)` the chunk's and the next N
     waiting (a window under `recheck_every` chunks leaves no room for re-checks).
Probes: an exploration or re-check of option X costs a probe, not a chunk, when another option B
is the bucket's fastest (or, with none measured there, the fastest overall) and a request of the
chunk may run past `probe_tokens` new tokens. The chunk then runs in segments, each on the requests
not yet finished (a stop token, or its max_new_tokens counted over all segments), each continuing
a request from its prompt + the tokens generated so far:
  a. X decodes at most `probe_tokens` new tokens per request;
  b. B decodes at most `probe_tokens` more (the paired measurement);
  c. B finishes them.
Segments a and b have one prefill per batch and a similar token count per request, on the same
requests, so the prefill (a large part of a short segment) weighs on both alike: X is credited
with B's pooled speed in the bucket x (X's tokens/s in a) / (B's in b); B's measurement is c (b
when nothing is left for c). Segments compile loops of their own shapes (compile time excluded).
tokens/s = new tokens / decode-loop wall time, compilation excluded; a chunk's measurement
therefore includes its prefills, refills and drafting. Lossless: every option is lossless from any
prefix. Greedy, each segment continues the target's argmax of the same prefix, so outputs are
token-identical to target-only decoding. Sampled, each segment draws from the target's distribution
given the prefix (fresh key streams per segment, independent of the earlier draws), so by the chain
rule the whole sequence follows the target's distribution whichever options serve the segments,
even though the option is chosen from measured speeds that depend on the tokens drawn so far; the
random streams depend on the options and chunks, as they do on the method.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple, Sequence

import jax

from specblock_jax.decoding.runner import OnBatch, run_requests
from specblock_jax.decoding.job import JobSettings, Request, held, prepare
from specblock_jax.decoding.options import DEFAULTS, DecodeOptions
from specblock_jax.decoding.results import GenerationResult
from specblock_jax.decoding.sampling import GREEDY, Sampling
from specblock_jax.drafters import registry
from specblock_jax.drafters.base import LoadedDrafter
from specblock_jax.models.kv_cache import MIN_BUCKET, length_bucket

REGIMES = ("greedy", "sampled")


class Probe(NamedTuple):
    """A probe chunk's measurements (module docstring): X's segment a, B's segments b and c."""
    tokens: int  # new tokens of segment a (X)
    seconds: float
    rest: Any  # B, the option that finished the chunk
    paired_tokens: int  # segment b (B)
    paired_s: float
    rest_tokens: int = 0  # segment c (B); 0 when nothing was left for it
    rest_s: float = 0.0


class Segment(NamedTuple):
    """One decode call of a chunk: its option and its batches' totals."""
    option: Any
    tokens: int
    seconds: float  # decode-loop wall time, its batches (or refill segments) counted once
    compile_s: float
    draft_s: float | None  # sum of its batches' batch_draft_time_s (None when one is None)
    steps: int | None  # sum of its batches' batch_steps


@dataclasses.dataclass
class AutoServe:
    """Auto serving state for one drafter; reusable across `generate` calls (what it has measured
    carries over). drafter: a `LoadedDrafter`; budgets: tree budgets to try (the drafter's own is always one; None: its own and half of it); chunk: requests per
    decision (0 = two batches)."""

    drafter: LoadedDrafter
    budgets: tuple[int, ...] | None = ()
    chunk: int = 0
    recheck_every: int = 6
    window: int = 6  # chunks pooled into an option's speed (per bucket)
    slow: float = 0.8  # below this fraction of the fastest's speed, an option's wait grows 4x (else 2x)
    probe_tokens: int = 16  # new tokens per request an exploration or re-check decodes (0: a whole chunk)
    drift: float = 0.2  # relative change of the served option's speed that brings re-checks forward
    events: list[dict] = dataclasses.field(default_factory=list)
    # per (regime, option): (bucket, tokens, seconds) of every measurement, in order
    runs: dict[tuple[str, Any], list[tuple[int, int, float]]] = dataclasses.field(default_factory=dict)
    wait: dict[tuple[str, Any], int] = dataclasses.field(default_factory=dict)  # chunks until its next re-check
    due: dict[tuple[str, Any], int] = dataclasses.field(default_factory=dict)  # chunk index of that re-check
    chunks: dict[str, int] = dataclasses.field(default_factory=dict)  # per regime, chunks served

    def __post_init__(self):
        if not isinstance(self.drafter, LoadedDrafter):
            raise TypeError(f"auto: drafter: expected a LoadedDrafter (got {type(self.drafter).__name__})")
        self.loaded = self.drafter
        d = self.loaded.drafter
        kind = registry.kind_of(d, required=False)
        knob = None if kind is None else kind.budget_knob
        if self.budgets and knob is None:
            raise ValueError(f"auto: a {getattr(d, 'kind', type(d).__name__)} drafter has no tree budget to vary; "
                             "give no budgets")
        self.knob = knob
        own = int(getattr(d, knob)) if knob else 0
        if self.budgets is None:
            self.budgets = (max(2, own // 2),) if knob else ()
        self.options = ["ar", *sorted({own, *map(int, self.budgets)})] if knob else ["ar", "spec"]
        if self.recheck_every < 2 or self.window < 1 or not 0 < self.slow <= 1:
            raise ValueError(f"auto: need recheck_every >= 2, window >= 1 and 0 < slow <= 1, got "
                             f"{self.recheck_every}, {self.window}, {self.slow}")
        if self.probe_tokens < 0 or self.drift <= 0:
            raise ValueError(f"auto: need probe_tokens >= 0 and drift > 0, got {self.probe_tokens}, {self.drift}")

    def drafter_for(self, option) -> LoadedDrafter | None:
        """The drafter serving an option: None for "ar", else the drafter at that budget."""
        if option == "ar":
            return None
        d, params = self.loaded
        if option != "spec" and int(getattr(d, self.knob)) != option:
            d = dataclasses.replace(d, **{self.knob: option})
        return LoadedDrafter(d, params)

    def generate(self, target, prompts, *, sampling: Sampling = GREEDY, max_new_tokens: int | Sequence[int] = 256,
                 seed: int = 0, options: DecodeOptions = DEFAULTS,
                 on_batch: OnBatch | None = None) -> list[GenerationResult]:
        """`sbj.generate`'s call served by auto serving: one result per prompt, in order; each
        result's `stats.auto` is its chunk's event. Chunks draw their own sampling keys, so
        `options.key_index` is refused."""
        if options.key_index is not None:
            raise ValueError("options: key_index: auto serving draws each chunk's keys itself; it takes none")
        requests, job = prepare(target, prompts, sampling=sampling, max_new_tokens=max_new_tokens, seed=seed,
                                options=options)
        return self.serve(target, requests, job, on_batch) if requests else []

    def serve(self, target, requests: Sequence[Request], settings: JobSettings,
              on_batch: OnBatch | None = None) -> list[GenerationResult]:
        """The requests in chunks per temperature regime, each decoded by the option `choose`
        picks (by a probe, then the fastest, for an exploration or re-check) and measured (module
        docstring); results in the requests' order."""
        n = len(requests)
        bsz = settings.batch_size or min(8, max(n, 1))
        size = self.chunk or 2 * bsz
        profiled: set = set()  # each option's step is profiled in its first segment only
        results: list[GenerationResult | None] = [None] * n
        batches = 0  # stats.batch numbers batches (or refill segments) across the whole job
        for r, regime in enumerate(REGIMES):
            idx = [i for i in range(n) if (requests[i].temperature <= 0) == (regime == "greedy")]
            for start in range(0, len(idx), size):
                part = idx[start:start + size]
                chunk = [requests[i] for i in part]
                bucket = length_bucket(max(len(q.tokens) for q in chunk))
                # the chunks queued: this one and those of the requests a server holding
                # `settings.queue` waiting ones knows of
                option, why = self.choose(regime, remaining=-(-len(held(idx[start:], size, settings.queue)) // size),
                                          bucket=bucket)
                rest = None if why == "best" else self.fastest(regime, bucket)
                cap = self.probe_tokens
                probing = cap > 0 and rest not in (None, option) and any(q.budget > cap for q in chunk)
                plan = [(option, cap), (rest, cap), (rest, None)] if probing else [(option, None)]
                # each chunk its own key streams: (seed, regime, chunk start) hashed into a seed
                key = jax.random.fold_in(jax.random.key(settings.seed), 2 * start + r)
                done, segs = self._segments(target, chunk, plan, key, settings, bsz, regime, profiled)
                tokens, seconds = sum(s.tokens for s in segs), sum(s.seconds for s in segs)
                compile_s = sum(s.compile_s for s in segs)
                if len(segs) == 1:  # one decode call served the chunk: its results as they are
                    event = self.record(regime, option, why, len(part), tokens, seconds, compile_s, bucket)
                    for i, outs in zip(part, done):
                        res = outs[0]
                        res.stats.auto, res.stats.batch = event, res.stats.batch + batches
                        results[i] = GenerationResult(res.text, res.token_ids, res.stats, i)
                    batches = 1 + max(results[i].stats.batch for i in part)
                else:  # a probe: each request's segments joined, the chunk counted as one batch
                    last = (segs[2].tokens, segs[2].seconds) if len(segs) > 2 else (0, 0.0)
                    probe = Probe(segs[0].tokens, segs[0].seconds, rest, segs[1].tokens, segs[1].seconds, *last)
                    event = self.record(regime, option, why, len(part), tokens, seconds, compile_s, bucket, probe)
                    for i, outs in zip(part, done):
                        results[i] = _joined(target, outs, segs, event, batches, i)
                    batches += 1
                if on_batch is not None:
                    on_batch([results[i] for i in part])
        return results  # type: ignore[return-value]

    def _segments(self, target, chunk: list[Request], plan, key, settings: JobSettings, bsz: int, regime: str,
                  profiled: set) -> tuple[list[list[GenerationResult]], list[Segment]]:
        """Decodes the chunk segment by segment (`plan`: (option, new-token cap per request or None)),
        each segment on the requests still unfinished, from prompt + their tokens so far. Returns
        each request's segment results and each segment that ran."""
        done: list[list[GenerationResult]] = [[] for _ in chunk]
        segs: list[Segment] = []
        for s, (option, cap) in enumerate(plan):
            todo = [j for j, q in enumerate(chunk) if not _finished(q, done[j])]
            if not todo:
                break
            seg_key = key if s == 0 else jax.random.fold_in(key, s)  # fresh key streams per segment
            seg = dataclasses.replace(settings, seed=int(jax.random.randint(seg_key, (), 0, 2**31 - 1)), batch_size=bsz,
                                      profile="off" if (regime, option) in profiled else settings.profile)
            out = run_requests(target, [_continued(chunk[j], done[j], cap, k) for k, j in enumerate(todo)],
                        self.drafter_for(option), seg)
            profiled.add((regime, option))
            for j, res in zip(todo, out):
                done[j].append(res)
            # the decode loops' wall time (prefills and refills included, compilation excluded), not
            # the call's: step profiling (profile="all") runs outside the loops and must not count
            per_batch = {res.stats.batch: res.stats for res in out}.values()
            drafts = [st.batch_draft_time_s for st in per_batch]
            steps = [st.batch_steps for st in per_batch]
            segs.append(Segment(option, sum(res.stats.new_tokens for res in out),
                                sum(st.total_time_s for st in per_batch), sum(st.compile_s for st in per_batch),
                                None if None in drafts else sum(drafts), None if None in steps else sum(steps)))
        return done, segs

    def speed(self, regime: str, option, bucket: int | None = None) -> float | None:
        """Tokens/s pooled over the option's last `window` measurements in `bucket` (None: in any
        bucket); None: never measured there."""
        runs = [(t, s) for b, t, s in self.runs.get((regime, option), []) if bucket is None or b == bucket]
        runs = runs[-self.window:]
        if not runs:
            return None
        seconds = sum(s for _, s in runs)
        return sum(t for t, _ in runs) / seconds if seconds > 0 else 0.0

    def fastest(self, regime: str, bucket: int | None = None):
        """The option with the best pooled speed in `bucket`, or over all buckets while none is
        measured in it (None before any measurement)."""
        for b in ((bucket, None) if bucket is not None else (None,)):
            measured = [o for o in self.options if self.speed(regime, o, b) is not None]
            if measured:
                return max(measured, key=lambda o: self.speed(regime, o, b))
        return None

    def choose(self, regime: str, remaining: int | None = None, bucket: int = MIN_BUCKET) -> tuple[Any, str]:
        """(option, why) for the next chunk of `regime` in attention bucket `bucket`: "explore",
        "best" or "recheck". remaining: chunks of this regime queued, this one included (None:
        unknown); a re-check is skipped when fewer than `recheck_every` chunks would follow it."""
        n = self.chunks.get(regime, 0)
        best = self.fastest(regime, bucket)
        for k, option in enumerate(self.options):
            key = (regime, option)
            if option == best or key in self.due or self.speed(regime, option, bucket) is not None:
                continue  # served anyway, waiting for its re-check, or measured in this bucket
            smaller = self.options[k - 1] if k > 1 else None  # the next smaller budget
            if smaller is not None and self.speed(regime, smaller, bucket) is not None \
                    and self._losing(regime, smaller, bucket):
                # a larger tree than one already clearly losing: measured later, as a re-check
                self.wait[key] = self.recheck_every * 4
                self.due[key] = n + self.wait[key]
                continue
            return option, "explore"
        due = [o for o in self.options if o != best and self.due.get((regime, o), math.inf) <= n]
        if due and (remaining is None or remaining - 1 >= self.recheck_every):
            return min(due, key=lambda o: self.due[(regime, o)]), "recheck"
        return best, "best"

    def _losing(self, regime: str, option, bucket: int) -> bool:
        """Whether the option ran below `slow` x the bucket's fastest option's speed."""
        fastest = self.speed(regime, self.fastest(regime, bucket), bucket)
        return self.speed(regime, option, bucket) < self.slow * fastest

    def _reschedule(self, regime: str, option, before, n: int, bucket: int) -> None:
        """After chunk n measured `option` in `bucket` (`before`: the bucket's fastest until then):
        the fastest waits no more; a slower option just measured waits longer; one just overtaken
        waits `recheck_every` chunks."""
        best, key = self.fastest(regime, bucket), (regime, option)
        if option == best:
            self.wait[key] = self.recheck_every
            if before not in (None, best):
                self.wait[(regime, before)] = self.recheck_every
                self.due[(regime, before)] = n + 1 + self.recheck_every
            return
        grow = 4 if self._losing(regime, option, bucket) else 2
        prev = self.wait.get(key)
        self.wait[key] = self.recheck_every * grow if prev is None else prev * grow
        self.due[key] = n + 1 + self.wait[key]

    def _drift(self, regime: str, option, bucket: int, speed: float, n: int) -> float | None:
        """A chunk served by the fastest at `speed`: its speed over the option's pooled speed in the
        bucket before it, minus 1 (None with fewer than two earlier measurements there). Beyond
        `drift`, every re-check due after chunk n + 1 + `recheck_every` is brought to it, its wait
        starting over at `recheck_every`."""
        earlier = [b for b, _, _ in self.runs.get((regime, option), []) if b == bucket]
        pooled = self.speed(regime, option, bucket)
        if len(earlier) < 2 or not pooled:
            return None
        change = speed / pooled - 1
        if abs(change) > self.drift:
            soon = n + 1 + self.recheck_every
            for o in self.options:
                if o != option and self.due.get((regime, o), -1) > soon:
                    self.due[(regime, o)], self.wait[(regime, o)] = soon, self.recheck_every
        return change

    def _probe_speed(self, regime: str, bucket: int, probe: Probe) -> float:
        """X's tokens/s from a probe: B's pooled speed in the bucket x X's tokens/s in segment a
        over B's in segment b (module docstring)."""
        if probe.seconds <= 0 or probe.paired_s <= 0 or probe.paired_tokens <= 0:
            return probe.tokens / probe.seconds if probe.seconds > 0 else 0.0
        ratio = (probe.tokens / probe.seconds) / (probe.paired_tokens / probe.paired_s)
        return ratio * self.speed(regime, probe.rest, bucket)

    def record(self, regime: str, option, why: str, requests: int, tokens: int, seconds: float,
               compile_s: float, bucket: int = MIN_BUCKET, probe: Probe | None = None) -> dict:
        """Logs one chunk (tokens and seconds: all of it) in its attention bucket; its measurement is
        the chunk's, or with a probe, X's probe speed and B's finishing segment. Returns its event."""
        n = self.chunks.get(regime, 0)
        speed = tokens / seconds if seconds > 0 else 0.0
        before = self.fastest(regime, bucket)
        drift = self._drift(regime, option, bucket, speed, n) if why == "best" and probe is None else None
        estimate = None
        if probe is None:
            self.runs.setdefault((regime, option), []).append((bucket, tokens, seconds))
        else:
            rest = (probe.rest_tokens, probe.rest_s) if probe.rest_tokens else (probe.paired_tokens, probe.paired_s)
            self.runs.setdefault((regime, probe.rest), []).append((bucket, *rest))
            estimate = self._probe_speed(regime, bucket, probe)
            self.runs.setdefault((regime, option), []).append(
                (bucket, probe.tokens, probe.tokens / estimate if estimate > 0 else math.inf))
        self.chunks[regime] = n + 1
        self._reschedule(regime, option, before, n, bucket)
        event = {"chunk": n, "regime": regime, "bucket": bucket, "option": option, "why": why,
                 "requests": requests, "tokens": tokens, "decode_s": round(seconds, 4),
                 "compile_s": round(compile_s, 3), "tokens_per_s": round(speed, 2),
                 "probe": None if probe is None else {
                     "rest": probe.rest, "tokens": probe.tokens, "decode_s": round(probe.seconds, 4),
                     "paired_tokens": probe.paired_tokens, "paired_s": round(probe.paired_s, 4),
                     "estimate": round(estimate, 2)},
                 "drift": None if drift is None else round(drift, 4),
                 "speeds": {str(o): self.speed(regime, o, bucket) for o in self.options},
                 "due": {str(o): self.due.get((regime, o)) for o in self.options}}
        self.events.append(event)
        return event

    def summary(self) -> dict:
        """Per regime: chunks each option was chosen for, probes, each option's tokens/s pooled over
        all buckets and per bucket."""
        out = {}
        for regime in REGIMES:
            mine = [e for e in self.events if e["regime"] == regime]
            if mine:
                served = [e["option"] for e in mine]
                buckets = sorted({e["bucket"] for e in mine})
                out[regime] = {"chunks": {str(o): served.count(o) for o in self.options},
                               "probes": sum(e["probe"] is not None for e in mine),
                               "tokens_per_s": {str(o): self.speed(regime, o) for o in self.options},
                               "by_bucket": {str(b): {str(o): self.speed(regime, o, b) for o in self.options}
                                             for b in buckets}}
        return out


def _finished(request: Request, outs: list[GenerationResult]) -> bool:
    """Whether a request's segments so far end it: a stop token, or its whole budget."""
    return bool(outs) and (outs[-1].stats.finish_reason == "stop"
                           or sum(len(o.token_ids) for o in outs) >= request.budget)


def _continued(request: Request, outs: list[GenerationResult], cap: int | None, k: int) -> Request:
    """The request continued after its segments `outs`: prompt + their tokens, the rest of its
    budget (at most `cap`), numbered k with key stream k in the segment's call."""
    made = [t for o in outs for t in o.token_ids]
    left = request.budget - len(made)
    return Request(k, list(request.tokens) + made, left if cap is None else min(left, cap), request.temperature, k)


def _joined(target, outs: list[GenerationResult], segs: list[Segment], event: dict, batch: int,
            index: int) -> GenerationResult:
    """One request's segments as one result: its tokens in order, its forwards and drafting time
    summed (tau counts each segment's prefill out), the chunk's loop time, compile time, steps and
    drafting time as its batch's (every request of a probe chunk shares one batch number)."""
    ids = [t for o in outs for t in o.token_ids]
    k, forwards = len(outs), sum(o.stats.target_forwards for o in outs)
    drafts = [o.stats.draft_time_s for o in outs]
    chunk_drafts, chunk_steps = [s.draft_s for s in segs], [s.steps for s in segs]
    stats = dataclasses.replace(
        outs[0].stats, new_tokens=len(ids), target_forwards=forwards,
        tau=(len(ids) - k) / (forwards - k) if forwards > k else None, finish_reason=outs[-1].stats.finish_reason,
        draft_time_s=None if None in drafts else sum(drafts), total_time_s=sum(s.seconds for s in segs),
        compile_s=sum(s.compile_s for s in segs), batch=batch,
        step_profile=max(outs, key=lambda o: o.stats.new_tokens).stats.step_profile,
        batch_draft_time_s=None if None in chunk_drafts else sum(chunk_drafts),
        batch_steps=None if None in chunk_steps else sum(chunk_steps), auto=event)
    tok = getattr(target, "tokenizer", None)
    return GenerationResult(tok.decode(ids, skip_special_tokens=True) if tok is not None else None, ids, stats, index)
