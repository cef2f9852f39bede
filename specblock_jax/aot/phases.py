"""The decode step's phases as pure functions of (static settings, abstract arguments), each the
library's own code: the loop's `start` (prefill), `TargetLoop.step` (target_step), `drafter.propose`,
`SpeculativeLoop.tree_forward`, `verify_commit`, `drafter.update` and `SpeculativeLoop.step`
(spec_step), as decoding/step_profile.py times them on a CPU. Every function takes `(loop, plan, ...)` static and
runs under the plan (`parallel.use_plan`), as `run_sharded` runs the loop. A step is priced, never
the whole `while_loop` (its trip count is data-dependent).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specblock_jax.decoding.autoregressive import TargetState
from specblock_jax.decoding.loop_core import LoopInputs, step_keys
from specblock_jax.decoding.sampling import SamplingParams
from specblock_jax.decoding.speculative import SpeculativeState
from specblock_jax.drafters.base import DraftContext
from specblock_jax.models.kv_cache import KVCache
from specblock_jax.parallel.activation import use_plan
from specblock_jax.parallel.mesh import ShardingPlan

PHASES = ("prefill", "target_step", "propose", "tree_forward", "verify_commit", "update", "spec_step",
          "train_step")
LAYER_PHASES = ("prefill", "target_step", "tree_forward", "spec_step", "train_step")  # run the target's layers
STOP_IDS = 8  # stop-token slots of LoopInputs.stop_ids


def context(s: SpeculativeState) -> DraftContext:
    return DraftContext(s.history, s.hist_len, s.root, s.cache.lengths)


def target_state(s: SpeculativeState, max_new: int) -> TargetState:
    """The target-only loop's state at the speculative state's point (target_step at that cache)."""
    out = jnp.full((s.out.shape[0], max_new), -1, jnp.int32)
    return TargetState(step=s.step, root=s.root, generated=s.generated, out=out, done=s.done, stopped=s.stopped,
                       cache=s.cache, budgets=s.budgets, sampling=s.sampling, keys=s.keys)


def prefill(loop, plan, params, dparams, inputs: LoopInputs):
    """The loop's start: the prompt forward (+ the drafter's first state). inputs.keys are raw
    key data [B, 2] (as `run_sharded` takes them)."""
    with use_plan(plan):
        return loop.start(params, dparams, inputs._replace(keys=jax.random.wrap_key_data(inputs.keys)))


def target_step(loop, plan, params, state: TargetState, stop_ids):
    with use_plan(plan):
        return loop.step(params, (), state, stop_ids)


def propose(loop, plan, dparams, dstate, ctx: DraftContext, keys, step):
    with use_plan(plan):
        tree, dstate = loop.drafter.propose(dparams, dstate, ctx, step_keys(step_keys(keys, step), 1))
        if loop.greedy:  # as the loop: greedy verification never reads q
            tree = tree._replace(draft_probs=None)
        return tree, dstate


def tree_forward_phase(loop, plan, params, tree, root, cache):
    with use_plan(plan):
        return loop.tree_forward(params, tree, root, cache)


def verify_phase(loop, plan, s: SpeculativeState, tree, anc, logits, new_kv, stop_ids):
    """`verify_commit` on a state without its drafter state, with the tree forward's new K/V."""
    with use_plan(plan):
        return loop.verify_commit(s, tree, anc, logits, new_kv, stop_ids, step_keys(s.keys, s.step))


def update(loop, plan, dparams, dstate, ctx, result, hidden):
    with use_plan(plan):
        return loop.drafter.update(dparams, dstate, ctx, result, hidden)


def spec_step_phase(loop, plan, params, dparams, s: SpeculativeState, stop_ids):
    with use_plan(plan):
        return loop.step(params, dparams, s, stop_ids)


def abstract_inputs(plan: ShardingPlan, batch: int, prompt: int) -> LoopInputs:
    """LoopInputs of ShapeDtypeStructs: rows split over "data" (when they divide), stop ids
    replicated, keys as raw key data [B, 2]."""
    def rows(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=plan.batch_sharding(len(shape), batch))

    sampling = SamplingParams(rows((batch,), jnp.float32), rows((batch,), jnp.int32), rows((batch,), jnp.float32))
    return LoopInputs(rows((batch, prompt), jnp.int32), rows((batch,), jnp.int32), rows((batch,), jnp.int32),
                      sampling, jax.ShapeDtypeStruct((STOP_IDS,), jnp.int32, sharding=plan.replicated()),
                      rows((batch, 2), jnp.uint32))


def state_shardings(plan: ShardingPlan, state, batch: int):
    """Shardings of a loop state (`loop.start`'s outputs) by the decoding plan's rules: the
    target's KV cache and the drafter state's `cache` by `cache_shardings` (batch over "data", kv
    heads over "model"), every other [B, ...] leaf over "data", the rest replicated."""
    def leaf(x):
        if x.ndim and x.shape[0] == batch:
            return plan.batch_sharding(x.ndim, batch)
        return plan.replicated()

    def field(name, v):
        if isinstance(v, KVCache):
            return plan.cache_shardings(v)
        out = jax.tree.map(leaf, v)
        if name == "drafter_state" and getattr(v, "cache", None) is not None:
            out = out._replace(cache=plan.cache_shardings(v.cache))
        return out

    return state._replace(**{f: field(f, v) for f, v in state._asdict().items() if v is not None})


def with_shardings(tree, shardings):
    """ShapeDtypeStructs of `tree`'s leaves (arrays or structs) laid out by `shardings`."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
