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
                  as in spec_loop
    verify        verification (greedy or rejection sampling, reusing that mask) + commit: the
                  cache `compact`, the stop/budget bookkeeping and the out/history writes
    forward_1     one step of target-only decoding as in decoding/autoregressive.py: a one-token
                  forward, the cache advance, sampling and the output write (at the cache_len
                  given: for a speculative method, its own loop's)

The phases are the loops' own functions (`tree_forward`, `verify_commit` of
decoding/speculative.py, `ar_step` of decoding/autoregressive.py), so what is timed is what runs.

Inputs are realistic: the real prefill of the batch's prompt tokens, `drafter.init_state`, a real
`propose` giving a real tree, a real tree forward and verification giving a real `VerifyResult`
and hidden states for `update`. Attention cost is meant to follow the current sequence length,
so every phase runs at a mid-decode length: the target cache lengths, the drafter state's
`length` (when the state has one), the history length and the `DraftContext` are advanced by
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
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specblock_jax.decoding.autoregressive import ar_step
from specblock_jax.decoding.compiled import cached_count, compiled, release
from specblock_jax.decoding.prefill import prefill, step_keys
from specblock_jax.decoding.sampling import SamplingParams
from specblock_jax.decoding.speculative import tree_forward, verify_commit, write_rows
from specblock_jax.drafters.base import DraftContext, Prefill
from specblock_jax.models.kv_cache import KVCache

PHASES = ("propose", "update", "tree_forward", "verify", "forward_1")
DRAFT_PHASES = ("propose", "update")
_MEASURED: dict = {}  # (static key, phase[, greedy]) -> seconds


# ------------------------------------------------------------------ the phases (pure functions)

class _MidDecode(NamedTuple):
    """The loop state at mid-decode, before the step's propose (see the module docstring)."""
    cache: KVCache  # the target cache (every committed token but the root)
    dstate: Any  # the drafter state (() target-only)
    ctx: DraftContext  # the context propose sees
    key: jax.Array  # [B] the step's keys
    out: jax.Array  # [B, max_new + N]
    history: jax.Array  # [B, S]
    generated: jax.Array  # [B]
    done: jax.Array  # [B] all False: every row running (the full batch's cost)


def _advance_state(state, offset):
    """The drafter state with its committed `length` advanced (states without one unchanged)."""
    if hasattr(state, "_replace") and hasattr(state, "length"):
        return state._replace(length=state.length + offset)
    return state


def _propose(drafter, drop_probs, params, state, ctx, key):
    tree, state = drafter.propose(params, state, ctx, step_keys(key, 1))
    if drop_probs:  # as spec_loop: greedy verification never reads q, so XLA drops what built it
        tree = tree._replace(draft_probs=None)
    return tree, state


def _update(drafter, params, state, ctx, result, hidden):
    return drafter.update(params, state, ctx, result, hidden)


def _setup(graphdef, cfg, drafter, cache_len, max_new, params, dparams, tokens, lengths, budgets, sampling,
           stop_ids, keys) -> _MidDecode:
    """The real prefill and `init_state`, then everything advanced by max_new // 2 committed
    tokens (zeros: contents do not matter for timing). drafter None: the target-only state."""
    b, p = tokens.shape
    n = drafter.num_nodes if drafter is not None else 0
    hidden_ids = tuple(drafter.hidden_ids) if drafter is not None else ()
    pre = prefill(graphdef, cfg, params, tokens, lengths, budgets, sampling, stop_ids, keys, cache_len,
                  max_new + n, hidden_ids)
    offset = max_new // 2
    cache = pre.cache.advance(offset)
    generated = jnp.minimum(1 + offset, jnp.maximum(budgets - 1, 1)).astype(jnp.int32)
    history = jnp.zeros((b, p + max_new + n), jnp.int32).at[:, :p].set(tokens)
    history = write_rows(history, pre.first[:, None], lengths)
    ctx = DraftContext(history, lengths + 1 + offset, pre.first, cache.lengths)
    dstate = ()
    if drafter is not None:
        dstate = drafter.init_state(dparams, Prefill(tokens, lengths, pre.hidden, pre.logits, pre.first), cache_len)
        dstate = _advance_state(dstate, offset)
    return _MidDecode(cache, dstate, ctx, step_keys(keys, 1 + offset), pre.out, history, generated,
                      jnp.zeros((b,), bool))


# ------------------------------------------------------------------ timing

def _copy(tree):
    return jax.tree.map(jnp.copy, tree)


def _time(exe, args: tuple, donated: Sequence[int], reps: int) -> float:
    """Median wall time of exe(*args) over `reps` calls after one warm-up; the donated arguments
    are copied afresh (untimed) before each call."""
    def fresh():
        call = list(args)
        for i in donated:
            call[i] = _copy(args[i])
        return jax.block_until_ready(call)

    jax.block_until_ready(exe(*fresh()))
    times = []
    for _ in range(reps):
        call = fresh()
        t0 = time.perf_counter()
        jax.block_until_ready(exe(*call))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _compiled(fn, static, *args, donate_argnums=()):
    with warnings.catch_warnings():  # e.g. donated lengths arrays that no output can reuse
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        return compiled(fn, static, *args, donate_argnums=donate_argnums)[0]


def step_profile(target, drafter, drafter_params, tokens, lengths, *, max_new: int, cache_len: int,
                 greedy: bool = True, budgets=None, sampling: SamplingParams | None = None, stop_ids=None,
                 keys=None, phases: Sequence[str] | None = None, reps: int = 7) -> dict[str, Any]:
    """Times the phases of one decoding step (module docstring) at the loop's shapes.

    target: a `Target`; drafter: None (target-only) or a Drafter (e.g. `PromptLookup()`, whose
    `propose`/`update` are nearly free but still timed) with its drafter_params; tokens [B, P]
    right-padded prompts (the loop's prompt bucket P) with lengths [B]; max_new and cache_len as
    the loop has them (`generate`: cache_length(P, max_new[, N])); greedy selects verify_greedy or
    verify_sampling; budgets [B] (default max_new), sampling (default temperature 0 if greedy
    else 1), stop_ids [S] (default 8 x -1) and keys [B] (default from key 0) as `generate` passes
    them. phases: which of PHASES to time (default all; target-only runs only "forward_1").

    Returns {"<phase>_ms": median ms of one batched call, for each timed phase} plus the shape it
    was measured at: "batch", "prompt_len", "cache_len", "num_nodes" (0 target-only), "length"
    (committed tokens the cache holds beyond the prompt: max_new // 2), "reps".
    """
    cfg = target.config
    tokens = jnp.asarray(tokens, jnp.int32)
    b, p = tokens.shape
    lengths = jnp.asarray(lengths, jnp.int32)
    budgets = jnp.full((b,), max_new, jnp.int32) if budgets is None else jnp.asarray(budgets, jnp.int32)
    sampling = sampling if sampling is not None else SamplingParams.make(b, 0.0 if greedy else 1.0)
    stop_ids = jnp.full((8,), -1, jnp.int32) if stop_ids is None else jnp.asarray(stop_ids, jnp.int32)
    keys = jax.random.split(jax.random.key(0), b) if keys is None else keys
    wanted = tuple(PHASES if phases is None else phases)
    unknown = set(wanted) - set(PHASES)
    if unknown:
        raise ValueError(f"unknown phases {sorted(unknown)}; choose from {PHASES}")
    if drafter is None:
        wanted = tuple(ph for ph in wanted if ph == "forward_1")
    n = drafter.num_nodes if drafter is not None else 0
    static_key = (cfg, drafter, b, p, cache_len, max_new, reps)
    todo = [ph for ph in wanted if _lookup(static_key, ph, greedy) is None]
    if todo:  # the phases' executables are dropped once timed (only the timings are cached)
        mark = cached_count()
        try:
            _measure(target, drafter, drafter_params, tokens, lengths, budgets, sampling, stop_ids, keys,
                     max_new, cache_len, bool(greedy), reps, static_key, todo)
        finally:
            release(mark)
    out: dict[str, Any] = {f"{ph}_ms": 1000 * _lookup(static_key, ph, greedy) for ph in wanted}
    out.update(batch=b, prompt_len=p, cache_len=cache_len, num_nodes=n, length=max_new // 2, reps=reps)
    return out


def _lookup(static_key, phase, greedy) -> float | None:
    """A measured time or None. Verification differs between greedy and sampled decoding, and so
    does propose for a drafter whose trees carry draft probabilities (greedy decoding drops
    them); the other timings serve both (a new temperature costs no new profile of them)."""
    for key in ((static_key, phase), (static_key, phase, bool(greedy))):
        if key in _MEASURED:
            return _MEASURED[key]
    return None


def _measure(target, drafter, dparams, tokens, lengths, budgets, sampling, stop_ids, keys, max_new, cache_len,
             greedy, reps, static_key, todo) -> None:
    """Compiles each phase once; the drafter's phases run in loop order on the real state (propose
    -> tree forward -> verify -> update), each giving the next its real inputs, then each is timed."""
    cfg, graphdef, params = target.config, target.graphdef, target.params
    dparams = () if drafter is None else dparams
    setup_args = (params, dparams, tokens, lengths, budgets, sampling, stop_ids, keys)
    s = _compiled(_setup, (graphdef, cfg, drafter, cache_len, max_new), *setup_args)(*setup_args)
    runs = []  # (phase, executable, args, donated)

    def run(phase, fn, static, args, donate):
        exe = _compiled(fn, static, *args, donate_argnums=donate)
        runs.append((phase, exe, args, donate))
        return exe(*(_copy(a) if i in donate else a for i, a in enumerate(args)))

    by_greedy = {"verify"}  # phases whose timing depends on greedy
    if drafter is not None and set(todo) & set(DRAFT_PHASES + ("tree_forward", "verify")):
        shape = jax.eval_shape(lambda *a: _propose(drafter, False, *a)[0], dparams, s.dstate, s.ctx, s.key)
        drop = greedy and shape.draft_probs is not None
        if shape.draft_probs is not None:
            by_greedy.add("propose")
        tree, dstate = run("propose", _propose, (drafter, drop), (dparams, s.dstate, s.ctx, s.key), (1,))
        tree, anc, fwd = run("tree_forward", tree_forward, (graphdef, tuple(drafter.hidden_ids)),
                             (params, tree, s.ctx.root, s.cache), (3,))
        c = run("verify", verify_commit, (greedy, drafter.max_children),
                (tree, anc, fwd.logits, fwd.cache, s.out, s.history, s.ctx.hist_len, s.generated,
                 s.done, s.done, budgets, sampling, stop_ids, s.key), (3, 4, 5))
        if "update" in todo:
            run("update", _update, (drafter,), (dparams, dstate, c.ctx, c.result, fwd.hidden), (1,))
    if "forward_1" in todo:
        out = jnp.full((tokens.shape[0], max_new), -1, jnp.int32)
        run("forward_1", ar_step, (graphdef, max_new),
            (params, s.ctx.root, s.cache, s.generated, out, s.done, s.done, budgets, sampling, stop_ids, s.key),
            (2, 4))
    for phase, exe, args, donate in runs:
        if phase in todo:
            key = (static_key, phase, greedy) if phase in by_greedy else (static_key, phase)
            _MEASURED[key] = _time(exe, args, donate, reps)


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
