"""JSON Lines read line by line, every line that is not valid JSON reported by its number."""

from __future__ import annotations

import json
from typing import Iterable, Iterator


def parse_lines(lines: Iterable[str]) -> Iterator[tuple[int, object, str | None]]:
    """(line number from 1, parsed value, None), or (n, None, the parser's message) for a line that
    is not valid JSON, for every non-blank line."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line), None
        except json.JSONDecodeError as e:
            yield n, None, e.msg
