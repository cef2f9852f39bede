"""The decode loops' shared contract and the three protocols beside the drafter's
(drafters/base.py): an object that does not conform fails where it enters, naming what it lacks."""

import inspect

import jax.numpy as jnp
import pytest

from specblock_jax.decoding.autoregressive import TargetLoop
from specblock_jax.decoding.sized import is_sized
from specblock_jax.decoding.speculative import SpeculativeLoop
from specblock_jax.drafters.base import DecodeAdapter, SizedDrafter, advance_state, conform

LOOP_MEMBERS = ("start", "step", "run", "output", "decode", "forwards", "commits", "for_profile", "target_state",
                "advance", "prefill_loop", "label", "sized", "num_nodes", "draft_phases", "profile_phases")


def test_both_loops_answer_the_same_members_with_the_same_signatures():
    for name in LOOP_MEMBERS:
        a, b = getattr(TargetLoop, name, None), getattr(SpeculativeLoop, name, None)
        assert a is not None and b is not None, name
        if inspect.isfunction(a):
            assert list(inspect.signature(a).parameters) == list(inspect.signature(b).parameters), name
    assert list(inspect.signature(TargetLoop.step).parameters) == ["self", "params", "drafter_params", "s",
                                                                  "stop_ids"]


class HalfSized:
    """Has `at_size` (so it claims per-row sizes) but none of the rest."""

    def at_size(self, size):
        return self


def test_a_drafter_with_at_size_alone_is_refused_naming_what_it_lacks():
    with pytest.raises(TypeError) as err:
        is_sized(HalfSized())
    msg = str(err.value)
    assert "SizedDrafter" in msg and "HalfSized" in msg
    for missing in ("row_sizes", "with_row_sizes", "given_sizes"):
        assert missing in msg
    assert not is_sized(object())  # no at_size: an ordinary drafter


def test_the_shipped_sized_drafter_conforms():
    from specblock_jax.drafters.blockpilot import BlockPilotDrafter

    assert set(m for m in ("at_size", "row_sizes", "with_row_sizes", "given_sizes")) <= set(dir(BlockPilotDrafter))
    assert issubclass(BlockPilotDrafter, SizedDrafter)


class NoCallback:
    drafter = None
    params = ()


def test_an_adapter_without_after_batch_is_refused_naming_it():
    with pytest.raises(TypeError, match="after_batch") as err:
        conform(NoCallback(), DecodeAdapter, "adapter")
    assert "DecodeAdapter" in str(err.value) and "NoCallback" in str(err.value)
    from specblock_jax.adaptation.adapter import Adapter

    assert callable(Adapter.after_batch)  # the real one's callback (drafter and params are set per instance)


def test_a_drafter_state_length_is_advanced_or_refused():
    from typing import NamedTuple

    class State(NamedTuple):
        length: object
        other: object

    s = advance_state(State(jnp.array([3, 5], jnp.int32), 1), 4)
    assert s.length.tolist() == [7, 9] and s.other == 1
    assert advance_state((), 4) == ()  # a stateless drafter
    with pytest.raises(TypeError, match="length"):
        advance_state(State(jnp.zeros((2, 3), jnp.int32), 1), 4)  # not [B]
    with pytest.raises(TypeError, match="integer"):
        advance_state(State(jnp.zeros((2,), jnp.float32), 1), 4)
