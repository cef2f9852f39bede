"""`TargetLoop`: target-only decoding, one token per target forward, the whole batch in one
`lax.while_loop`. Its twin with a drafter is `SpeculativeLoop` (decoding/speculative.py); `make_loop`
(decoding/loop.py) picks one of the two once."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from specblock_jax.decoding.loop_core import LoopInputs, LoopOutput, prefill, step_keys, until_done
from specblock_jax.decoding.sampling import SamplingParams, sample
from specblock_jax.models.config import ModelConfig
from specblock_jax.models.kv_cache import KVCache
from specblock_jax.models.transformer import apply


class TargetState(NamedTuple):
    """The loop's carry, every field per row (the cache [L, B, ...]): see `SpeculativeState`."""
    step: jax.Array  # [B] int32 the row's decoding step (the prefill's token was step 0)
    root: jax.Array  # [B] int32 the last committed token (its K/V is not cached yet)
    generated: jax.Array  # [B] int32 new tokens so far
    out: jax.Array  # [B, max_new] int32 new tokens, -1 padded
    done: jax.Array  # [B] bool: stopped or out of budget
    stopped: jax.Array  # [B] bool: ended on a stop token
    cache: KVCache
    budgets: jax.Array  # [B] int32 new-token limits
    sampling: SamplingParams  # [B] per-row settings
    keys: jax.Array  # [B] PRNG keys, one per request


@dataclasses.dataclass(frozen=True, kw_only=True)
class TargetLoop:
    """Static settings of one target-only decode loop: frozen and hashable, so jit sees it as a
    static `self` and equal settings share one executable. Rows sample at their own temperatures,
    so one loop serves greedy and sampled rows alike."""

    graphdef: Any
    """The target's nnx GraphDef."""
    cfg: ModelConfig
    """The target's config."""
    cache_len: int
    """KV cache slots per row: >= P + max_new."""
    max_new: int
    """The largest new-token budget of any row (one compilation serves every smaller one)."""

    drafter: ClassVar[None] = None
    num_nodes: ClassVar[int] = 0  # tokens a step verifies besides the root
    label: ClassVar[str] = "target-only"  # what progress lines call the loop
    draft_phases: ClassVar[tuple[str, ...]] = ()  # the step profile's drafting phases: none
    profile_phases: ClassVar[tuple[str, ...]] = ("forward_1",)  # the step profile's phases
    sized: ClassVar[bool] = False  # rows never choose a size at the prefill (decoding/sized.py)

    @property
    def prefill_loop(self) -> "TargetLoop":
        """The loop whose `start` the prefill runs in: this one (it reads no greedy flag)."""
        return self

    def forwards(self, state: TargetState) -> jax.Array:
        """[B] decoding forwards per row (the prefill's token excluded)."""
        return state.generated - 1

    def commits(self, state: TargetState) -> None:
        """The speculative loop's commit counts: target-only steps commit one token, so None."""
        return None

    def for_profile(self) -> "TargetLoop":
        """The loop the step profile times: this one."""
        return self

    def target_state(self, state: TargetState) -> TargetState:
        """The state as a target-only step reads it (the step profile's forward_1): itself."""
        return state

    def advance(self, state: TargetState, offset: int) -> TargetState:
        """The step profile's mid-decode state (decoding/step_profile.py): nothing besides the
        cache, step and generated counts (which the profile advances) to move."""
        return state

    def start(self, params, drafter_params, inputs: LoopInputs) -> TargetState:
        """The prefill of `inputs`' rows (tokens [B, P]); `drafter_params` is unused."""
        pre = prefill(self.graphdef, self.cfg, params, inputs, self.cache_len, self.max_new)
        one = jnp.ones((inputs.tokens.shape[0],), jnp.int32)
        return TargetState(step=one, root=pre.first, generated=one, out=pre.out, done=pre.done, stopped=pre.stopped,
                           cache=pre.cache, budgets=inputs.budgets, sampling=inputs.sampling, keys=inputs.keys)

    def step(self, params, drafter_params, s: TargetState, stop_ids) -> TargetState:
        """One decoding step (also timed alone by the step profile; `drafter_params` is unused): a
        one-token forward of `s.root`, committed where the row still runs, the next token sampled with the row's step
        key and written; rows that hit a stop token or their budget are done."""
        b, width = s.out.shape
        one = jnp.ones((b, 1, 1), bool)
        fwd = apply(self.graphdef, params, s.root[:, None], s.cache.lengths[:, None], one, s.cache)
        active = ~s.done
        cache = fwd.cache.advance(active.astype(jnp.int32))  # commit `root` where still running
        nxt = sample(step_keys(s.keys, s.step), fwd.logits[:, 0], s.sampling)
        write = active[:, None] & (jnp.arange(width)[None, :] == s.generated[:, None])
        generated = s.generated + active
        hit = active & jnp.isin(nxt, stop_ids)
        return s._replace(step=s.step + active, root=nxt, generated=generated,
                          out=jnp.where(write, nxt[:, None], s.out),
                          done=s.done | hit | (generated >= s.budgets), stopped=s.stopped | hit, cache=cache)

    def run(self, params, drafter_params, state: TargetState, stop_ids: jax.Array, wake: jax.Array) -> TargetState:
        """Decoding steps until every row is done, or, when wake > 0, until at least `wake` are."""
        return until_done(lambda s: self.step(params, drafter_params, s, stop_ids), state, wake)

    def output(self, state: TargetState) -> LoopOutput:
        """tokens [B, max_new]; forwards = decoding forwards (the prefill's token excluded)."""
        return LoopOutput(tokens=state.out, generated=state.generated, stopped=state.stopped,
                          forwards=self.forwards(state))

    def decode(self, params, drafter_params, inputs: LoopInputs) -> LoopOutput:
        """The whole loop: start, run until every row is done, output."""
        state = self.start(params, drafter_params, inputs)
        return self.output(self.run(params, drafter_params, state, inputs.stop_ids, jnp.int32(0)))
