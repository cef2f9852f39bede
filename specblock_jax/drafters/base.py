"""The drafter protocol: what every drafter (prompt lookup, EAGLE-3, SpecBlock, DFlash) implements.

A drafter is a frozen dataclass (hashable, a static argument under jit) holding only settings;
its weights (`params`; the two together are a `LoadedDrafter`) and its per-batch `state` (a NamedTuple of [B, ...] arrays, or () for a
stateless drafter) are pytrees passed through the decode loop. A drafter saved as a folder names
its registry kind in a class attribute `kind` (see drafters/registry.py).
All three methods are pure and run inside the loop's jit:

    state = drafter.init_state(params, prefill, max_len)      after the target's prefill
    tree, state = drafter.propose(params, state, ctx, key)      before each target forward
    state = drafter.update(params, state, ctx, result, hidden)  after each verification

Row rule (continuous batching, decoding/refill.py): every leaf of the state is per row, batch on
axis 0, and its other dimensions depend on the static `max_len` (and the drafter's settings) only,
never on the prompt's padded length; `init_state` of R new rows then gives leaves that are written
into R rows of a running batch. A row's state must depend on that row's inputs only.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple, Protocol, Sequence, runtime_checkable

import jax
import jax.numpy as jnp

from specblock_jax.training.task import TrainTask
from specblock_jax.trees.tree import DraftTree
from specblock_jax.trees.verify import VerifyResult


class DraftContext(NamedTuple):
    history: jax.Array  # [B, S] int32 committed tokens (prompt + generated), padded
    hist_len: jax.Array  # [B] int32 valid entries; history[:, hist_len - 1] is the root
    root: jax.Array  # [B] int32 the last committed token (its K/V is not in the cache yet)
    cache_len: jax.Array  # [B] int32 tokens in the target's KV cache (= hist_len - 1)
    # [] fp32 or None: step sizing's floor (decoding/sizing.py `draft_floor`): a drafter that drafts
    # level by level may stop once no frontier node's path probability is above it (None: draft all)
    floor: jax.Array | None = None


class Prefill(NamedTuple):
    tokens: jax.Array  # [B, P] right-padded prompt tokens
    lengths: jax.Array  # [B] prompt lengths
    hidden: jax.Array | None  # [B, P, n, H] target hidden states at drafter.hidden_ids, or None
    logits: jax.Array  # [B, V] the target's next-token logits after the prompt
    root: jax.Array  # [B] the first generated token (sampled from `logits`)


class LoadedDrafter(NamedTuple):
    """A drafter with its weights: what `load_drafter` returns and `generate` takes as `drafter`."""
    drafter: Any  # a Drafter: settings only, hashable
    params: Any  # its weights (a pytree; () for a drafter without any, e.g. prompt lookup)

    def __repr__(self) -> str:
        """One line: the kind, its decoding settings, parameter count and dtype."""
        leaves = jax.tree.leaves(self.params)
        size = sum(int(math.prod(x.shape)) for x in leaves)
        dtypes = sorted({str(x.dtype) for x in leaves})
        return (f"LoadedDrafter({describe(self.drafter)}, {size / 1e6:.2f}M params"
                f"{', ' + '/'.join(dtypes) if dtypes else ''})")


def describe(drafter: Any) -> str:
    """A drafter's kind and decoding settings in one line (not its config's graph)."""
    kind = getattr(drafter, "kind", type(drafter).__name__)
    if not dataclasses.is_dataclass(drafter):
        return kind
    settings = [f"{f.name}={getattr(drafter, f.name)!r}" for f in dataclasses.fields(drafter)
                if f.repr and not f.name.endswith("graphdef") and f.name != "config"
                and isinstance(getattr(drafter, f.name), (int, float, str, bool, tuple, type(None)))]
    return f"{kind}: {type(drafter).__name__}({', '.join(settings)})"


class Drafter(Protocol):
    num_nodes: int  # N: the static node budget of every proposed tree (root included)
    max_children: int  # most siblings any node of its trees has (bounds verification work)
    hidden_ids: tuple[int, ...]  # target hidden states the drafter consumes (HF indexing)
    forwards_per_step: int  # drafter network forwards per decoding step (propose + update)

    def init_state(self, params: Any, prefill: Prefill, max_len: int) -> Any:
        """max_len (static): positions a sequence can reach, prompt + new tokens + a tree."""

    def propose(self, params: Any, state: Any, ctx: DraftContext, key: jax.Array
                ) -> tuple[DraftTree, Any]: ...

    def update(self, params: Any, state: Any, ctx: DraftContext, result: VerifyResult,
               hidden: jax.Array | None) -> Any: ...


class DrafterTask(TrainTask, Protocol):
    """A drafter kind's training (`training/task.py` has the contract): a `TrainTask` whose trained
    params also decode, for the trainer's tau evaluation."""

    def decoding_drafter(self, params) -> LoadedDrafter: ...  # the Drafter with its decoding params


# ------------------------------------------------------------------ the contracts beside the drafter's
# Each is a Protocol; `conform` checks an object against one and names what is missing, so a
# non-conforming object fails where it enters (generate, the loop) with a clear error.

@runtime_checkable
class SizedDrafter(Protocol):
    """A drafter whose rows each choose a static size at the prefill (BlockPilot's block size);
    decoding/sized.py runs a batch in the loop `at_size(its live rows' largest choice)`."""

    def at_size(self, size: int) -> Any:
        """The same drafter in a loop of static size `size` (same params and state shapes)."""

    def row_sizes(self, state: Any) -> jax.Array:
        """[B] int32 each row's chosen size, from the drafter state."""

    def with_row_sizes(self, state: Any, sizes: jax.Array) -> Any:
        """The state with the rows' sizes [B] replaced."""

    def given_sizes(self, ids: Sequence[Sequence[int]]) -> list[int] | None:
        """Sizes given on the host per prompt (an oracle's), or None."""


@runtime_checkable
class DecodeAdapter(Protocol):
    """Serving-time adaptation as the decode loops call it (adaptation/adapter.py `Adapter`): its
    drafter, the params the loop decodes with (updated between batches), and the callback after
    each batch (or stream segment) with the verifier's free labels."""

    drafter: Any  # the Drafter it adapts (generate checks it is the one decoding)
    params: Any  # the drafter params to decode the next batch with

    def after_batch(self, history: jax.Array, hist_len: jax.Array, prompt_lengths: jax.Array,
                    features: jax.Array, rows: int, *, tokens: int, forwards: int, decode_s: float,
                    budget: int, remaining_budget: int) -> dict | None:
        """history [R, S], hist_len [R], prompt_lengths [R], features [R, S, n, H] of the batch's
        first `rows` real rows; returns the adaptation event (or None)."""


class CommittedLength(Protocol):
    """A drafter state with a committed-length field (a NamedTuple): `length` [B] int, the
    tokens its own cache holds. The step profile advances it with the target's cache
    (`advance_state`); a state without the field has nothing to advance."""

    length: jax.Array

    def _replace(self, **fields: Any) -> Any: ...


def conform(obj: Any, protocol: type, role: str) -> Any:
    """obj, if it has every member of `protocol`; else a TypeError naming `role`, the object's type
    and the missing members."""
    members = [m for m in _members(protocol) if not hasattr(obj, m)]
    if members:
        raise TypeError(f"{role}: {type(obj).__name__} is not a {protocol.__name__}: it lacks "
                        f"{', '.join(members)} ({protocol.__module__}.{protocol.__name__})")
    return obj


def _members(protocol: type) -> list[str]:
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {k for k, v in vars(protocol).items() if callable(v) and not k.startswith("__")}
    return sorted(names)


def advance_state(state: Any, offset: int) -> Any:
    """The drafter state with its committed `length` advanced by `offset` (`CommittedLength`); a
    state without a `length` field is returned unchanged. A `length` that is not a [B] integer
    array is an error naming the field."""
    if not hasattr(state, "length"):
        return state
    length = state.length
    if not hasattr(state, "_replace") or not hasattr(length, "dtype") or getattr(length, "ndim", None) != 1 \
            or not jnp.issubdtype(length.dtype, jnp.integer):
        raise TypeError(f"drafter state {type(state).__name__}: field `length` must be a [B] integer array "
                        f"in a NamedTuple (CommittedLength, drafters/base.py), got "
                        f"{getattr(length, 'shape', type(length).__name__)} {getattr(length, 'dtype', '')}")
    return state._replace(length=length + offset)
