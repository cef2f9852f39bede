"""Per-row sizes chosen at the prefill: a drafter whose rows each pick a size after the prompt
(BlockPilot's block size) decodes a batch in one loop compiled at the batch's largest choice.

A sized drafter is a `SizedDrafter` (drafters/base.py): at_size(size) gives the same drafter in
a loop of static size `size` (same params, same state shapes; rows that chose less are masked to
their own size), row_sizes / with_row_sizes read and write each row's choice in its state, and
given_sizes(ids) gives sizes on the host by prompt (an oracle), or None.

The batch's loop starts with the drafter at its largest size (the prefill and `init_state`, where
each row chooses: one prefill), the host reads the rows' sizes once (`settle`), and the decoding
steps run in the loop `at_size(max of the live rows' sizes)`: at most one loop per size. A
continuous-batching stream settles again after each refill, so its segments run at their live
rows' largest size (decoding/refill.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from specblock_jax.drafters.base import SizedDrafter, conform


def is_sized(drafter: Any) -> bool:
    """Whether `drafter` chooses sizes per row: it has `at_size`, and then it must be a whole
    `SizedDrafter` (drafters/base.py; a TypeError names what it lacks)."""
    if not hasattr(drafter, "at_size"):
        return False
    conform(drafter, SizedDrafter, "a drafter with at_size")
    return True


def settle(loop, state, rows: Sequence[int], tokens: Sequence[Sequence[int]], live: Sequence[int]):
    """After `loop.start` (or an insert into `rows` of the prompts `tokens`): writes the
    drafter's given sizes (an oracle's) into those rows, reads every row's size to the host (one
    read) and returns (state, sizes [B] numpy, the loop at the largest size of the `live` rows)."""
    drafter = loop.drafter
    given = drafter.given_sizes(tokens)
    dstate = state.drafter_state
    if given is not None:
        sizes = drafter.row_sizes(dstate).at[jnp.asarray(list(rows), jnp.int32)].set(jnp.asarray(given, jnp.int32))
        dstate = drafter.with_row_sizes(dstate, sizes)
        state = state._replace(drafter_state=dstate)
    sizes = np.asarray(drafter.row_sizes(dstate))
    size = int(max(sizes[list(live)])) if len(live) else int(max(sizes))
    return state, sizes, dataclasses.replace(loop, drafter=drafter.at_size(size))
