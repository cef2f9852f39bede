"""Continuous batching: a row whose request has finished takes the next waiting request while the
other rows keep decoding.

A job runs as one stream of B rows. The jitted loop (`loop.run`) returns to the host as
soon as `wake_rows` rows are done while requests wait (1 by default: every finished row is refilled
at once; more trades idle row-steps for fewer returns and larger inserts); the host reads the
finished rows' outputs, prefills the next requests for those rows only (`insert_rows`: a prefill
of R rows, R a power of two, its K/V and drafter state scattered into the freed rows), and
resumes the loop. Shapes are static: one compiled loop per stream (a drafter whose rows choose a
size at the prefill: one per size its live rows' largest reaches, decoding/sized.py), one insert per (R, prompt
bucket). Every row carries its own position, budget, sampling settings, PRNG key and step
counter, so a request's output is what it would be decoded alone: greedy identical, sampled
identical for a given seed, whatever the batching.

The rule drafters follow for this (drafters/base.py): every leaf of a drafter's state is per row,
batch on axis 0, and its other dimensions depend on the static `max_len` only, never on the prompt.
"""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specblock_jax.decoding.compiled import compiled
from specblock_jax.decoding.loop import DecodeLoop
from specblock_jax.decoding.loop_core import LoopInputs
from specblock_jax.decoding.sampling import SamplingParams
from specblock_jax.decoding.sized import settle
from specblock_jax.decoding.sizing import sizing_rows
from specblock_jax.models.kv_cache import KVCache


def put_rows(state, fresh, rows: jax.Array):
    """Writes the R rows of `fresh` into rows [R] of `state` (same structure; indices >= B are
    padding and dropped). Leaves are per row on axis 0, the KV cache's k and v on axis 1."""
    def put(big, small, axis, name):
        want = big.shape[:axis] + (rows.shape[0],) + big.shape[axis + 1:]
        if small.shape != want:
            raise ValueError(f"continuous batching: state field {name} of the new rows has shape "
                             f"{small.shape}, the running batch needs {want} (every leaf must be per row, "
                             "its other dimensions independent of the prompt)")
        index = (slice(None),) * axis + (rows,)
        return big.at[index].set(small.astype(big.dtype), mode="drop")

    def walk(path, big, small):
        name = jax.tree_util.keystr(path)
        if isinstance(big, KVCache):
            return KVCache(put(big.k, small.k, 1, name + ".k"), put(big.v, small.v, 1, name + ".v"),
                           put(big.lengths, small.lengths, 0, name + ".lengths"))
        return put(big, small, 0, name)

    return jax.tree_util.tree_map_with_path(walk, state, fresh, is_leaf=lambda x: isinstance(x, KVCache))


def insert_rows(loop: DecodeLoop, params, drafter_params, state, rows: jax.Array, inputs: LoopInputs):
    """Starts R new requests (inputs.tokens [R, P], P <= the stream's prompt bucket: prefill and
    the drafter's first state) and puts them into rows [R] of the running `state` (indices >= B:
    padding, dropped)."""
    return put_rows(state, loop.start(params, drafter_params, inputs), rows)


def pack_rows(tokens: Sequence[Sequence[int]], budgets: Sequence[int], temperatures: Sequence[float],
              indices: Sequence[int], width: int, base_key, top_k: int, top_p: float,
              stop_ids: jax.Array) -> LoopInputs:
    """The loop inputs of R requests: tokens [R, width] (right-padded), lengths [R], budgets [R],
    SamplingParams, stop_ids as given, keys [R] (fold_in(base_key, each request's index): a
    request's key stream does not depend on its batch)."""
    packed = np.zeros((len(tokens), width), np.int32)
    for i, t in enumerate(tokens):
        packed[i, :len(t)] = t
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(base_key, jnp.asarray(indices))
    sampling = SamplingParams.make(len(tokens), list(temperatures), top_k, top_p)
    return LoopInputs(jnp.asarray(packed), jnp.asarray([len(t) for t in tokens], jnp.int32),
                      jnp.asarray(budgets, jnp.int32), sampling, stop_ids, keys)


class Request(NamedTuple):
    index: int  # the prompt's index in the job
    tokens: list[int]
    budget: int
    temperature: float
    key: int  # its PRNG stream is fold_in(base_key, key) (generate's key_index)


class Finished(NamedTuple):
    """A request harvested from the stream."""
    index: int
    tokens: list[int]  # new tokens (a stop token included)
    stopped: bool
    forwards: int  # the target's decoding forwards for this request
    segment: int  # the segment it finished in (segments number the loop's returns to the host)
    segment_wall_s: float  # that segment's wall time: insert + decoding steps (compilation excluded)
    segment_compile_s: float
    segment_steps: int  # decoding steps the segment ran
    block_size: int | None = None  # a sized drafter's choice for it (decoding/sized.py)
    commits: np.ndarray | None = None  # [N + 1] its steps by the batch's most committed (speculative loop)
    sizing: dict | None = None  # step sizing's tally of the row (GenerationStats.sizing)


def one_more_step(state):
    """`compiled`'s warm-up state for `loop.run` / `insert_rows`: a fresh copy of the (donated)
    state whose rows stop after one more step."""
    state = jax.tree.map(jnp.copy, state)
    return state._replace(budgets=jnp.minimum(state.budgets, state.generated + 1))


def pow2_at_least(n: int, cap: int) -> int:
    return min(cap, 1 << max(n - 1, 0).bit_length())


class Stream:
    """Decodes requests through `batch_size` rows with refill, in `loop` (its
    hist_size holds the stream's prompt bucket, its max_new every budget, its cache_len both).

    run(requests, on_finished) decodes them in the order given (the caller orders the queue),
    calling on_finished(list[Finished], state, rows) after every segment: state is the loop state
    (device arrays) from which the finished rows were read (the adapter reads its history)."""

    def __init__(self, loop: DecodeLoop, params, drafter_params, *, batch_size: int, top_k: int, top_p: float,
                 stop_ids: jax.Array, base_key: jax.Array, bucket: Callable[[int], int], wake_rows: int = 1):
        if not 1 <= wake_rows <= batch_size:
            raise ValueError(f"refill_rows must be between 1 and the batch size {batch_size}, got {wake_rows}")
        self.loop, self.params, self.drafter_params = loop, params, drafter_params
        self.start_loop = loop.prefill_loop  # greedy and sampled streams of one shape share their start
        self.b, self.bucket, self.top_k, self.top_p = batch_size, bucket, top_k, top_p
        self.stop_ids, self.base_key, self.wake_rows = stop_ids, base_key, wake_rows
        self.segments = 0

    def inputs(self, reqs: Sequence[Request], count: int) -> LoopInputs:
        """Loop inputs for `count` rows (padding repeats the first request), tokens [R, P] at the
        smallest bucket holding them."""
        reqs = list(reqs) + [reqs[0]] * (count - len(reqs))
        return pack_rows([r.tokens for r in reqs], [r.budget for r in reqs], [r.temperature for r in reqs],
                         [r.key for r in reqs], self.bucket(max(len(r.tokens) for r in reqs)), self.base_key,
                         self.top_k, self.top_p, self.stop_ids)

    def _dparams(self, adapter):
        return adapter.params if adapter is not None else self.drafter_params

    def run(self, requests: Sequence[Request], on_finished: Callable[..., None], adapter: Any = None) -> None:
        """Decodes `requests` in the order given; after every segment calls
        on_finished(finished: list[Finished], state, rows) with the loop state the finished rows
        (`rows`, their indices in the batch) were read from."""
        loop, params = self.loop, self.params
        queue = list(requests)
        holder: list[Request | None] = [None] * self.b
        t0 = time.perf_counter()
        take, queue = queue[:self.b], queue[self.b:]
        dparams, inputs = self._dparams(adapter), self.inputs(take, self.b)
        exe, compile_s = compiled(type(self.start_loop).start, (self.start_loop,), params, dparams, inputs,
                                  warm=lambda args: args)
        state = exe(params, dparams, inputs)
        state = state._replace(done=state.done | (jnp.arange(self.b) >= len(take)))  # rows with no request
        holder[:len(take)] = take
        sizes = None
        if loop.sized:  # the segment's loop at its live rows' largest size (decoding/sized.py)
            state, sizes, loop = settle(self.loop, state, range(len(take)), [r.tokens for r in take],
                                        range(len(take)))
        while any(h is not None for h in holder):
            steps_before = np.asarray(state.step)
            wake = jnp.int32(min(self.wake_rows, len(queue)))  # 0 once the queue is empty: every row to its end
            dparams, running = self._dparams(adapter), state
            exe, seconds = compiled(type(loop).run, (loop,), params, dparams, state, self.stop_ids, wake,
                                    donate_argnums=(2,),
                                    warm=lambda _: (params, dparams, one_more_step(running), self.stop_ids, wake))
            compile_s += seconds
            state = exe(params, dparams, state, self.stop_ids, wake)
            done = np.asarray(state.done)  # waits for the loop
            wall = time.perf_counter() - t0 - compile_s
            steps = int(np.max(np.asarray(state.step) - steps_before))
            free = [r for r in range(self.b) if holder[r] is not None and done[r]]
            out, generated = np.asarray(state.out)[free], np.asarray(state.generated)[free]
            stopped = np.asarray(state.stopped)[free]
            forwards = np.asarray(loop.forwards(state))[free]
            commits = loop.commits(state)
            commits = None if commits is None else np.asarray(commits)[free]
            tallies = sizing_rows(loop, getattr(state, "tally", None), free)
            finished = [Finished(holder[r].index, out[j, :generated[j]].tolist(), bool(stopped[j]),
                                 int(forwards[j]), self.segments, wall, compile_s, steps,
                                 None if sizes is None else int(sizes[r]),
                                 None if commits is None else commits[j], tallies[j])
                        for j, r in enumerate(free)]
            on_finished(finished, state, free)
            self.segments += 1
            for r in free:
                holder[r] = None
            t0, compile_s = time.perf_counter(), 0.0
            if queue and free:
                take, queue = queue[:len(free)], queue[len(free):]
                count = pow2_at_least(len(take), self.b)
                rows = jnp.asarray(free[:len(take)] + [self.b] * (count - len(take)), jnp.int32)
                dparams, inputs, running = self._dparams(adapter), self.inputs(take, count), state
                exe, compile_s = compiled(insert_rows, (self.start_loop,), params, dparams, state, rows, inputs,
                                          donate_argnums=(2,),
                                          warm=lambda _: (params, dparams, one_more_step(running), rows, inputs))
                state = exe(params, dparams, state, rows, inputs)
                for r, req in zip(free, take):
                    holder[r] = req
                if sizes is not None:
                    live = [r for r in range(self.b) if holder[r] is not None]
                    state, sizes, loop = settle(self.loop, state, free[:len(take)], [r.tokens for r in take], live)
