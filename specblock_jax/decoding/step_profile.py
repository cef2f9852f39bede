"""Step profile: what one decoding step costs, phase by phase, at the decode loop's exact shapes.

The loops run a whole step (draft, verify, commit) inside one fused executable, so no phase can be
timed inside it. Instead every phase is compiled alone (through `decoding/compiled.py`, so
compile counts stay tracked) for the loop's static shapes (batch B, prompt bucket P, cache_len,
N = drafter.num_nodes, the loop's `hidden_ids`) and timed as the median of `reps` calls after a
warm-up call:

    propose       drafter.propose: the tree of N nodes
    update        drafter.update after verification (SpecBlock's first block, EAGLE-3's pass over
                  the accepted tokens, DFlash's context K/V)
    tree_forward  the tree's ancestor mask and the target's forward over the N tree nodes under
                  it (positions = cache length + depth, hidden states at the drafter's layers),
                  as in the speculative loop
    verify        verification (greedy or rejection sampling, reusing that mask) + commit: the
                  cache `append`, the stop/budget bookkeeping and the out/history writes
    forward_1     one step of target-only decoding as in decoding/autoregressive.py: a one-token
                  forward, the cache advance, sampling and the output write (at the cache_len
                  given: for a speculative method, its own loop's)

The phases are the loops' own functions (`SpeculativeLoop.tree_forward`, `verify_commit` of
decoding/speculative.py, `TargetLoop.step` of decoding/autoregressive.py) on the loop itself,
so what is timed is what runs.

Inputs are realistic: the loop's real start (the prefill of the batch's prompt tokens and
`drafter.init_state`), a real
`propose` giving a real tree, a real tree forward and verification giving a real `VerifyResult`
and hidden states for `update`. Attention cost is meant to follow the current sequence length,
so every phase runs at a mid-decode length: the target cache lengths, the drafter state's
`length` (when the state has one), the history length and the step are advanced by
max_new // 2 committed tokens. Those extra entries are zeros: for timing only their count matters
(the data-dependent paths, such as rejection sampling's walk down the tree, run on the real tree
and logits). Every row is running (none done). Buffers the loop updates in place
(the KV cache, the drafter state, out/history) are donated, each timed call getting a fresh copy
made outside the timed region.

Results are cached per static key (and phase), so each batch shape is profiled once per process;
the phases' executables are released once timed (a long bench would otherwise exhaust XLA:CPU's
code memory).
`generate` uses the profile for `GenerationStats.draft_time_s` (propose + update per step) and,
with `profile="all"`, attaches it to every result (`stats.step_profile`); `specblock-bench`
derives its step columns and the ideal speedup from it.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specblock_jax.decoding.autoregressive import TargetLoop
from specblock_jax.decoding.compiled import cached_count, compiled, release
from specblock_jax.decoding.loop import DecodeLoop
from specblock_jax.decoding.loop_core import LoopInputs, step_keys
from specblock_jax.decoding.sampling import SamplingParams
from specblock_jax.decoding.speculative import SpeculativeLoop, SpeculativeState
from specblock_jax.drafters.base import DraftContext

PHASES = ("propose", "update", "tree_forward", "verify", "forward_1")
DRAFT_PHASES = ("propose", "update")
_MEASURED: dict = {}  # (static key, phase[, greedy]) -> seconds


# ------------------------------------------------------------------ the phases (pure functions)

def _context(s: SpeculativeState) -> DraftContext:
    return DraftContext(s.history, s.hist_len, s.root, s.cache.lengths)


def _propose(loop: SpeculativeLoop, drop_probs, params, state, ctx: DraftContext, key):
    tree, state = loop.drafter.propose(params, state, ctx, step_keys(key, 1))
    if drop_probs:  # as the loop: greedy verification never reads q, so XLA drops what built it
        tree = tree._replace(draft_probs=None)
    return tree, state


def _verify(loop: SpeculativeLoop, s: SpeculativeState, tree, anc, logits, new_kv, stop_ids):
    return loop.verify_commit(s, tree, anc, logits, new_kv, stop_ids, step_keys(s.keys, s.step))


def _verify_part(s: SpeculativeState) -> SpeculativeState:
    """The state without what verification does not read (the drafter state): donated whole, it
    then hands over only what the loop updates in place (the cache gets the accepted path)."""
    return s._replace(drafter_state=None)


def _update(loop: SpeculativeLoop, params, state, ctx, result, hidden):
    return loop.drafter.update(params, state, ctx, result, hidden)


def mid_decode_state(loop: DecodeLoop, params, dparams, inputs: LoopInputs):
    """The loop's real start, then every row advanced by max_new // 2 committed tokens (cache,
    history length, step, the drafter state's `length`; the new entries are zeros: contents do not
    matter for timing) and running. A `SpeculativeState`, or a `TargetState` target-only."""
    state = loop.start(params, dparams, inputs)
    offset = loop.max_new // 2
    running = jnp.zeros_like(state.done)
    state = state._replace(
        step=state.step + offset, cache=state.cache.advance(offset), done=running, stopped=running,
        generated=jnp.minimum(1 + offset, jnp.maximum(inputs.budgets - 1, 1)).astype(jnp.int32))
    return loop.advance(state, offset)  # the speculative loop's history and drafter state too


# ------------------------------------------------------------------ timing

def _copy(tree):
    return jax.tree.map(jnp.copy, tree)


def median_seconds(fn, *args, reps: int = 10, donated: Sequence[int] = ()) -> float:
    """Median wall time of fn(*args) over `reps` calls after one untimed warm-up (which compiles a
    jitted fn), each waited for with block_until_ready; the `donated` arguments are copied afresh
    (untimed) before each call."""
    def fresh():
        call = list(args)
        for i in donated:
            call[i] = _copy(args[i])
        return jax.block_until_ready(call)

    jax.block_until_ready(fn(*fresh()))
    times = []
    for _ in range(reps):
        call = fresh()
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*call))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _compiled(fn, static, *args, donate_argnums=()):
    with warnings.catch_warnings():  # e.g. donated lengths arrays that no output can reuse
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        return compiled(fn, static, *args, donate_argnums=donate_argnums)[0]


def default_inputs(tokens, lengths, *, max_new: int, greedy: bool = True) -> LoopInputs:
    """Loop inputs for a profile of tokens [B, P] (right-padded) with lengths [B]: budgets max_new,
    temperature 0 if greedy else 1, no stop tokens (8 x -1), keys from key 0."""
    tokens = jnp.asarray(tokens, jnp.int32)
    b = tokens.shape[0]
    return LoopInputs(tokens, jnp.asarray(lengths, jnp.int32), jnp.full((b,), max_new, jnp.int32),
                      SamplingParams.make(b, 0.0 if greedy else 1.0), jnp.full((8,), -1, jnp.int32),
                      jax.random.split(jax.random.key(0), b))


def step_profile(loop: DecodeLoop, params, drafter_params, inputs: LoopInputs, *,
                 phases: Sequence[str] | None = None, reps: int = 7) -> dict[str, Any]:
    """Times the phases of one decoding step (module docstring) of `loop`, on
    the rows of `inputs` (tokens [B, P] at the loop's prompt bucket P, as the loop gets them;
    `default_inputs` builds some).

    loop: a `TargetLoop` or `SpeculativeLoop` (its drafter, e.g. `PromptLookup()`, whose
    `propose`/`update` are nearly free but still timed; cache_len and max_new as the loop has
    them, `generate`: cache_length(P, max_new[, N]); greedy selects verify_greedy or
    verify_sampling; collect and hist_size are not used); params: the target's. phases: which of
    PHASES to time (default all; target-only runs only "forward_1").

    Returns {"<phase>_ms": median ms of one batched call, for each timed phase} plus the shape it
    was measured at: "batch", "prompt_len", "cache_len", "num_nodes" (0 target-only), "length"
    (committed tokens the cache holds beyond the prompt: max_new // 2), "reps".
    """
    b, p = inputs.tokens.shape
    wanted = tuple(PHASES if phases is None else phases)
    unknown = set(wanted) - set(PHASES)
    if unknown:
        raise ValueError(f"unknown phases {sorted(unknown)}; choose from {PHASES}")
    wanted = tuple(ph for ph in wanted if ph in loop.profile_phases)  # target-only: forward_1 alone
    greedy = getattr(loop, "greedy", False)
    loop = loop.for_profile()
    static_key = (loop.prefill_loop, b, p, reps)
    todo = [ph for ph in wanted if _lookup(static_key, ph, greedy) is None]
    if todo:  # the phases' executables are dropped once timed (only the timings are cached)
        mark = cached_count()
        try:
            _measure(loop, params, drafter_params, inputs, reps, static_key, todo)
        finally:
            release(mark)
    out: dict[str, Any] = {f"{ph}_ms": 1000 * _lookup(static_key, ph, greedy) for ph in wanted}
    out.update(batch=b, prompt_len=p, cache_len=loop.cache_len, num_nodes=loop.num_nodes, length=loop.max_new // 2,
               reps=reps)
    return out


def _lookup(static_key, phase, greedy) -> float | None:
    """A measured time or None. Verification differs between greedy and sampled decoding, and so
    does propose for a drafter whose trees carry draft probabilities (greedy decoding drops
    them); the other timings serve both (a new temperature costs no new profile of them)."""
    for key in ((static_key, phase), (static_key, phase, bool(greedy))):
        if key in _MEASURED:
            return _MEASURED[key]
    return None


def _measure(loop: DecodeLoop, params, dparams, inputs: LoopInputs, reps, static_key, todo) -> None:
    """Compiles each phase once; the drafter's phases run in loop order on the real state (propose
    -> tree forward -> verify -> update), each giving the next its real inputs, then each is timed."""
    s = _compiled(mid_decode_state, (loop,), params, dparams, inputs)(params, dparams, inputs)
    runs = []  # (phase, executable, args, donated)

    def run(phase, fn, static, args, donate):
        exe = _compiled(fn, static, *args, donate_argnums=donate)
        runs.append((phase, exe, args, donate))
        return exe(*(_copy(a) if i in donate else a for i, a in enumerate(args)))

    by_greedy = {"verify"}  # phases whose timing depends on greedy
    if set(todo) & set(DRAFT_PHASES + ("tree_forward", "verify")):  # the speculative loop's phases
        propose_args = (dparams, s.drafter_state, _context(s), step_keys(s.keys, s.step))
        shape = jax.eval_shape(lambda *a: _propose(loop, False, *a)[0], *propose_args)
        drop = loop.greedy and shape.draft_probs is not None
        if shape.draft_probs is not None:
            by_greedy.add("propose")
        tree, dstate = run("propose", _propose, (loop, drop), propose_args, (1,))
        tree, anc, fwd = run("tree_forward", SpeculativeLoop.tree_forward, (loop,), (params, tree, s.root, s.cache),
                             ())  # the cache is only read
        c = run("verify", _verify, (loop,), (_verify_part(s), tree, anc, fwd.logits, fwd.new_kv, inputs.stop_ids),
                (0, 4))
        if "update" in todo:
            run("update", _update, (loop,), (dparams, dstate, c.ctx, c.result, fwd.hidden), (1,))
    if "forward_1" in todo:
        target_loop = TargetLoop(graphdef=loop.graphdef, cfg=loop.cfg, cache_len=loop.cache_len, max_new=loop.max_new)
        run("forward_1", TargetLoop.step, (target_loop,), (params, (), loop.target_state(s), inputs.stop_ids), (2,))
    greedy = getattr(loop, "greedy", False)
    for phase, exe, args, donate in runs:
        if phase in todo:
            key = (static_key, phase, greedy) if phase in by_greedy else (static_key, phase)
            _MEASURED[key] = median_seconds(exe, *args, reps=reps, donated=donate)


# ------------------------------------------------------------------ derived numbers

def ideal_speedup(tau: float, forward_1_ms: float, tree_forward_ms: float, verify_ms: float) -> float:
    """tau x t(one-token step) / t(tree forward + verification and commit): the speedup over
    target-only decoding with free drafting (DESIGN.md, measurement protocol)."""
    return tau * forward_1_ms / (tree_forward_ms + verify_ms)


def draft_seconds_per_step(profile: dict) -> float:
    """propose + update of one batched step, in seconds (0 when the profile has neither)."""
    return (profile.get("propose_ms", 0.0) + profile.get("update_ms", 0.0)) / 1000


def step_ms(profile: dict) -> float:
    """One whole speculative step in ms: propose + update + tree forward + verify and commit."""
    return sum(profile[f"{ph}_ms"] for ph in PHASES if ph != "forward_1")
