"""The one validation of user-given settings, shared by the API (`Sampling`, `DecodeOptions`,
`generate`), the command-line flags and the per-record fields of prompt files. Each check returns
the value or raises ValueError "<field>: <what is wrong> (got <value>)"; callers prefix the source
(the flag, the record's line and id, or the API object), so every message reads
"<source>: <field>: <what is wrong> (got <value>)"."""

from __future__ import annotations

import math
from typing import Any


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def temperature(value: Any, field: str = "temperature") -> float:
    """A finite number >= 0 (0: greedy)."""
    if not _number(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{field}: must be a finite number >= 0 (got {value!r})")
    return float(value)


def top_p(value: Any, field: str = "top_p") -> float:
    """A number in (0, 1]."""
    if not _number(value) or not 0 < value <= 1:
        raise ValueError(f"{field}: must be in (0, 1] (got {value!r})")
    return float(value)


def whole(value: Any, field: str, low: int) -> int:
    """An integer >= low (top_k >= 0, max_new_tokens >= 1, batch sizes >= 1, ...)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{field}: must be an integer >= {low} (got {value!r})")
    return value


def top_k(value: Any, field: str = "top_k") -> int:
    return whole(value, field, 0)


def max_new_tokens(value: Any, field: str = "max_new_tokens") -> int:
    return whole(value, field, 1)
