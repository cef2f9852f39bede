"""specblock_jax.jsonl: the one resumable JSONL helper (read what is done, cutting a torn last line;
append whole lines) that specblock-decode, regenerate and the regen data readers share."""

from __future__ import annotations

import json
import logging

import pytest

from specblock_jax import jsonl


def test_read_rows_cuts_a_torn_last_line_and_skips_bad_lines(tmp_path, caplog):
    path = tmp_path / "out.jsonl"
    assert jsonl.read_rows(path) == []  # no file yet: nothing done
    path.write_bytes(b'{"id": 7}\n{oops\n\xff\n{"id": "b"}\n{"id": "c", "te')
    caplog.set_level(logging.WARNING)
    assert jsonl.read_rows(path, torn="ignore") == [{"id": 7}, {"id": "b"}]
    assert path.read_bytes().endswith(b'{"id": "c", "te')  # "ignore" leaves the file as it is
    assert "ignoring a torn last line" in caplog.text
    with pytest.raises(jsonl.TornLineError, match="torn last line"):
        jsonl.read_rows(path, torn="raise")
    assert jsonl.read_rows(path) == [{"id": 7}, {"id": "b"}]
    assert path.read_bytes() == b'{"id": 7}\n{oops\n\xff\n{"id": "b"}\n'  # cut off the file
    assert "removed a torn last line" in caplog.text
    assert f"{path} line 2: skipped, invalid JSON" in caplog.text
    assert f"{path} line 3: skipped, not UTF-8 text (byte 0xff at column 1)" in caplog.text


def test_appender_writes_whole_lines_and_append_rows_one_write(tmp_path):
    path = tmp_path / "sub" / "out.jsonl"
    with jsonl.Appender(path) as out:
        out.write({"id": 1, "text": "café"})
        out.write_many([{"id": 2}, {"id": 3}])
    jsonl.append_rows(path, [{"id": 4}])
    assert path.read_text(encoding="utf-8").splitlines()[0] == '{"id": 1, "text": "café"}'
    assert [r["id"] for r in jsonl.read_rows(path)] == [1, 2, 3, 4]
    ascii_path = tmp_path / "ascii.jsonl"
    with jsonl.Appender(ascii_path, ensure_ascii=True) as out:
        out.write({"t": "é"})
    assert ascii_path.read_text() == json.dumps({"t": "é"}) + "\n"
    jsonl.replace_rows(path, [{"id": 9}])
    assert jsonl.read_rows(path) == [{"id": 9}] and not (tmp_path / "sub" / "out.jsonl.tmp").exists()


def test_parse_rows_names_the_reason():
    rows = list(jsonl.parse_rows([b'{"a": 1}\n', b"\n", b"[1,\n", b"caf\xe9\n"]))
    assert rows == [(1, {"a": 1}, None), (3, None, "invalid JSON (Expecting value)"),
                    (4, None, "not UTF-8 text (byte 0xe9 at column 4)")]
