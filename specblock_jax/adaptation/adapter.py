"""Serving-time drafter adaptation: a replay buffer of free labels, a jitted optax update of a
parameter subset, and a cost-aware controller deciding when to update.

    drafter = sbj.load_drafter("assets/drafters/eagle3", target)     # a LoadedDrafter
    adapter = Adapter(drafter, AdaptConfig(subset="layer"))
    results = sbj.generate(target, prompts, drafter=drafter, adapter=adapter)
    adapter.summary(); adapter.events     # decisions, time spent, predicted vs realised gains

After every decoded batch, `generate` hands the adapter the batch's committed tokens and the
target's hidden states at the drafter's feature layers (collected inside the decode loop from the
prefill and the verification forwards: no extra target forward). The adapter
  1. adds them to the replay buffer;
  2. once `eval_rows` rows have arrived since the last update (or at once, with
     `evaluate_on="unseen"`, on the newest buffered rows the update never drew, when there are
     `eval_rows` of them: no wait for fresh rows, which at batch 1 is `eval_rows` requests),
     scores the old and the new parameters on them, rows the update never saw, by replaying them through the drafter's real
     tree builder and the greedy acceptance rule (replay.py: the exact tau each weight set would
     have had on those sequences, no target forward), feeds the realised gain to the controller,
     and rolls the update back unless the gain is clearly positive: at least `keep_z` standard
     errors over those rows (`rollback`; on eight rows that error was 1-2.5% in the bench runs);
  3. with the last update evaluated, asks the controller (controller.py) whether one more update
     round pays over the work still queued (the requests of the `generate` call not yet served, or
     with `generate(queue=N)` the rows in flight and the next N; like a server, it is told nothing
     of later calls; `expect` > 0 also counts on as much again as it has served, for jobs of unknown
     length); if so runs `steps` optimizer steps (AdamW, gradient
     clipping) on rows sampled from the buffer, updating only the parameters under `subset`
     (with `max_steps`, rounds grow or shrink by the gain the last one realised per step against
     a step's measured cost). The first decision needs a round's cost: a calibration round
     measures it, unless a round of the same shape was measured before in this process or in
     `costs_file` (costs.py).
The target decides every committed token, so outputs do not depend on adaptation (greedy output
is identical; sampling keeps the target's distribution). The adapter's state (parameters, optimizer,
buffer, controller) lives as long as the object: reuse it across `generate` calls to persist,
make a new one to reset; `save_state` / `load_state` carry it across processes (a resumed
`specblock-decode --adapt` job continues adapting); `save` writes the adapted drafter folder.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from specblock_jax import overrides
from specblock_jax.adaptation import costs, persist
from specblock_jax.adaptation.buffer import ReplayBuffer
from specblock_jax.adaptation.controller import CostAwareController
from specblock_jax.adaptation.replay import buffer_spans, replay_tau
from specblock_jax.adaptation.objective import objective_for
from specblock_jax.decoding.compiled import compiled
from specblock_jax.drafters.base import LoadedDrafter


@dataclasses.dataclass(frozen=True)
class AdaptConfig:
    # weight path prefixes inside the drafter's weights, joined by "," or "+" ("layer" matches
    # "layer/..." and "layer_..."); "all"; or "auto": all but the LM head (`lm_head`), which cost
    # the most and helped the least in docs/adaptation.md's measurements
    subset: str = "auto"
    learning_rate: float = 3e-4
    steps: int = 8  # optimizer steps per update round
    depth: int = 2  # how far ahead the loss drafts (EAGLE-3 TTT steps, SpecBlock blocks; 0 = default)
    batch_rows: int = 4  # buffer rows per optimizer step
    eval_rows: int = 8  # fresh rows scoring old vs new parameters
    capacity: int = 64  # replay buffer rows
    window: int = 256  # positions kept per row (the last ones)
    # positions per training row (0 = the whole window): each optimizer step trains on a random crop
    # of this many positions of every drawn row, placed over its generated tokens; the main lever
    # on an update's cost for SpecBlock, whose training attention grows with the square of it
    train_window: int = 0
    min_rows: int = 4  # buffer rows before the first update
    cost_scale: float = 1.0  # update iff predicted saving > cost_scale * measured cost
    prior_gain: float = 0.1  # relative tau gain assumed of a first update (exploration)
    # the exploration term's factor for each judged round in a row that was not clearly positive
    # (controller.py): 0.5 halves it per rolled-back round; 1 keeps the old 1 / (1 + updates) decay
    backoff: float = 0.5
    # the controller's horizon is at least this many times the tokens served so far, not only the
    # queue's (controller.py): 1 for long jobs of unknown size, 0 counts only the work queued
    expect: float = 0.0
    # size each round by the gain its predecessor realised (controller.py, `next_steps`): 0 keeps
    # every round at `steps`; N > 0 lets rounds grow up to N optimizer steps (and shrink to 1)
    max_steps: int = 0
    # a JSON file keeping measured round costs across processes (adaptation/costs.py): a job whose
    # round shape was measured on this machine before starts from that cost, not a calibration
    costs_file: str = ""
    rollback: bool = True  # undo an update whose replayed gain on fresh rows is not clearly positive
    # an update is kept iff its replayed gain >= keep_z x the gain's standard error over the fresh
    # rows (0: kept unless it lowered tau); one-sided, so keep_z = 1 keeps an update that changes
    # nothing about one time in six
    keep_z: float = 1.0
    # which rows judge an update: "fresh" (the next `eval_rows` served after it) or "unseen" (at
    # once, the newest `eval_rows` buffered rows none of its steps drew; "fresh" when there are
    # fewer). Unseen rows are as unbiased for the round (it never trained on them) but older.
    evaluate_on: str = "fresh"
    seed: int = 0

    def __post_init__(self):
        if self.evaluate_on not in ("fresh", "unseen"):
            raise ValueError(f"adapt setting evaluate_on={self.evaluate_on!r}: use fresh or unseen")
        if self.max_steps < 0:
            raise ValueError(f"adapt setting max_steps={self.max_steps}: use 0 (fixed rounds) or a number >= 1")
        if self.keep_z < 0:
            raise ValueError(f"adapt setting keep_z={self.keep_z}: use a number >= 0")
        if not 0 <= self.backoff <= 1:
            raise ValueError(f"adapt setting backoff={self.backoff}: use a number in [0, 1]")
        if self.train_window < 0 or self.train_window == 1:
            raise ValueError(f"adapt setting train_window={self.train_window}: use 0 (the whole window) "
                             "or at least 2 positions")

    @classmethod
    def parse(cls, text: str) -> "AdaptConfig":
        """'key=value,...' (e.g. 'subset=layer+norm,cost_scale=0'); in `subset` use '+' between
        prefixes."""
        items = [i.replace("+", ",") if i.startswith("subset=") else i for i in filter(None, text.split(","))]
        return cls(**overrides.parse(items, "adapt setting", fields=cls))


def _path(key: tuple) -> str:
    return "/".join(str(k) for k in key)


def _merge(fixed, trainable: dict, paths: tuple) -> Any:
    """Full params: `fixed` (nested dicts) with the leaves at `paths` ((name, key tuple), ...)
    replaced by trainable[name]."""
    flat = traverse_util.flatten_dict(fixed)
    for name, key in paths:
        flat[key] = trainable[name]
    return traverse_util.unflatten_dict(flat)


def _part(params, prefix: tuple) -> Any:
    for k in prefix:
        params = params[k]
    return params


def crop_rows(tok, fea, valid, mask, length: int, key):
    """Random crops of `length` positions of buffer rows (tok/valid/mask [B, W], fea [B, W, n, H]),
    each over its row's scored positions: it starts at most a quarter crop before the first scored
    position and, where the row allows, ends at or after the last one. The crop's last position is
    unscored (its label, the next token, lies outside the crop)."""
    w = tok.shape[1]
    pos = jnp.arange(w)[None, :]
    scored = mask > 0
    first = jnp.min(jnp.where(scored, pos, w), axis=1)
    last = jnp.max(jnp.where(scored, pos, -1), axis=1)
    hi = jnp.clip(last + 2 - length, 0, w - length)  # the crop ends after the label of `last`
    lo = jnp.clip(first - length // 4, 0, hi)
    start = lo + jax.random.randint(key, lo.shape, 0, jnp.iinfo(jnp.int32).max) % (hi - lo + 1)
    take = lambda x: jax.vmap(lambda r, s: jax.lax.dynamic_slice_in_dim(r, s, length))(x, start)  # noqa: E731
    tok, fea, valid, mask = take(tok), take(fea), take(valid), take(mask)
    return tok, fea, valid, mask.at[:, -1].set(0)


def _update_round(objective, drafter, tx, paths, prefix, rows, depth, crop, trainable, fixed, opt_state,
                  data, size, steps, key):
    """`steps` (traced) optimizer steps, each on `rows` rows drawn uniformly from the filled buffer
    (cropped to `crop` positions when `crop` is less than the buffer's window). Returns (trainable,
    opt_state, the last loss, drawn [capacity] bool: the buffer rows some step drew)."""
    def one(i, carry):
        trainable, opt_state, _, drawn = carry
        k = jax.random.fold_in(key, i)
        idx = jax.random.randint(k, (rows,), 0, size)
        drawn = drawn.at[idx].set(True)
        tok, fea, valid, mask = (d[idx] for d in data)
        if crop < tok.shape[1]:
            tok, fea, valid, mask = crop_rows(tok, fea, valid, mask, crop, jax.random.fold_in(k, 2))

        def loss(tr):
            return objective(drafter, _part(_merge(fixed, tr, paths), prefix), fea, tok, mask, valid,
                             jax.random.fold_in(k, 1), depth)[0]

        value, grads = jax.value_and_grad(loss)(trainable)
        updates, opt_state = tx.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state, value, drawn

    drawn = jnp.zeros((data[0].shape[0],), bool)
    return jax.lax.fori_loop(0, steps, one, (trainable, opt_state, jnp.float32(0), drawn))


def _evaluate(drafter, vocab_size, paths, old, new, fixed, tok, fea, start, end):
    """Exact paired greedy replay of the `old` and `new` trainable parameters on the same served
    rows (adaptation/replay.py): ((steps [R], committed [R]) of old, the same of new)."""
    def run(trainable):
        return replay_tau(drafter, vocab_size, _merge(fixed, trainable, paths), tok, fea, start, end)

    return run(old), run(new)


def paired_gain(old: tuple, new: tuple) -> tuple[float, float, float, float]:
    """(tau old, tau new, gain, standard error) from per-row replays ((steps [R], committed [R])
    each, R distinct rows): tau = committed / steps summed over the rows, gain = tau new / tau old
    - 1, and the gain's standard error by the delta method for a ratio of paired sums, rows
    independent (0 for fewer than 2 rows)."""
    (s0, c0), (s1, c1) = ([np.asarray(x, np.float64) for x in pair] for pair in (old, new))
    n, sums = len(s0), [max(float(x.sum()), 1.0) for x in (s0, c0, s1, c1)]
    a, b = sums[1] / sums[0], sums[3] / sums[2]
    gain = b / a - 1.0
    if n < 2:
        return a, b, gain, 0.0
    # each row's share of log(tau new) - log(tau old), linearised
    z = c1 / sums[3] - s1 / sums[2] - c0 / sums[1] + s0 / sums[0]
    return a, b, gain, float((1 + gain) * np.sqrt(n / (n - 1) * np.sum((z - z.mean()) ** 2)))


class Adapter:
    """Per-job serving-time adaptation state for one drafter (see the module docstring)."""

    def __init__(self, loaded: LoadedDrafter, config: AdaptConfig = AdaptConfig(),
                 controller: CostAwareController | None = None):
        drafter, params = loaded
        # a drafter that wraps a trainable one (BlockPilot: its DFlash drafter) names it with
        # `adapt_part` = (path of its params, the inner drafter): updates train the inner weights
        # with the inner kind's objective; decoding and replay use the whole drafter
        self.prefix, self.inner = getattr(drafter, "adapt_part", ((), drafter))
        inner_params = _part(params, self.prefix) if isinstance(params, dict) else None
        if not isinstance(inner_params, dict) or "draft" not in inner_params:
            raise ValueError(f"drafter kind {type(drafter).__name__}: adaptation needs params with "
                             "trainable weights under 'draft'")
        self.drafter, self.config = drafter, config
        self.objective = objective_for(self.inner)
        self.vocab_size = int(inner_params["embed"].shape[0])  # the target's (its embedding's rows)
        weights = traverse_util.flatten_dict(inner_params["draft"])
        prefixes = [p.strip().strip("/") for p in config.subset.replace("+", ",").split(",") if p.strip()]
        if config.subset in ("all", "auto"):
            chosen = [k for k in weights if config.subset == "all" or k[0] != "lm_head"]
        else:
            chosen = [k for k in weights if any(
                _path(k) == p or _path(k).startswith((p + "/", p + "_")) for p in prefixes)]
        if not chosen:
            raise ValueError(f"adapt subset {config.subset!r} matches no drafter weight; weights: "
                             f"{sorted({_path(k).split('/')[0] for k in weights})}")
        self.paths = tuple((_path(("draft",) + k), self.prefix + ("draft",) + k) for k in chosen)
        self.trainable = {name: jnp.array(weights[k], copy=True) for (name, _), k in zip(self.paths, chosen)}
        self.fixed = params
        self.tx = optax.chain(optax.clip_by_global_norm(1.0),
                              optax.adamw(config.learning_rate, weight_decay=0.0))
        self.opt_state = self.tx.init(self.trainable)
        self.controller = controller or CostAwareController(config.cost_scale, config.prior_gain,
                                                                expect=config.expect, backoff=config.backoff)
        self.buffer: ReplayBuffer | None = None
        self.key = jax.random.key(config.seed)
        self.pending: tuple | None = None  # (old trainable, old optimizer state, event index)
        self.fresh: list[int] = []  # buffer slots filled since the last update
        self.events: list[dict] = []
        self.time_s = 0.0  # adaptation time outside compilation (buffer, evaluation, updates)
        self.compile_s = 0.0
        self.budget_seen = 0
        self.tokens_seen = 0
        self.drawn: np.ndarray | None = None  # [capacity] the buffer rows the last update round drew
        self.round_steps = config.steps  # the next round's optimizer steps (`max_steps` resizes it)
        self.step_s: float | None = None  # measured seconds of one optimizer step more in a round
        self.last_round: tuple[int, float] | None = None  # (steps, realised gain) of the last judged round

    @property
    def params(self) -> Any:
        """The drafter's decoding params with the current (adapted) weights."""
        return _merge(self.fixed, self.trainable, self.paths)

    @property
    def num_trainable(self) -> int:
        return sum(int(np.prod(x.shape)) for x in self.trainable.values())

    def _next_key(self) -> jax.Array:
        self.key, key = jax.random.split(self.key)
        return key

    def _run(self, fn, static, *args):
        exe, seconds = compiled(fn, static, *args)
        self.compile_s += seconds
        start = time.perf_counter()
        out = jax.block_until_ready(exe(*args))
        return out, time.perf_counter() - start

    def _update(self, steps: int | None = None, key: jax.Array | None = None):
        c = self.config
        crop = c.train_window if 0 < c.train_window < c.window else c.window
        static = (self.objective, self.inner, self.tx, self.paths, self.prefix, c.batch_rows, c.depth, crop)
        args = (self.trainable, self.fixed, self.opt_state, self.buffer.data,
                jnp.int32(self.buffer.size), jnp.int32(c.steps if steps is None else steps),
                self._next_key() if key is None else key)
        (trainable, opt_state, loss, drawn), seconds = self._run(_update_round, static, *args)
        self.drawn = np.asarray(drawn)
        return trainable, opt_state, float(loss), seconds

    def unseen_slots(self) -> list[int]:
        """Filled buffer slots the last update round never drew, newest first."""
        newest = [(self.buffer.next - 1 - i) % self.buffer.capacity for i in range(self.buffer.size)]
        return [s for s in newest if not self.drawn[s]]

    def _judge(self, slots, event: dict, update_event: dict) -> None:
        """Scores the pending update on the rows at `slots` (replayed old vs new), feeds the
        realised gain and the round's cost to the controller, and rolls the update back unless
        its gain clears `keep_z` standard errors; records the evaluation in `event`."""
        old, old_opt, _ = self.pending
        self.pending = None
        before, after, se, eval_s = self._evaluate(old, self.trainable, slots)
        realised = after / before - 1.0
        self.controller.observe_gain(realised, clear=realised >= self.config.keep_z * se)
        event.update(eval_tau_old=before, eval_tau_new=after, eval_gain_se=se, eval_s=eval_s)
        update_event["realised_gain"] = realised
        steps = update_event.get("steps", self.config.steps)
        self.last_round = (steps, realised)
        # the controller's estimate is of a round at the config's steps: a resized round's measured
        # cost less (or plus) its extra steps at the measured step cost
        extra = (steps - self.config.steps) * (self.step_s or 0.0)
        self.controller.observe_cost(max(update_event["update_s"] + eval_s - extra, 0.0))
        if self.config.rollback and realised < self.config.keep_z * se:
            self.trainable, self.opt_state = old, old_opt
            event["rolled_back"] = True

    def _evaluate(self, old, new, slots):
        """(tau old, tau new, the gain's standard error, seconds): the exact greedy replay of the
        rows at `slots` (`paired_gain`; rows repeated to the static `eval_rows` count once)."""
        c = self.config
        slots = list(dict.fromkeys(slots))[:c.eval_rows]
        distinct = len(slots)
        slots = np.resize(np.asarray(slots), c.eval_rows)  # static shape: repeat the fresh rows
        rows = self.buffer.rows(slots)
        start, end = buffer_spans(rows["valid"], rows["loss_mask"])
        args = (old, new, self.fixed, rows["tokens"], rows["hidden"], start, end)
        (a, b), seconds = self._run(_evaluate, (self.drafter, self.vocab_size, self.paths), *args)
        before, after, _, se = paired_gain(*(tuple(x[:distinct] for x in pair) for pair in (a, b)))
        return before, after, se, seconds

    def _calibrate(self, slots):
        """Times a round of one and of two optimizer steps and one evaluation on the buffer,
        discarding the results: the controller's first cost estimate, a round's fixed part plus
        `steps` x one step's increment plus the evaluation (compilation is excluded and reported
        apart; `steps` x a one-step round overstated it about 2x, counting the fixed part `steps`
        times). Every real update then measures the whole round. The calibration's rounds draw a
        fixed key, so the adapter's random stream is the same whether or not it calibrated (an
        adapter reusing a measured cost, `costs.lookup`, does not)."""
        key = jax.random.key(0)  # the adapter's own random stream does not depend on calibrating
        _, _, _, one_s = self._update(steps=1, key=key)
        _, _, _, two_s = self._update(steps=2, key=key)
        *_, eval_s = self._evaluate(self.trainable, self.trainable, slots)
        step_s = max(two_s - one_s, 0.0)
        cost = one_s + (self.config.steps - 1) * step_s + eval_s
        self.step_s = step_s
        self.controller.observe_cost(cost)
        return cost

    def cost_key(self) -> tuple:
        """What an update round's cost depends on: the drafter and its trained weights, the round's
        settings, the buffer's shapes and the backend (the key of `costs.MEASURED_COSTS`)."""
        c = self.config
        return (self.inner, self.paths, c.steps, c.batch_rows, c.depth, c.train_window, c.eval_rows,
                tuple((d.shape, str(d.dtype)) for d in self.buffer.data), jax.default_backend())

    def after_batch(self, history, hist_len, prompt_len, feats, num_rows: int, tokens: int,
                    forwards: int, decode_s: float, budget: int, remaining_budget: int) -> dict:
        """One decoded batch (the speculative loop's outputs with collect=True; its first
        `num_rows` rows are real): `tokens` committed in `forwards` verification forwards (summed over rows; the
        prefill's token excluded) in `decode_s` seconds, out of `budget` new-token budget;
        `remaining_budget`: the new-token budget of the requests the `generate` call still holds
        (what a server knows: its queue, not how much work will come after it). Returns the event."""
        start = time.perf_counter()
        compile_before = self.compile_s
        if self.buffer is None:
            self.buffer = ReplayBuffer(self.config.capacity, self.config.window, feats.shape[2],
                                       feats.shape[3], str(feats.dtype))
        slots = self.buffer.add(history, hist_len, prompt_len, feats, num_rows)
        self.compile_s += self.buffer.compile_s
        self.buffer.compile_s = 0.0
        event: dict[str, Any] = {"batch": len(self.events), "rows": num_rows, "tokens": tokens,
                                 "tau": tokens / forwards if forwards else None, "decode_s": decode_s}
        ctl = self.controller
        self.fresh.extend(int(x) for x in slots)
        if self.pending is not None and len(self.fresh) >= self.config.eval_rows:
            # score the last update on rows that arrived after it (it never trained on them); the
            # update's own event gets its realised gain, this one records the evaluation
            self._judge(self.fresh[-self.config.eval_rows:], event, self.events[self.pending[2]])
        ctl.observe_decoding(tokens, decode_s)
        self.budget_seen += budget
        self.tokens_seen += tokens + num_rows  # the prefill's token counts towards the budget
        fill = self.tokens_seen / max(self.budget_seen, 1)
        event["remaining_tokens"] = remaining_budget * fill
        event["update"] = False
        # decide only with data enough, work left, and the last update already evaluated
        if self.buffer.size >= self.config.min_rows and remaining_budget > 0 and self.pending is None:
            reused = costs.lookup(self.cost_key(), self.config.costs_file) if ctl.needs_cost() else None
            if reused is not None:
                event["calibration_reused_s"] = reused["cost_s"]
                ctl.observe_cost(reused["cost_s"])
                self.step_s = reused["step_s"]
            elif ctl.needs_cost():
                event["calibration_s"] = self._calibrate(self.fresh[-self.config.eval_rows:])
            c = self.config
            if c.max_steps > 0 and self.last_round is not None and self.step_s is not None:
                self.round_steps = ctl.next_steps(*self.last_round, self.step_s, event["remaining_tokens"],
                                                  c.max_steps)
                self.last_round = None  # resized once per judged round
            extra = (self.round_steps - c.steps) * (self.step_s or 0.0)
            decision = ctl.decide(event["remaining_tokens"], extra)
            event.update(update=decision.update, predicted_gain=decision.predicted_gain,
                         saving_s=decision.saving_s, cost_s=decision.cost_s, horizon_tokens=decision.remaining_tokens)
            if decision.update:
                self.pending = (self.trainable, self.opt_state, len(self.events))
                self.trainable, self.opt_state, loss, seconds = self._update(steps=self.round_steps)
                self.fresh = []
                event.update(update_s=seconds, loss=loss, steps=self.round_steps)
                unseen = self.unseen_slots() if self.config.evaluate_on == "unseen" else []
                if len(unseen) >= self.config.eval_rows:  # judged now, on rows the round never drew
                    event["evaluated_on"] = "unseen"
                    self._judge(unseen[:self.config.eval_rows], event, event)
        if ctl.cost_estimate is not None and self.buffer is not None and (
                costs.MEASURED_COSTS.get(self.cost_key(), {}).get("cost_s") != ctl.cost_estimate):
            costs.record(self.cost_key(), self.config.costs_file, ctl.cost_estimate, self.step_s or 0.0)
        elapsed = time.perf_counter() - start - (self.compile_s - compile_before)
        event["adapt_s"] = elapsed
        self.time_s += elapsed
        self.events.append(event)
        return event

    def summary(self) -> dict:
        """Updates made and declined, rollbacks, time spent, mean predicted vs realised gain."""
        decided = [e for e in self.events if "predicted_gain" in e]
        made = [e for e in decided if e["update"]]
        realised = [e["realised_gain"] for e in made if "realised_gain" in e]
        return {"batches": len(self.events), "decisions": len(decided), "updates": len(made),
                "declined": len(decided) - len(made),
                "rolled_back": sum(1 for e in self.events if e.get("rolled_back")),
                "adapt_time_s": self.time_s, "adapt_compile_s": self.compile_s,
                "trainable_params": self.num_trainable,
                "mean_predicted_gain": float(np.mean([e["predicted_gain"] for e in made])) if made else None,
                "mean_realised_gain": float(np.mean(realised)) if realised else None}

    def save_state(self, path: str) -> None:
        """Writes the whole adaptation state (weights, optimizer, buffer, controller, events) to
        folder `path`, atomically (adaptation/persist.py)."""
        persist.save_state(self, path)

    def load_state(self, path: str) -> None:
        """Continues from a state `save_state` wrote for this drafter and config."""
        persist.load_state(self, path)

    def save(self, out_dir: str) -> None:
        """Writes the adapted drafter as a normal drafter folder (loadable by `load_drafter`); for a
        wrapping drafter (BlockPilot) the adapted inner one (its DFlash drafter)."""
        from specblock_jax.drafters.io import save_drafter

        # with its reduced draft vocabulary, if any
        save_drafter(self.inner, _part(self.params, self.prefix), out_dir)
