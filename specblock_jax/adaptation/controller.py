"""The cost-aware controller: update the drafter only when the predicted saving over the work still
queued exceeds the measured cost of an update.

At each decision point (after a decoded batch) it has
  - seconds per committed token, measured on the batches decoded so far (decode loop wall time);
  - the tokens still queued: the budgets of the requests held and not yet served (as a server
    knows them: the current `generate` call's, nothing of later calls) times the observed fill
    ratio;
  - the cost of one update round in seconds, measured (a timed dry run before the first update,
    then every real update, each including its evaluation);
  - a predicted relative gain g of the acceptance length from one more update: the realised gains
    of earlier updates (measured on fresh data, old vs new parameters on the same rows), weighted
    towards the latest, plus an exploration term prior_gain / (1 + updates) that shrinks with
    every update made (a learning-curve estimate that starts optimistic), and by a further factor
    `backoff` for each round in a row whose gain was not clearly positive (below `keep_z` standard
    errors: the rounds the adapter rolls back); a clear gain resets the streak. With backoff < 1 a
    job whose updates keep realising nothing stops paying for them after a few rounds, where the
    1 / (1 + updates) decay alone kept a 100k-token job updating to its end (benchmarks/long_jobs).
More accepted tokens per target forward shorten every remaining step in proportion, so the saving
is horizon * s_per_token * g / (1 + g). The horizon is the tokens queued, or with `expect` > 0 at
least `expect` x the tokens served so far: a server does not know how long a job will go on, and
one that has served t tokens is as likely to serve more than t again as fewer (the median guess
for a duration seen only from its inside), so a long job keeps updating while a short one stops
early; with nothing queued there is no horizon. It updates iff saving > cost_scale * cost:
cost_scale = 0 always updates (while work remains), cost_scale = inf never does.

Round sizing (`next_steps`, with `AdaptConfig.max_steps`): the last judged round of s steps bought
a realised gain g, g / s per step; one more step would save horizon * s_per_token * g / s seconds
against its measured cost. The next round doubles (up to max_steps) while that saving is at least
twice a step's cost (the margin leaves room for diminishing returns), halves (down to 1) when it is
less than one step's cost, and keeps its size between. A round's predicted cost is the measured
cost at the config's steps plus the measured cost of each step more (or less).
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class Decision:
    update: bool
    predicted_gain: float  # relative tau gain expected from one update
    saving_s: float  # predicted seconds saved over the remaining work
    cost_s: float  # predicted seconds one update costs (before cost_scale)
    remaining_tokens: float  # the horizon: tokens the saving is counted over


@dataclasses.dataclass
class CostAwareController:
    cost_scale: float = 1.0
    prior_gain: float = 0.1
    recency: float = 0.5  # weight of the newest realised gain in the running estimate
    expect: float = 0.0  # the horizon is at least this many times the tokens served so far (0: the queue's)
    backoff: float = 1.0  # exploration factor per round in a row without a clear gain (1: none)

    def __post_init__(self):
        if self.cost_scale < 0 or self.prior_gain < 0 or self.expect < 0:
            raise ValueError(f"controller: cost_scale, prior_gain and expect must be >= 0, got "
                             f"{self.cost_scale}, {self.prior_gain} and {self.expect}")
        if not 0 <= self.backoff <= 1:
            raise ValueError(f"controller: backoff must be in [0, 1], got {self.backoff}")
        self.tokens = 0
        self.seconds = 0.0
        self.updates = 0
        self.unclear = 0  # judged rounds in a row whose gain was not clearly positive
        self.gain_estimate: float | None = None  # running estimate of realised gains
        self.cost_estimate: float | None = None

    def observe_decoding(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds

    def observe_cost(self, seconds: float) -> None:
        """Measured seconds of one update round (dry run or real, evaluation included)."""
        self.cost_estimate = seconds if self.cost_estimate is None else 0.5 * (self.cost_estimate + seconds)

    def observe_gain(self, realised: float, clear: bool | None = None) -> None:
        """Realised relative gain of the latest update (replayed tau new / old - 1 on fresh rows);
        `clear`: whether it cleared the keep threshold (None: not judged, the streak is unchanged)."""
        if clear is not None:
            self.unclear = 0 if clear else self.unclear + 1
        if self.gain_estimate is None:
            self.gain_estimate = realised
        else:
            self.gain_estimate = self.recency * realised + (1 - self.recency) * self.gain_estimate

    def needs_cost(self) -> bool:
        """Whether a decision wants the first cost estimate (a calibration round): not before a
        measurement exists, and never with cost_scale = inf, which declines whatever it costs."""
        return self.cost_estimate is None and self.cost_scale != math.inf

    def predicted_gain(self) -> float:
        known = max(self.gain_estimate, 0.0) if self.gain_estimate is not None else 0.0
        return known + self.prior_gain / (1 + self.updates) * self.backoff ** self.unclear

    def horizon(self, remaining_tokens: float) -> float:
        """The tokens a saving is counted over: the queue's, or at least `expect` x those served."""
        return max(remaining_tokens, self.expect * self.tokens) if remaining_tokens > 0 else 0.0

    def next_steps(self, last_steps: int, realised: float, step_s: float, remaining_tokens: float,
                   max_steps: int) -> int:
        """The next round's optimizer steps, sized by the gain the last round (of `last_steps`
        steps) realised against one step's measured cost `step_s` (module docstring)."""
        per_token = self.seconds / self.tokens if self.tokens else 0.0
        step_saving = self.horizon(remaining_tokens) * per_token * max(realised, 0.0) / last_steps
        if step_saving >= 2 * step_s:
            return min(2 * last_steps, max_steps)
        if step_saving < step_s:
            return max(last_steps // 2, 1)
        return last_steps

    def decide(self, remaining_tokens: float, extra_cost_s: float = 0.0) -> Decision:
        """Whether to update now, given the tokens the queue holds (module docstring);
        `extra_cost_s`: what this round costs over the measured one (a resized round's steps)."""
        gain = self.predicted_gain()
        per_token = self.seconds / self.tokens if self.tokens else 0.0
        horizon = self.horizon(remaining_tokens)
        saving = horizon * per_token * gain / (1 + gain)
        cost = max(self.cost_estimate + extra_cost_s, 0.0) if self.cost_estimate is not None else math.inf
        scaled = 0.0 if self.cost_scale == 0 else self.cost_scale * cost
        update = saving > scaled
        if update:
            self.updates += 1
        return Decision(update, gain, saving, cost, horizon)
