"""`SpeculativeLoop`: draft, verify, accept, commit, all inside one `lax.while_loop`. Its twin
without a drafter is `TargetLoop` (decoding/autoregressive.py); `make_loop` (decoding/loop.py)
picks one of the two once.

Invariant between steps: the KV cache holds every committed token except the last one (the
root), whose K/V the next tree forward computes as node 0. Each step:
  1. the drafter proposes a tree of N nodes rooted at the root;
  2. one target forward over the N nodes under the tree's ancestor mask (positions = cache length
     + depth) computes their K/V, reading the cache only;
  3. verification picks the accepted path and a bonus token (greedy or rejection sampling);
  4. the cache gets the path's K/V (`KVCache.append`), the new tokens are appended, truncated at a stop
     token or the budget, and the bonus becomes the next root.

With `collect`, the loop also keeps the target's hidden states at the drafter's feature
layers for every committed position, gathered from the prefill and from each verification
forward's accepted path: free training labels for serving-time adaptation (no extra forward).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from specblock_jax.decoding.autoregressive import TargetState
from specblock_jax.decoding.loop_core import LoopInputs, LoopOutput, prefill, step_keys, until_done
from specblock_jax.decoding.sampling import SamplingParams, sampling_logprobs
from specblock_jax.decoding.sized import is_sized
from specblock_jax.decoding.sizing import (Calibration, SizingTally, calibrated, choose, draft_floor,
                                           expected_tokens, prune, raw_scores, recalibrate, root_only, skip_draft,
                                           to_full)
from specblock_jax.drafters.base import DraftContext, Prefill, advance_state
from specblock_jax.models.config import ModelConfig
from specblock_jax.models.kv_cache import KVCache, take_path
from specblock_jax.models.transformer import apply
from specblock_jax.parallel.activation import constrain_drafter_state
from specblock_jax.trees.tree import DraftTree, ancestor_mask, check_tree, depths
from specblock_jax.trees.verify import VerifyResult, verify_greedy, verify_sampling


class SpeculativeState(NamedTuple):
    """The loop's carry. Every field is per row ([B, ...]; the cache [L, B, ...]), so continuous
    batching can put a new request into one row (decoding/refill.py `put_rows`)."""
    step: jax.Array  # [B] int32 the row's decoding step (the prefill's token was step 0)
    root: jax.Array  # [B] int32 the last committed token (its K/V is not cached yet)
    generated: jax.Array  # [B] int32 new tokens so far
    out: jax.Array  # [B, max_new + N] int32 new tokens, -1 padded
    done: jax.Array  # [B] bool: stopped or out of budget
    stopped: jax.Array  # [B] bool: ended on a stop token
    cache: KVCache  # the target's cache: every committed token but the root
    history: jax.Array  # [B, S] int32 prompt + committed tokens
    hist_len: jax.Array  # [B] int32 valid history entries (the root included)
    drafter_state: Any  # the drafter's state (its own NamedTuple)
    forwards: jax.Array  # [B] int32 verification forwards while the row was running
    commits: jax.Array  # [B, N + 1] int32: steps the row ran, by the most tokens any row of the batch
    #                     committed in the step (a drafter's update that runs the rows committed
    #                     pays for that: SpecBlock's row switch; priced per bucket by the bench)
    features: jax.Array | None  # with collect: [B, S + N, n, H] hidden states of history positions
    budgets: jax.Array  # [B] int32 new-token limits
    sampling: SamplingParams  # [B] per-row settings
    keys: jax.Array  # [B] PRNG keys, one per request
    # step sizing (decoding/sizing.py), None with fixed sizes:
    calibration: Calibration | None = None  # the acceptance estimate's per-depth calibration
    tally: SizingTally | None = None  # chosen sizes, accepted drafts, expected tokens
    force: jax.Array | None = None  # [B] int32 a menu index the batch must run (max over rows), -1: choose


def write_rows(buf: jax.Array, rows: jax.Array, starts: jax.Array) -> jax.Array:
    """buf [B, L, ...], rows [B, N, ...] written at starts [B] (the caller leaves room:
    start + N <= L)."""
    def write(b, r, s):
        return jax.lax.dynamic_update_slice(b, r.astype(b.dtype), (s,) + (0,) * (b.ndim - 1))
    return jax.vmap(write)(buf, rows, starts)


class Committed(NamedTuple):
    """What `verify_commit` leaves for the rest of the step."""
    result: VerifyResult
    ctx: DraftContext  # the context after the commit (the drafter's `update` reads it)
    cache: KVCache | None  # the state's cache with the accepted path appended
    kept: tuple[jax.Array, jax.Array]  # (k, v) [L, B, M, K, D] the path's K/V (`KVCache.append`)
    out: jax.Array
    history: jax.Array
    hist_len: jax.Array
    generated: jax.Array
    done: jax.Array
    stopped: jax.Array


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpeculativeLoop:
    """Static settings of one speculative decode loop: frozen and hashable, so jit sees it as a
    static `self` and equal settings share one executable."""

    graphdef: Any
    """The target's nnx GraphDef."""
    cfg: ModelConfig
    """The target's config."""
    drafter: Any
    """A Drafter (drafters/base.py)."""
    cache_len: int
    """KV cache slots per row: >= P + max_new + N (N = drafter.num_nodes)."""
    max_new: int
    """The largest new-token budget of any row (one compilation serves every smaller one)."""
    greedy: bool = False
    """Every row's temperature is 0: greedy verification."""
    collect: bool = False
    """Keep the target's hidden states at the drafter's layers for every committed position
    (serving-time adaptation's free labels)."""
    hist_size: int = 0
    """S, the history's width: 0 = P + max_new + N of the rows started; a continuous-batching
    stream sets its prompt bucket's, so rows from shorter buckets fit."""
    sizes: tuple[int, ...] = ()
    """Step sizing's menu of node counts (decoding/sizing.py; 0 = no draft: a one-token step), or ()
    for fixed trees of N nodes."""
    step_ms: tuple[float, ...] = ()
    """The step-cost model: ms of one step at each size of the menu (decoding/step_costs.py);
    () until measured or priced: then every step verifies the whole tree (a skipped draft, its
    root) and only that size is compiled (the test suite's loops: tests/conftest.py)."""

    draft_phases: ClassVar[tuple[str, ...]] = ("propose", "update")  # the step profile's drafting phases
    profile_phases: ClassVar[tuple[str, ...]] = ("propose", "update", "tree_forward", "verify", "forward_1")

    @property
    def num_nodes(self) -> int:
        """N, the nodes of every draft tree."""
        return self.drafter.num_nodes

    @property
    def label(self) -> str:
        """What progress lines call the loop: its drafter's kind."""
        return getattr(self.drafter, "kind", type(self.drafter).__name__)

    @property
    def sized(self) -> bool:
        """Whether rows choose their size at the prefill (a `SizedDrafter`, decoding/sized.py)."""
        return is_sized(self.drafter)

    @property
    def prefill_loop(self) -> "SpeculativeLoop":
        """The loop whose `start` the prefill runs in: the prefill never verifies, so greedy and
        sampled loops of one shape share it (greedy=False)."""
        return dataclasses.replace(self, greedy=False)

    def forwards(self, state: SpeculativeState) -> jax.Array:
        """[B] verification forwards per row while it ran."""
        return state.forwards

    def commits(self, state: SpeculativeState) -> jax.Array:
        """[B, N + 1] the row's steps by the batch's most committed tokens (`SpeculativeState`)."""
        return state.commits

    def for_profile(self) -> "SpeculativeLoop":
        """The loop the step profile times: this one without the adapter's labels (collect) and
        with the default history width."""
        return dataclasses.replace(self, collect=False, hist_size=0)

    def target_state(self, state: SpeculativeState) -> TargetState:
        """The target-only loop's state at the same point (the step profile's forward_1 at this
        loop's cache)."""
        s = state
        out = jnp.full((s.out.shape[0], self.max_new), -1, jnp.int32)
        return TargetState(step=s.step, root=s.root, generated=s.generated, out=out, done=s.done, stopped=s.stopped,
                           cache=s.cache, budgets=s.budgets, sampling=s.sampling, keys=s.keys)

    def advance(self, state: SpeculativeState, offset: int) -> SpeculativeState:
        """The step profile's mid-decode state (decoding/step_profile.py): the history and the
        drafter state's committed length moved `offset` tokens on, as the cache is."""
        return state._replace(hist_len=state.hist_len + offset,
                              drafter_state=advance_state(state.drafter_state, offset))

    def tree_forward(self, params, tree: DraftTree, root, cache: KVCache):
        """Step 2: the target forward over the tree with `root` [B] written into node 0, hidden
        states at the drafter's layers. The cache is only read: the nodes' K/V come back as the
        output's `new_kv` (the commit appends the accepted path's). Returns (tree with the root,
        its ancestor mask [B, N, N] (built once; the verifier reuses it), the forward's
        ForwardOutput)."""
        tree = tree._replace(tokens=tree.tokens.at[:, 0].set(root))
        anc = ancestor_mask(tree.parents)
        positions = cache.lengths[:, None] + depths(anc)
        return tree, anc, apply(self.graphdef, params, tree.tokens, positions, anc, cache,
                                hidden_ids=tuple(self.drafter.hidden_ids), write_cache=False)

    def verify_commit(self, s: SpeculativeState, tree: DraftTree, anc, logits, new_kv, stop_ids,
                      key) -> Committed:
        """Steps 3-4 for the rows of state `s`: verification of the tree (with its ancestor mask
        [B, N, N] and the target's logits [B, N, V]; greedy, or rejection sampling with the step's
        keys [B]) and the commit: the state's cache gets the root's and the accepted path's K/V
        from the tree forward's new_kv [L, B, N, K, D] (inactive rows keep nothing), the new
        tokens are written, cut at a stop token or the budget."""
        n = tree.tokens.shape[1]
        active = ~s.done
        if self.greedy:
            res = verify_greedy(tree, logits, anc)
        else:
            logp = sampling_logprobs(logits, s.sampling)
            res = verify_sampling(tree, logp, step_keys(key, 2), self.drafter.max_children, anc)
        kept = take_path(new_kv, res.path)
        cache = s.cache.append(*kept, jnp.where(active, res.num_accepted + 1, 0))
        idx = jnp.arange(n)[None, :]
        count = res.num_accepted + 1
        is_stop = jnp.isin(res.new_tokens, stop_ids) & (idx < count[:, None])
        has_stop = jnp.any(is_stop, axis=1)
        upto = jnp.where(has_stop, jnp.argmax(is_stop, axis=1) + 1, count)
        room = s.budgets - s.generated
        take = jnp.where(active, jnp.minimum(upto, room), 0)
        out = write_rows(s.out, jnp.where(idx < take[:, None], res.new_tokens, -1), s.generated)
        history = write_rows(s.history, res.new_tokens, s.hist_len)
        hist_len = s.hist_len + take
        generated = s.generated + take
        hit = active & has_stop & (upto <= room)
        return Committed(result=res, ctx=DraftContext(history, hist_len, res.bonus, cache.lengths), cache=cache,
                         kept=kept, out=out, history=history, hist_len=hist_len, generated=generated,
                         done=s.done | hit | (generated >= s.budgets), stopped=s.stopped | hit)

    def start(self, params, drafter_params, inputs: LoopInputs) -> SpeculativeState:
        """The prefill and the drafter's first state: a `SpeculativeState` for the rows of
        inputs.tokens [B, P], with a history hist_size wide (0: P + max_new + N)."""
        tokens, lengths = inputs.tokens, inputs.lengths
        b, p = tokens.shape
        drafter, n = self.drafter, self.drafter.num_nodes
        hist_size = self.hist_size or p + self.max_new + n
        pre = prefill(self.graphdef, self.cfg, params, inputs, self.cache_len, self.max_new + n,
                      tuple(drafter.hidden_ids))
        dstate = drafter.init_state(drafter_params, Prefill(tokens, lengths, pre.hidden, pre.logits, pre.first),
                                    self.cache_len)
        dstate = constrain_drafter_state(dstate)  # its KV cache split as the target's, under a mesh
        history = jnp.zeros((b, hist_size), jnp.int32).at[:, :p].set(tokens)
        history = write_rows(history, pre.first[:, None], lengths)
        feats = None
        if self.collect:  # [B, S + N, n, H]: rows S.. are scratch that finished rows write into
            feats = jnp.zeros((b, hist_size + n) + pre.hidden.shape[2:], pre.hidden.dtype)
            feats = feats.at[:, :p].set(pre.hidden)
        one = jnp.ones((b,), jnp.int32)
        sizing = {}
        if self.sizes:
            sizing = dict(calibration=Calibration.zeros(b, n - 1), tally=SizingTally.zeros(b, len(self.sizes), n),
                          force=jnp.full((b,), -1, jnp.int32))
        return SpeculativeState(step=one, root=pre.first, generated=one, out=pre.out, done=pre.done,
                                stopped=pre.stopped, cache=pre.cache, history=history, hist_len=lengths + 1,
                                drafter_state=dstate, forwards=jnp.zeros((b,), jnp.int32),
                                commits=jnp.zeros((b, n + 1), jnp.int32), features=feats,
                                budgets=inputs.budgets, sampling=inputs.sampling, keys=inputs.keys, **sizing)

    def step(self, params, drafter_params, s: SpeculativeState, stop_ids) -> SpeculativeState:
        """One decoding step: propose, the tree forward (at the size step sizing chooses, with
        `sizes`), verify and commit, update."""
        drafter = self.drafter
        active = ~s.done
        ctx = DraftContext(s.history, s.hist_len, s.root, s.cache.lengths)
        key = step_keys(s.keys, s.step)
        if self.sizes:  # deeper levels only while some path is worth more than a level costs
            floor = draft_floor(self.costs(), max(drafter.forwards_per_step - 1, 1))
            ctx = ctx._replace(floor=jnp.where(jnp.max(s.force) >= 0, 0.0, floor))  # forced: draft all

        def propose():
            tree, dstate = drafter.propose(drafter_params, s.drafter_state, ctx, step_keys(key, 1))
            check_tree(tree, s.out.shape[0], drafter.num_nodes, self.cfg.vocab_size,
                       f"{type(drafter).__name__}.propose")
            if self.greedy:  # greedy verification never reads q: let XLA drop whatever built it
                tree = tree._replace(draft_probs=None)
            return tree, dstate

        sizing = {}
        if self.sizes:  # step sizing: a step may skip drafting (size 0), then verify a chosen size
            skip = skip_draft(s.calibration, active, self.costs(), float(self.num_nodes))
            force = jnp.max(s.force)
            skip = jnp.where(force >= 0, force == 0, skip)
            tree, dstate = jax.lax.cond(skip, lambda: (root_only(jax.eval_shape(propose)[0], s.root), s.drafter_state),
                                        propose)
            c, hidden, sizing = self.sized_verify(params, s, tree, stop_ids, key, skip)
        else:
            tree, dstate = propose()
            tree, anc, fwd = self.tree_forward(params, tree, s.root, s.cache)
            c, hidden = self.verify_commit(s, tree, anc, fwd.logits, fwd.new_kv, stop_ids, key), fwd.hidden
        feats = s.features
        if self.collect:  # the accepted path's hidden states, at the root's history position onward
            path_hidden = jnp.take_along_axis(hidden, c.result.path[:, :, None, None], axis=1)
            feats = write_rows(feats, path_hidden, jnp.where(active, s.hist_len - 1, s.history.shape[1]))
        dstate = constrain_drafter_state(drafter.update(drafter_params, dstate, c.ctx, c.result, hidden))
        most = jnp.max(jnp.where(active, c.cache.lengths - s.cache.lengths, 0))  # over the whole batch
        commits = s.commits + (active[:, None] & (jnp.arange(s.commits.shape[1]) == most)[None])
        return s._replace(step=s.step + active, root=c.result.bonus, generated=c.generated, out=c.out,
                          done=c.done, stopped=c.stopped, cache=c.cache, history=c.history,
                          hist_len=c.hist_len, drafter_state=dstate, forwards=s.forwards + active, commits=commits,
                          features=feats, **sizing)

    def costs(self) -> jax.Array:
        """[M] ms of a step at each menu size (1 each until measured: the largest useful size wins)."""
        return jnp.asarray(self.step_ms or (1.0,) * len(self.sizes), jnp.float32)

    def sized_verify(self, params, s: SpeculativeState, tree: DraftTree, stop_ids, key, skipped):
        """The tree forward, verification and commit at the size step sizing chooses
        (decoding/sizing.py): one `lax.switch` branch per menu size, each pruning the tree to its
        best nodes (size 0 when the step `skipped` drafting). Returns (the commit, with the
        result's path in the full tree's node indices and padded to N; the forward's hidden
        states [B, N, n, H] at those indices (zeros at nodes not verified), or None; the state's
        new sizing fields)."""
        b, n = tree.tokens.shape
        active = ~s.done
        anc = ancestor_mask(tree.parents)
        dep = depths(anc)
        raw = raw_scores(tree)
        p = calibrated(raw, dep, anc, s.calibration)
        expected = expected_tokens(p, self.sizes)  # [B, M]
        step_ms = self.costs()
        chosen = choose(expected, active, step_ms)
        force = jnp.max(s.force)
        chosen = jnp.where(force >= 0, jnp.minimum(force, len(self.sizes) - 1), chosen)
        chosen = jnp.where(skipped, 0, chosen)
        branches, index = self.sizes, chosen
        if not self.step_ms:  # no cost model: one branch, the whole tree (a skipped draft's root alone)
            chosen = jnp.where(skipped, 0, len(self.sizes) - 1).astype(jnp.int32)
            branches, index = self.sizes[-1:], 0

        def at_size(k):
            def run():
                sub, sel = prune(tree, p, k)
                sub, sub_anc, fwd = self.tree_forward(params, sub, s.root, s.cache)
                c = self.verify_commit(s, sub, sub_anc, fwd.logits, fwd.new_kv, stop_ids, key)
                res = c.result
                pad = ((0, 0), (0, n - sel.shape[1]))
                path = jnp.pad(jnp.take_along_axis(sel, res.path, axis=1), pad)
                new = jnp.pad(res.new_tokens, pad, constant_values=-1)
                # the cache is appended after the switch: a branch that returned it would copy it
                kept = tuple(jnp.pad(x, ((0, 0),) * 2 + pad[1:] + ((0, 0),) * 2) for x in c.kept)
                c = c._replace(result=res._replace(path=path, new_tokens=new), cache=None, kept=kept)
                hidden = None if fwd.hidden is None else to_full(fwd.hidden, sel, n, 0)
                return c, hidden, to_full(sub.valid, sel, n, False)
            return run

        c, hidden, verified = jax.lax.switch(index, [at_size(k) for k in branches])
        c = c._replace(cache=s.cache.append(*c.kept, c.ctx.cache_len - s.cache.lengths))
        res = c.result
        on_path = jnp.arange(n)[None, :] <= res.num_accepted[:, None]
        accepted = jnp.zeros((b, n), bool).at[jnp.arange(b)[:, None], res.path].max(on_path)
        t = s.tally
        pick = active[:, None] & (jnp.arange(len(self.sizes)) == chosen)[None]
        tally = SizingTally(
            chosen=t.chosen + pick,
            accepted=t.accepted + ((active & (chosen > 0))[:, None]
                                   & (jnp.arange(n + 1)[None] == res.num_accepted[:, None])),
            predicted=t.predicted + jnp.where(active, jnp.sum(jnp.where(pick, expected, 0.0), axis=1), 0.0))
        calibration = recalibrate(s.calibration, raw, dep, verified, accepted, active, ~skipped,
                                  res.num_accepted + 1, step_ms[chosen])
        return c, hidden, dict(calibration=calibration, tally=tally)

    def run(self, params, drafter_params, state: SpeculativeState, stop_ids: jax.Array,
            wake: jax.Array) -> SpeculativeState:
        """Decoding steps until every row is done, or, when wake > 0, until at least `wake` are."""
        return until_done(lambda s: self.step(params, drafter_params, s, stop_ids), state, wake)

    def output(self, state: SpeculativeState) -> LoopOutput:
        """The loop's outputs: tokens [B, max_new + N]; with collect also history [B, S], hist_len
        [B] and features [B, S, n, H] (the target's hidden states at `drafter.hidden_ids` for
        history positions < hist_len - 1)."""
        out = LoopOutput(tokens=state.out, generated=state.generated, stopped=state.stopped,
                         forwards=self.forwards(state), commits=self.commits(state), sizing=state.tally)
        if state.features is not None:
            return out._replace(history=state.history, hist_len=state.hist_len,
                                features=state.features[:, :state.history.shape[1]])
        return out

    def decode(self, params, drafter_params, inputs: LoopInputs) -> LoopOutput:
        """The whole loop: start, run until every row is done, output."""
        state = self.start(params, drafter_params, inputs)
        return self.output(self.run(params, drafter_params, state, inputs.stop_ids, jnp.int32(0)))
