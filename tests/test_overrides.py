"""The one `key=value` parser (specblock_jax/overrides.py): typing, errors naming the item, and
a method's settings taken out by key."""

from __future__ import annotations

import dataclasses

import pytest

from specblock_jax import overrides as kv


@dataclasses.dataclass
class _Settings:
    name: str = "x"
    steps: int = 1
    rate: float = 0.5
    on: bool = False


def test_values_are_typed_by_scalar_by_default_and_like_or_by_field_when_given():
    assert kv.parse(["a=1", "b=0.5", "c=TRUE", "d=x:y", "e="]) == {"a": 1, "b": 0.5, "c": True, "d": "x:y", "e": ""}
    assert kv.parse(["n=3", "lr=1", "tag=7", "layers=[1, 2]", "on=no"],
                    defaults={"n": 0, "lr": 0.1, "tag": "", "layers": None, "on": True}) == {
        "n": 3, "lr": 1.0, "tag": "7", "layers": [1, 2], "on": False}
    got = kv.parse(["name=7", "steps=2", "rate=1", "on=yes"], fields=_Settings)
    assert got == {"name": "7", "steps": 2, "rate": 1.0, "on": True} and isinstance(got["rate"], float)


def test_errors_name_the_item_and_where_it_came_from():
    with pytest.raises(ValueError, match=r"^override 'steps' is not key=value$"):
        kv.parse(["steps"], "override", defaults={"steps": 1})
    with pytest.raises(ValueError, match=r"^override '=3' is not key=value$"):
        kv.parse(["=3"], "override")
    with pytest.raises(ValueError, match=r"^override 'step=3': unknown key 'step' \(known: \['steps'\]\)$"):
        kv.parse(["step=3"], "override", defaults={"steps": 1})
    with pytest.raises(ValueError, match=r"^adapt setting steps='1.5': expected int$"):
        kv.parse(["steps=1.5"], "adapt setting", fields=_Settings)
    with pytest.raises(ValueError, match=r"^setting on='maybe': expected a boolean$"):
        kv.parse(["on=maybe"], fields=_Settings)


def test_take_splits_settings_off_a_method_in_order():
    assert kv.take("d:a=1:calibrate=true:b=2", {"calibrate"}) == ("d:a=1:b=2", [("calibrate", "true")])
    assert kv.take("d:adapt.x=1:n=2:adapt=false", lambda k: k.startswith("adapt")) == (
        "d:n=2", [("adapt.x", "1"), ("adapt", "false")])
    assert kv.take("ar", {"calibrate"}) == ("ar", [])
