"""Serving that is never slower than target-only: measure as the job runs, serve with the fastest.

    auto = sbj.decoding.AutoServe(drafter, budgets=(8, 16))      # or --method auto:DRAFTER_DIR
    results = sbj.generate(target, prompts, drafter=auto, batch_size=8)
    auto.events                                                 # one measurement per chunk

The options are target-only decoding ("ar") and speculation with the drafter at each tree budget
(the kind's budget knob: `num_nodes` for EAGLE-3, SpecBlock and prompt lookup, `block_size` for
DFlash; a kind without one, e.g. BlockPilot, is the single option "spec"). `serve` (what
`generate` calls with an AutoServe) decodes the job in chunks of requests (`chunk`, default two
batches), greedy and sampled requests apart (a temperature regime each: speculation pays very
differently in the two). Each chunk runs with one option, chosen by `choose`:
  1. every option once, target-only first, then the budgets from the smallest up (exploration); a
     budget larger than one that ran below `slow` x the fastest is not explored but waits as a
     slow option's re-check does (a larger tree rarely rescues a losing one on a compute-bound
     machine, and exploring it costs a whole chunk at its speed);
  2. then the fastest option: the best tokens/s pooled over its last `window` chunks (their new
     tokens over their seconds: steadier than a median of a few small chunks, whose speed varies
     with their prompts);
  3. re-checks, because speeds drift with the prompts and an option's first chunks may have been
     unlucky: each slower option is measured again once it is due. After each measurement that
     finds it slower, its wait grows: `recheck_every` chunks after the first, then twice as long
     each time, or four times when it ran below `slow` x the fastest's speed, so an option that
     clearly loses costs a few chunks per job rather than one in every `recheck_every`. An option
     that measures fastest becomes the one served and its wait starts over. Near the end of the
     queue (fewer than `recheck_every` chunks of the call's requests after it) a re-check is
     skipped: what it could find would serve too few chunks to pay for it. Like a server, it
     counts only the requests it holds, never work that may come in later calls: the call's, or
     with `generate(queue=N)` the chunk's and the next N waiting (a window under `recheck_every`
     chunks leaves no room for re-checks).
tokens/s = new tokens / decode-loop wall time of the chunk, compilation excluded; a chunk's
measurement therefore includes its prefills, refills and drafting. Every option is lossless, so
the outputs are the target's whichever is chosen: greedy outputs are token-identical to target-only
decoding, sampled ones follow the target's distribution (their random streams depend on the option
and the chunk, as they do on the method).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax

from specblock_jax.decoding.decode import OnBatch
from specblock_jax.decoding.drafter_arg import drafter_kind, resolve_drafter
from specblock_jax.decoding.job import DecodeOptions, Request, held, renumber
from specblock_jax.decoding.results import GenerationResult
from specblock_jax.decoding.routed import serve
from specblock_jax.drafters.base import LoadedDrafter

BUDGET_KNOB = {"eagle3": "num_nodes", "specblock": "num_nodes", "prompt_lookup": "num_nodes",
               "dflash": "block_size", "blockpilot": None}
REGIMES = ("greedy", "sampled")


@dataclasses.dataclass
class AutoServe:
    """Auto serving state for one drafter; reusable across `generate` calls (what it has measured
    carries over). drafter: a `LoadedDrafter`, a Drafter or "prompt_lookup"; budgets: tree budgets to
    try (the drafter's own is always one; None: its own and half of it); chunk: requests per
    decision (0 = two batches)."""

    drafter: Any
    budgets: tuple[int, ...] | None = ()
    chunk: int = 0
    recheck_every: int = 6
    window: int = 6  # chunks pooled into an option's speed
    slow: float = 0.8  # below this fraction of the fastest's speed, an option's wait grows 4x (else 2x)
    events: list[dict] = dataclasses.field(default_factory=list)
    # per (regime, option): (tokens, seconds) of every chunk it served
    runs: dict[tuple[str, Any], list[tuple[int, float]]] = dataclasses.field(default_factory=dict)
    wait: dict[tuple[str, Any], int] = dataclasses.field(default_factory=dict)  # chunks until its next re-check
    due: dict[tuple[str, Any], int] = dataclasses.field(default_factory=dict)  # chunk index of that re-check
    chunks: dict[str, int] = dataclasses.field(default_factory=dict)  # per regime, chunks served

    def __post_init__(self):
        self.loaded = resolve_drafter(self.drafter)
        d = self.loaded.drafter
        kind = drafter_kind(d)
        knob = BUDGET_KNOB.get(kind)
        if self.budgets and knob is None:
            raise ValueError(f"auto: a {kind} drafter has no tree budget to vary; give no budgets")
        self.knob = knob
        own = int(getattr(d, knob)) if knob else 0
        if self.budgets is None:
            self.budgets = (max(2, own // 2),) if knob else ()
        self.options = ["ar", *sorted({own, *map(int, self.budgets)})] if knob else ["ar", "spec"]
        if self.recheck_every < 2 or self.window < 1 or not 0 < self.slow <= 1:
            raise ValueError(f"auto: need recheck_every >= 2, window >= 1 and 0 < slow <= 1, got "
                             f"{self.recheck_every}, {self.window}, {self.slow}")

    def drafter_for(self, option) -> LoadedDrafter | None:
        """The drafter serving an option: None for "ar", else the drafter at that budget."""
        if option == "ar":
            return None
        d, params = self.loaded
        if option != "spec" and int(getattr(d, self.knob)) != option:
            d = dataclasses.replace(d, **{self.knob: option})
        return LoadedDrafter(d, params)

    def serve(self, target, requests: Sequence[Request], options: DecodeOptions,
              on_batch: OnBatch | None = None) -> list[GenerationResult]:
        """The requests in chunks per temperature regime, each decoded by the option `choose`
        picks and measured (module docstring); results in the requests' order."""
        n = len(requests)
        bsz = options.batch_size or min(8, max(n, 1))
        size = self.chunk or 2 * bsz
        profiled = set()  # each option's step is profiled in its first chunk only
        results: list[GenerationResult | None] = [None] * n
        batches = 0  # stats.batch numbers batches (or refill segments) across the whole job
        for r, regime in enumerate(REGIMES):
            idx = [i for i in range(n) if (requests[i].temperature <= 0) == (regime == "greedy")]
            for start in range(0, len(idx), size):
                part = idx[start:start + size]
                # the chunks queued: this one and those of the requests a server holding
                # `options.queue` waiting ones knows of
                option, why = self.choose(regime, remaining=-(-len(held(idx[start:], size, options.queue)) // size))
                # each chunk its own key streams: (seed, regime, chunk start) hashed into a seed
                key = jax.random.fold_in(jax.random.key(options.seed), 2 * start + r)
                chunk = dataclasses.replace(
                    options, seed=int(jax.random.randint(key, (), 0, 2**31 - 1)), batch_size=bsz,
                    profile="off" if (regime, option) in profiled else options.profile)
                out = serve(target, renumber(requests, part, keys=True), self.drafter_for(option), chunk)
                profiled.add((regime, option))
                # the decode loops' wall time (prefills and refills included, compilation excluded), not
                # the call's: step profiling (profile="all") runs outside the loops and must not count
                loop_s = sum({res.stats.batch: res.stats.total_time_s for res in out}.values())
                compile_s = sum({res.stats.batch: res.stats.compile_s for res in out}.values())
                event = self.record(regime, option, why, len(part), sum(res.stats.new_tokens for res in out),
                                    loop_s, compile_s)
                for i, res in zip(part, out):
                    res.stats.auto, res.stats.batch = event, res.stats.batch + batches
                    results[i] = GenerationResult(res.text, res.token_ids, res.stats, i)
                batches = 1 + max(results[i].stats.batch for i in part)
                if on_batch is not None:
                    on_batch([results[i] for i in part])
        return results  # type: ignore[return-value]

    def speed(self, regime: str, option) -> float | None:
        """Tokens/s pooled over the option's last `window` chunks (None: never measured)."""
        runs = self.runs.get((regime, option), [])[-self.window:]
        seconds = sum(s for _, s in runs)
        return sum(t for t, _ in runs) / seconds if seconds > 0 else (0.0 if runs else None)

    def fastest(self, regime: str):
        """The measured option with the best pooled speed (None before any measurement)."""
        measured = [o for o in self.options if (regime, o) in self.runs]
        return max(measured, key=lambda o: self.speed(regime, o)) if measured else None

    def choose(self, regime: str, remaining: int | None = None) -> tuple[Any, str]:
        """(option, why) for the next chunk of `regime`: "explore", "best" or "recheck".
        remaining: chunks of this regime queued, this one included (None: unknown); a re-check is
        skipped when fewer than `recheck_every` chunks would follow it."""
        n = self.chunks.get(regime, 0)
        for k, option in enumerate(self.options):
            if (regime, option) in self.runs or (regime, option) in self.due:
                continue
            smaller = self.options[k - 1] if k > 1 else None  # the next smaller budget
            if smaller is not None and (regime, smaller) in self.runs and self._losing(regime, smaller):
                # a larger tree than one already clearly losing: measured later, as a re-check
                self.wait[(regime, option)] = self.recheck_every * 4
                self.due[(regime, option)] = n + self.wait[(regime, option)]
                continue
            return option, "explore"
        best = self.fastest(regime)
        due = [o for o in self.options if o != best and self.due[(regime, o)] <= n]
        if due and (remaining is None or remaining - 1 >= self.recheck_every):
            return min(due, key=lambda o: self.due[(regime, o)]), "recheck"
        return best, "best"

    def _losing(self, regime: str, option) -> bool:
        """Whether the option ran below `slow` x the fastest option's speed."""
        return self.speed(regime, option) < self.slow * self.speed(regime, self.fastest(regime))

    def _reschedule(self, regime: str, option, before, n: int) -> None:
        """After chunk n served by `option` (`before`: the fastest until then): the fastest waits
        no more; a slower option just measured waits longer; one just overtaken waits
        `recheck_every` chunks."""
        best, key = self.fastest(regime), (regime, option)
        if option == best:
            self.wait[key] = self.recheck_every
            if before not in (None, best):
                self.wait[(regime, before)] = self.recheck_every
                self.due[(regime, before)] = n + 1 + self.recheck_every
            return
        grow = 4 if self._losing(regime, option) else 2
        prev = self.wait.get(key)
        self.wait[key] = self.recheck_every * grow if prev is None else prev * grow
        self.due[key] = n + 1 + self.wait[key]

    def record(self, regime: str, option, why: str, requests: int, tokens: int, seconds: float,
               compile_s: float) -> dict:
        """Logs one chunk's measurement; returns its event."""
        n = self.chunks.get(regime, 0)
        speed = tokens / seconds if seconds > 0 else 0.0
        before = self.fastest(regime)
        self.runs.setdefault((regime, option), []).append((tokens, seconds))
        self.chunks[regime] = n + 1
        self._reschedule(regime, option, before, n)
        event = {"chunk": n, "regime": regime, "option": option, "why": why, "requests": requests,
                 "tokens": tokens, "decode_s": round(seconds, 4), "compile_s": round(compile_s, 3),
                 "tokens_per_s": round(speed, 2),
                 "speeds": {str(o): self.speed(regime, o) for o in self.options},
                 "due": {str(o): self.due.get((regime, o)) for o in self.options}}
        self.events.append(event)
        return event

    def summary(self) -> dict:
        """Per regime: chunks served by each option and each option's median tokens/s."""
        out = {}
        for regime in REGIMES:
            served = [e["option"] for e in self.events if e["regime"] == regime]
            if served:
                out[regime] = {"chunks": {str(o): served.count(o) for o in self.options},
                               "tokens_per_s": {str(o): self.speed(regime, o) for o in self.options}}
        return out
