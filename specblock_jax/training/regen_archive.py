"""A compact, committable form of a `train/regenerate.py` output folder, restored byte-identically.

A regenerate folder (`<mode>.jsonl`, settings.json, summary.json) is a few tens of MB of JSON; its
content is token ids. `pack` writes it as one deterministic zip of numpy arrays plus a manifest:

    <archive>/regen.npz      prompt_tokens uint16 [P] (every distinct prompt once, concatenated),
                             prompt_lengths int32 [n_prompts]; per mode m:
                             m.prompt_index int32 [n] (row -> prompt), m.response_tokens uint16 [R],
                             m.response_lengths int32 [n], m.finish uint8 [n] (index into
                             meta.finish_reasons); meta uint8 (UTF-8 JSON: ids, key order, texts
                             that do not decode back from their ids, settings/summary bytes)
    <archive>/MANIFEST.json  sha256 of regen.npz, and per mode: rows, prompt/response token totals
                             and the sha256 of the original <mode>.jsonl

`restore` rebuilds every file and checks each against the manifest's sha256. Text fields are
re-derived with the target's tokenizer (`decode(ids, skip_special_tokens=True)`, how regenerate
wrote "response"); a text that does not round-trip is stored verbatim. Pack refuses a record that
would not re-serialise to its exact line (other keys, e.g. conversations' assistant_mask).

    pack("data/regen-v2/train", "assets/data/regen-v2", tokenizer)
    restore("assets/data/regen-v2", "data/regen-v2/train", tokenizer)   # -> the manifest dict
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from specblock_jax.jsonl import complete_lines, dumps
from specblock_jax.training.regen_dataset import MODES

ARCHIVE = "regen.npz"
MANIFEST = "MANIFEST.json"
LINE_KEYS = ("id", "mode", "prompt", "response", "prompt_ids", "response_ids", "finish_reason")
EXTRA_FILES = ("settings.json", "summary.json")
FORMAT = 1
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed entry times: the same data packs to the same bytes


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_line(rec: dict[str, Any]) -> str:
    """One `<mode>.jsonl` line exactly as `train/regenerate.py` writes it (keys in LINE_KEYS order)."""
    return dumps({k: rec[k] for k in LINE_KEYS}, ensure_ascii=True)


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def _to_u16(ids: list[int], what: str) -> np.ndarray:
    arr = np.asarray(ids, np.int64)
    if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(np.uint16).max):
        raise ValueError(f"{what}: token ids outside uint16")
    return arr.astype(np.uint16)


def _read_mode(path: Path) -> tuple[bytes, list[dict[str, Any]]]:
    """(file bytes, records) of one <mode>.jsonl; every line must re-serialise to itself."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    data = complete_lines(path, torn="raise")  # a TornLineError (a ValueError): rerun the regeneration first
    recs = []
    for n, line in enumerate(data.decode("utf-8").splitlines(keepends=True), 1):
        rec = json.loads(line)
        if list(rec) != list(LINE_KEYS) or record_line(rec) != line:
            raise ValueError(f"{path} line {n}: not a plain regenerate record {LINE_KEYS} "
                             "(conversation records are not supported)")
        recs.append(rec)
    return data, recs


def _write_zip(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """An np.load-able .npz whose bytes depend only on `arrays` (np.savez stamps the time)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue(), compresslevel=9)


def pack(src: str | Path, out: str | Path, tokenizer) -> dict[str, Any]:
    """Packs the regenerate folder `src` into `out` (regen.npz + MANIFEST.json); returns the manifest."""
    src, out = Path(src), Path(out)
    modes = [m for m in MODES if (src / f"{m}.jsonl").exists()]
    if not modes:
        raise ValueError(f"{src}: no {[m + '.jsonl' for m in MODES]} files")
    prompts: dict[tuple[str, tuple[int, ...]], int] = {}  # (prompt text, ids) -> prompt row
    prompt_ids: list[list[int]] = []
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"format": FORMAT, "finish_reasons": [], "modes": {}, "texts": {},
                            "files": {n: (src / n).read_bytes().decode("utf-8")
                                      for n in EXTRA_FILES if (src / n).exists()}}
    prompt_text: list[str] = []
    manifest: dict[str, Any] = {"format": FORMAT, "modes": {}}
    for mode in modes:
        data, recs = _read_mode(src / f"{mode}.jsonl")
        index, responses, finish, texts = [], [], [], {}
        for row, rec in enumerate(recs):
            key = (rec["prompt"], tuple(rec["prompt_ids"]))
            if key not in prompts:
                prompts[key] = len(prompt_ids)
                prompt_ids.append(rec["prompt_ids"])
                prompt_text.append(rec["prompt"])
            index.append(prompts[key])
            responses.append(rec["response_ids"])
            if rec["finish_reason"] not in meta["finish_reasons"]:
                meta["finish_reasons"].append(rec["finish_reason"])
            finish.append(meta["finish_reasons"].index(rec["finish_reason"]))
            if _decode(tokenizer, rec["response_ids"]) != rec["response"]:
                texts[str(row)] = rec["response"]
        arrays[f"{mode}.prompt_index"] = np.asarray(index, np.int32)
        arrays[f"{mode}.response_tokens"] = _to_u16([t for r in responses for t in r], mode)
        arrays[f"{mode}.response_lengths"] = np.asarray([len(r) for r in responses], np.int32)
        arrays[f"{mode}.finish"] = np.asarray(finish, np.uint8)
        meta["modes"][mode] = {"ids": [r["id"] for r in recs], "responses": texts}
        manifest["modes"][mode] = {
            "rows": len(recs), "prompt_tokens": sum(len(r["prompt_ids"]) for r in recs),
            "response_tokens": sum(len(r) for r in responses), "jsonl_sha256": sha256(data)}
    meta["texts"] = {str(i): t for i, t in enumerate(prompt_text)
                     if _decode(tokenizer, prompt_ids[i]) != t}
    arrays["prompt_tokens"] = _to_u16([t for p in prompt_ids for t in p], "prompts")
    arrays["prompt_lengths"] = np.asarray([len(p) for p in prompt_ids], np.int32)
    arrays["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode("utf-8"), np.uint8)
    out.mkdir(parents=True, exist_ok=True)
    _write_zip(out / ARCHIVE, arrays)
    manifest["files"] = {ARCHIVE: sha256((out / ARCHIVE).read_bytes())}
    manifest["files"].update({n: sha256(t.encode("utf-8")) for n, t in meta["files"].items()})
    manifest["bytes"] = (out / ARCHIVE).stat().st_size
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def _split(flat: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    ends = np.cumsum(lengths)
    return [flat[e - n:e].astype(np.int64).tolist() for e, n in zip(ends, lengths)]


def check_archive(archive: str | Path) -> dict[str, Any]:
    """The manifest of `archive`, after checking regen.npz's sha256 against it (ValueError if not)."""
    archive = Path(archive)
    manifest = json.loads((archive / MANIFEST).read_text(encoding="utf-8"))
    got = sha256((archive / ARCHIVE).read_bytes())
    if got != manifest["files"][ARCHIVE]:
        raise ValueError(f"{archive / ARCHIVE}: sha256 {got} != manifest {manifest['files'][ARCHIVE]}")
    return manifest


def restore(archive: str | Path, out: str | Path, tokenizer) -> dict[str, Any]:
    """Writes the archived folder into `out` (overwriting its files) and checks every file's sha256
    against the manifest (ValueError on a mismatch). Returns the manifest."""
    archive, out = Path(archive), Path(out)
    manifest = check_archive(archive)
    with np.load(archive / ARCHIVE, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays["meta"].tobytes().decode("utf-8"))
    if meta["format"] != FORMAT:
        raise ValueError(f"{archive}: archive format {meta['format']}, this code reads {FORMAT}")
    prompt_ids = _split(arrays["prompt_tokens"], arrays["prompt_lengths"])
    prompt_text = [meta["texts"].get(str(i)) for i in range(len(prompt_ids))]
    prompt_text = [_decode(tokenizer, p) if t is None else t for t, p in zip(prompt_text, prompt_ids)]
    out.mkdir(parents=True, exist_ok=True)
    for mode, m in meta["modes"].items():
        responses = _split(arrays[f"{mode}.response_tokens"], arrays[f"{mode}.response_lengths"])
        lines = []
        for row, (rid, p, resp, fin) in enumerate(zip(m["ids"], arrays[f"{mode}.prompt_index"],
                                                      responses, arrays[f"{mode}.finish"])):
            text = m["responses"].get(str(row))
            lines.append(record_line({
                "id": rid, "mode": mode, "prompt": prompt_text[p],
                "response": _decode(tokenizer, resp) if text is None else text,
                "prompt_ids": prompt_ids[p], "response_ids": resp,
                "finish_reason": meta["finish_reasons"][fin]}))
        data = "".join(lines).encode("utf-8")
        if sha256(data) != manifest["modes"][mode]["jsonl_sha256"]:
            raise ValueError(f"{mode}.jsonl restored from {archive} differs from the packed file "
                             "(another tokenizer?)")
        (out / f"{mode}.jsonl").write_bytes(data)
    for name, text in meta["files"].items():
        (out / name).write_bytes(text.encode("utf-8"))
    return manifest
