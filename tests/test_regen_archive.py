"""The committed regenerated training data (assets/data/regen-v2): pack/restore round trip, the
archive's checksum, and (slow) that its greedy rows are the shipped target's own output."""

import json
from pathlib import Path

import numpy as np
import pytest

import specblock_jax as sbj
from specblock_jax.training import regen_archive as ra

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT / "assets" / "data" / "regen-v2"


@pytest.fixture(scope="module")
def tok():
    return sbj.models.load_tokenizer(ROOT / "assets" / "tokenizer")


def _write_regen(folder: Path, tok) -> None:
    """A tiny regenerate folder: 3 prompts x 2 modes, one response text that is not its ids' decode."""
    folder.mkdir(parents=True)
    prompts = ["def f(x):\n    return", "class A:\n    \"\"\"é ünïcode\"\"\"\n", "import os\n"]
    rng = np.random.default_rng(0)
    for mode in ("greedy", "sampled"):
        lines = []
        for i, prompt in enumerate(prompts):
            ids = tok.encode(prompt)
            resp = rng.integers(4, 8192, size=int(rng.integers(0, 9))).tolist() + [1] * (i % 2)
            text = tok.decode(resp, skip_special_tokens=True) if (mode, i) != ("sampled", 2) else "odd"
            lines.append(ra.record_line({"id": f"p{i}", "mode": mode, "prompt": prompt, "response": text,
                                         "prompt_ids": ids, "response_ids": resp,
                                         "finish_reason": "stop" if i % 2 else "length"}))
        (folder / f"{mode}.jsonl").write_text("".join(lines), encoding="utf-8")
    (folder / "settings.json").write_text(json.dumps({"seed": 0}, indent=2) + "\n", encoding="utf-8")
    (folder / "summary.json").write_text('{"modes": {}}\n', encoding="utf-8")


def test_pack_restore_is_byte_identical(tmp_path, tok):
    src, arc, out = tmp_path / "src", tmp_path / "arc", tmp_path / "out"
    _write_regen(src, tok)
    manifest = ra.pack(src, arc, tok)
    assert manifest["modes"]["greedy"]["rows"] == 3 and manifest["modes"]["sampled"]["rows"] == 3
    first = (arc / ra.ARCHIVE).read_bytes()
    ra.pack(src, tmp_path / "arc2", tok)
    assert (tmp_path / "arc2" / ra.ARCHIVE).read_bytes() == first, "packing is not deterministic"
    ra.restore(arc, out, tok)
    names = sorted(p.name for p in src.iterdir())
    assert sorted(p.name for p in out.iterdir()) == names
    for name in names:
        assert (out / name).read_bytes() == (src / name).read_bytes(), name


def test_tampered_archive_and_foreign_records_are_refused(tmp_path, tok):
    src, arc = tmp_path / "src", tmp_path / "arc"
    _write_regen(src, tok)
    ra.pack(src, arc, tok)
    data = bytearray((arc / ra.ARCHIVE).read_bytes())
    data[-30] ^= 1
    (arc / ra.ARCHIVE).write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256"):
        ra.restore(arc, tmp_path / "out", tok)
    rec = json.loads((src / "greedy.jsonl").read_text().splitlines()[0])
    (src / "greedy.jsonl").write_text(json.dumps({**rec, "assistant_mask": [1]}) + "\n")
    with pytest.raises(ValueError, match="not a plain regenerate record"):
        ra.pack(src, tmp_path / "arc3", tok)


def test_committed_archive_matches_its_manifest(tmp_path, tok):
    manifest = ra.check_archive(ARCHIVE)  # sha256 of regen.npz
    assert manifest["bytes"] <= 15 * 2**20
    assert set(manifest["modes"]) == {"greedy", "sampled"}
    ra.restore(ARCHIVE, tmp_path, tok)  # raises unless every <mode>.jsonl has the packed sha256
    for mode, m in manifest["modes"].items():
        recs = [json.loads(x) for x in (tmp_path / f"{mode}.jsonl").read_text().splitlines()]
        assert len(recs) == m["rows"] == 1400
        assert sum(len(r["prompt_ids"]) for r in recs) == m["prompt_tokens"]
        assert sum(len(r["response_ids"]) for r in recs) == m["response_tokens"]
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert settings["target"] == "assets/target" and settings["max_new_tokens"] == 192


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_archived_rows_are_the_shipped_targets_output(tmp_path, tok, mode):
    """The first batch of 16 (regenerate sorts prompts by length) generated again, with the run's
    per-batch seed, gives the archived rows token for token."""
    from train.regenerate import batch_seed

    ra.restore(ARCHIVE, tmp_path, tok)
    recs = [json.loads(x) for x in (tmp_path / f"{mode}.jsonl").read_text().splitlines()[:16]]
    settings = json.loads((tmp_path / "settings.json").read_text())
    target = sbj.load_target(ROOT / settings["target"])
    results = sbj.generate(target, [r["prompt_ids"] for r in recs], max_new_tokens=settings["max_new_tokens"],
                           seed=batch_seed(settings["seed"], mode, [r["id"] for r in recs]),
                           sampling=sbj.Sampling(0.0 if mode == "greedy" else settings["temperature"]),
                           options=sbj.DecodeOptions(batch_size=16))
    for rec, res in zip(recs, results):
        assert list(res.token_ids) == rec["response_ids"], rec["id"]
        assert res.stats.finish_reason == rec["finish_reason"]
