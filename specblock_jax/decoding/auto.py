"""Serving that is never slower than target-only: measure as the job runs, serve with the fastest.

    auto = sbj.decoding.AutoServe(drafter, budgets=(8, 16))      # or --method auto:DRAFTER_DIR
    results = sbj.generate(target, prompts, drafter=auto, batch_size=8)
    auto.events                                                 # one measurement per chunk

The options are target-only decoding ("ar") and speculation with the drafter at each tree budget
(the kind's budget knob: `num_nodes` for EAGLE-3, SpecBlock and prompt lookup, `block_size` for
DFlash; a kind without one, e.g. BlockPilot, is the single option "spec"). `generate` decodes the job in chunks of requests (`chunk`, default two batches), greedy
and sampled requests apart (a temperature regime each: speculation pays very differently in the
two). Each chunk runs with one option, chosen by `choose`:
  1. every option once, target-only first (exploration);
  2. then the option with the best median tokens/s over its last three chunks;
  3. every `recheck_every`-th chunk after that, the option measured longest ago (speeds drift
     with the prompts, and an option's first chunk may have been unlucky).
tokens/s = new tokens / decode-loop wall time of the chunk, compilation excluded; a chunk's
measurement therefore includes its prefills, refills and drafting. Every option is lossless, so
the outputs are the target's whichever is chosen: greedy outputs are token-identical to target-only
decoding, sampled ones follow the target's distribution (their random streams depend on the option
and the chunk, as they do on the method).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from specblock_jax.decoding.drafter_arg import drafter_kind, resolve_drafter

BUDGET_KNOB = {"eagle3": "num_nodes", "specblock": "num_nodes", "prompt_lookup": "num_nodes",
               "dflash": "block_size", "blockpilot": None}
REGIMES = ("greedy", "sampled")


@dataclasses.dataclass
class AutoServe:
    """Auto serving state for one drafter; reusable across `generate` calls (what it has measured
    carries over). drafter: a (Drafter, params) pair or "prompt_lookup"; budgets: tree budgets to
    try (the drafter's own is always one; None: its own and half of it); chunk: requests per
    decision (0 = two batches)."""

    drafter: Any
    budgets: tuple[int, ...] | None = ()
    chunk: int = 0
    recheck_every: int = 6
    events: list[dict] = dataclasses.field(default_factory=list)
    speeds: dict[tuple[str, Any], list[float]] = dataclasses.field(default_factory=dict)
    last_seen: dict[tuple[str, Any], int] = dataclasses.field(default_factory=dict)
    chunks: dict[str, int] = dataclasses.field(default_factory=dict)  # per regime, chunks served
    explored: dict[str, int] = dataclasses.field(default_factory=dict)  # per regime, chunk exploration ended

    def __post_init__(self):
        d, params = resolve_drafter(self.drafter)
        kind = drafter_kind(d)
        knob = BUDGET_KNOB.get(kind)
        if self.budgets and knob is None:
            raise ValueError(f"auto: a {kind} drafter has no tree budget to vary; give no budgets")
        self.spec, self.knob = (d, params), knob
        own = int(getattr(d, knob)) if knob else 0
        if self.budgets is None:
            self.budgets = (max(2, own // 2),) if knob else ()
        self.options = ["ar", *sorted({own, *map(int, self.budgets)})] if knob else ["ar", "spec"]
        if self.recheck_every < 2:
            raise ValueError(f"auto: recheck_every must be >= 2, got {self.recheck_every}")

    def drafter_for(self, option) -> Any:
        """What `generate` takes as `drafter` for an option: None for "ar", else the drafter at
        that budget."""
        if option == "ar":
            return None
        d, params = self.spec
        if option != "spec" and int(getattr(d, self.knob)) != option:
            d = dataclasses.replace(d, **{self.knob: option})
        return d, params

    def median_speed(self, regime: str, option) -> float | None:
        runs = self.speeds.get((regime, option))
        return statistics.median(runs[-3:]) if runs else None

    def choose(self, regime: str) -> tuple[Any, str]:
        """(option, why) for the next chunk of `regime`: "explore", "best" or "recheck"."""
        n = self.chunks.get(regime, 0)
        for option in self.options:
            if (regime, option) not in self.speeds:
                return option, "explore"
        best = max(self.options, key=lambda o: self.median_speed(regime, o))
        since = n - self.explored.setdefault(regime, n)
        if since % self.recheck_every == self.recheck_every - 1:
            stale = min((o for o in self.options if o != best), key=lambda o: self.last_seen[(regime, o)])
            return stale, "recheck"
        return best, "best"

    def record(self, regime: str, option, why: str, requests: int, tokens: int, seconds: float,
               compile_s: float) -> dict:
        """Logs one chunk's measurement; returns its event."""
        n = self.chunks.get(regime, 0)
        speed = tokens / seconds if seconds > 0 else 0.0
        self.speeds.setdefault((regime, option), []).append(speed)
        self.last_seen[(regime, option)] = n
        self.chunks[regime] = n + 1
        event = {"chunk": n, "regime": regime, "option": option, "why": why, "requests": requests,
                 "tokens": tokens, "decode_s": round(seconds, 4), "compile_s": round(compile_s, 3),
                 "tokens_per_s": round(speed, 2),
                 "medians": {str(o): self.median_speed(regime, o) for o in self.options}}
        self.events.append(event)
        return event

    def summary(self) -> dict:
        """Per regime: chunks served by each option and each option's median tokens/s."""
        out = {}
        for regime in REGIMES:
            served = [e["option"] for e in self.events if e["regime"] == regime]
            if served:
                out[regime] = {"chunks": {str(o): served.count(o) for o in self.options},
                               "tokens_per_s": {str(o): self.median_speed(regime, o) for o in self.options}}
        return out
