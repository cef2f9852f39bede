"""`key=value` settings, the one parser: a method's ':key=value' decoding overrides
(serving/methods.py), `specblock-train`'s and `specblock-aot`'s overrides (train/train_target.py,
aot/train.py), the bench's method flags and grids (infer/bench.py), an adapter's settings
(adaptation/adapter.py).

    split("num_nodes=8", "method 'd:num_nodes=8':")  -> ("num_nodes", "8")
    parse(["a=1", "b=x"])                             -> {"a": 1, "b": "x"}         (`scalar` typing)
    parse(["lr=0.5"], defaults={"lr": 1e-3})          -> {"lr": 0.5}                (typed like the default)
    parse(["subset=x"], fields=AdaptConfig)           -> {"subset": "x"}            (typed by the field)
    take("d:a=1:calibrate=true", {"calibrate"})      -> ("d:a=1", [("calibrate", "true")])

Every error is a ValueError naming the item (`what` says where it came from).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Collection, Iterable, Mapping

import yaml

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def split(item: str, what: str = "setting") -> tuple[str, str]:
    """'key=value' -> (key, value); ValueError "<what> '<item>' is not key=value" without '=' or key."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ValueError(f"{what} {item!r} is not key=value")
    return key, value


def scalar(text: str) -> Any:
    """true/false (any case) as bool, then int, then float, else the text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def boolean(text: str, key: str, what: str = "setting") -> bool:
    """true/false, 1/0, yes/no (any case); ValueError naming `key` otherwise."""
    if text.lower() not in _TRUE + _FALSE:
        raise ValueError(f"{what} {key}={text!r}: expected a boolean")
    return text.lower() in _TRUE


def like(default: Any, text: str, key: str, what: str = "setting") -> Any:
    """`text` typed like `default` (bool, int, float, str; else read as YAML, e.g. a list)."""
    if isinstance(default, bool):
        return boolean(text, key, what)
    try:
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        raise ValueError(f"{what} {key}={text!r}: expected {type(default).__name__}") from None
    if isinstance(default, str):
        return text
    return yaml.safe_load(text)


_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


def of_field(field_type: Any, text: str, key: str, what: str = "setting") -> Any:
    """`text` as a dataclass field of type `field_type` (bool, int, float or str, or their names
    as `from __future__ import annotations` leaves them)."""
    kind = _TYPES.get(field_type, field_type) if isinstance(field_type, str) else field_type
    if kind is bool:
        return boolean(text, key, what)
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"{what} {key}={text!r}: expected {kind.__name__}") from None
    if kind is str:
        return text
    return yaml.safe_load(text)


def parse(items: Iterable[str], what: str = "setting", *, defaults: Mapping[str, Any] | None = None,
          fields: Any = None) -> dict[str, Any]:
    """Each 'key=value' of `items`, typed: like its value in `defaults` (an unknown key refused),
    by the field of dataclass `fields` (an unknown key refused), else by `scalar`."""
    known = ({f.name: f.type for f in dataclasses.fields(fields)} if fields is not None
             else dict(defaults) if defaults is not None else None)
    out: dict[str, Any] = {}
    for item in items:
        key, text = split(item, what)
        if known is None:
            out[key] = scalar(text)
            continue
        if key not in known:
            raise ValueError(f"{what} {item!r}: unknown key {key!r} (known: {sorted(known)})")
        out[key] = of_field(known[key], text, key, what) if fields is not None else like(known[key], text, key, what)
    return out


def take(method: str, wanted: Callable[[str], bool] | Collection[str]) -> tuple[str, list[tuple[str, str]]]:
    """Splits a method 'NAME:k=v:...' into (the method without the settings whose key is
    `wanted` (a set of keys, or a test of one), those settings' (key, text) pairs in order):
    'NAME:a=1:calibrate=true' with {"calibrate"} -> ('NAME:a=1', [("calibrate", "true")])."""
    test = wanted if callable(wanted) else wanted.__contains__
    base, *pairs = method.split(":")
    keep, taken = [base], []
    for pair in pairs:
        key, _, text = pair.partition("=")
        if test(key):
            taken.append((key, text))
        else:
            keep.append(pair)
    return ":".join(keep), taken
