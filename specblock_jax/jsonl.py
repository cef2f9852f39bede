"""JSON Lines: read line by line (every line that is not UTF-8 or not valid JSON reported by its
number), and the one resumable output file of the command-line tools.

A resumable output file is appended one whole line per write (`Appender`, `append_rows`), so a
kill loses at most the line being written; a rerun reads what is done with `read_rows`, which
first cuts a torn last line (no trailing newline) off the file:

    done = {row["id"] for row in read_rows(out)}          # cuts a torn last line, skips bad lines
    append_rows(out, [{"id": 7, "text": "..."}, ...])     # one write(2), flushed
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Iterable, Iterator, Literal

log = logging.getLogger("specblock_jax.jsonl")

Torn = Literal["cut", "ignore", "raise"]


class TornLineError(ValueError):
    """A file whose last line has no newline (a writer killed mid-line), read with torn="raise"."""


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


def parse_rows(lines: Iterable[bytes]) -> Iterator[tuple[int, object, str | None]]:
    """Like `parse_lines` over a file's raw lines (bytes), the reason a full sentence: (n, value,
    None), or (n, None, "invalid JSON (...)" | "not UTF-8 text (byte 0x.. at column C)")."""
    for n, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            yield n, None, f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
            continue
        for _, value, bad_json in parse_lines([line]):
            yield n, value, None if bad_json is None else f"invalid JSON ({bad_json})"


def complete_lines(path: Path | str, torn: Torn = "cut") -> bytes:
    """The bytes of `path` up to its last newline (b"" when it does not exist). A torn last line
    (a kill mid-write) is cut off the file (torn="cut", with a warning), left there and not read
    ("ignore", with a warning), or a `TornLineError` ("raise")."""
    path = Path(path)
    if not path.exists():
        return b""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        if torn == "raise":
            raise TornLineError(f"{path}: torn last line (a writer stopped mid-line; rerun it to finish)")
        data = data[: data.rfind(b"\n") + 1]
        if torn == "cut":
            os.truncate(path, len(data))
            log.warning("%s: removed a torn last line", path)
        else:
            log.warning("%s: ignoring a torn last line", path)
    return data


def read_rows(path: Path | str, torn: Torn = "cut") -> list:
    """The rows already written to a resumable JSONL file, in file order ([] when it does not
    exist): a torn last line is handled as `complete_lines` says (cut off by default), and any
    other line that is not UTF-8 JSON is skipped with a warning naming it."""
    rows = []
    for n, value, bad in parse_rows(complete_lines(path, torn).splitlines()):
        if bad is not None:
            log.warning("%s line %d: skipped, %s", path, n, bad)
        else:
            rows.append(value)
    return rows


def dumps(row, ensure_ascii: bool = False) -> str:
    """One JSONL line of `row`, with its newline (non-ASCII text kept as is unless ensure_ascii)."""
    return json.dumps(row, ensure_ascii=ensure_ascii) + "\n"


class Appender:
    """Appends to a JSONL file, each `write` (one row or several) one write(2) on an O_APPEND
    descriptor: a kill leaves whole lines and at most one torn last line. ensure_ascii: lines
    as `json.dumps` writes them by default (non-ASCII text escaped)."""

    def __init__(self, path: Path | str, ensure_ascii: bool = False):
        self.ensure_ascii = ensure_ascii
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # the umask applies

    def write(self, row) -> None:
        self.write_many([row])

    def write_many(self, rows: Iterable) -> None:
        data = "".join(dumps(r, self.ensure_ascii) for r in rows).encode("utf-8")
        while data:
            data = data[os.write(self.fd, data):]

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> "Appender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def append_rows(path: Path | str, rows: Iterable) -> None:
    """Appends `rows` to a JSONL file in one write (created with its folder when missing)."""
    with Appender(path) as out:
        out.write_many(rows)


def replace_rows(path: Path | str, rows: Iterable) -> None:
    """Writes `rows` as the whole of `path` atomically (a temporary file renamed over it)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(dumps(r) for r in rows))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
