"""Shipped assets by name (issue 64 item 8): `--method eagle3` (any folder of assets/drafters/) and
`--prompts humaneval` (any assets/prompts/*.jsonl by its stem) resolve to the shipped files from any
working folder, for specblock-decode and specblock-bench; a path that exists there wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specblock_jax_cli.infer import decode

CHECKOUT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_shipped_names_resolve_from_any_folder_and_a_path_there_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    drafters = CHECKOUT / "assets" / "drafters"
    assert decode.shipped_prompts(Path("humaneval")) == CHECKOUT / "assets" / "prompts" / "humaneval.jsonl"
    for name in sorted(p.name for p in drafters.iterdir() if (p / "config.json").exists()):
        assert decode.shipped_method(name) == str(drafters / name)
        assert decode.method_record(decode.shipped_method(name)) == f"assets/drafters/{name}"
    assert decode.shipped_method("auto:specblock:num_nodes=12") == f"auto:{drafters / 'specblock'}:num_nodes=12"
    assert decode.shipped_method("eagle3:adapt=true") == f"{drafters / 'eagle3'}:adapt=true"
    assert decode.shipped_method("assets/drafters/dflash") == str(CHECKOUT / "assets/drafters/dflash")
    for same in ("ar", "prompt_lookup:num_nodes=5", "no_such_drafter", "auto:prompt_lookup"):
        assert decode.shipped_method(same) == same
    assert decode.shipped_prompts(Path("no_such_set")) == Path("no_such_set")
    # a file or folder of that name in the working folder wins over the shipped one
    (tmp_path / "humaneval").write_text('{"id": 1, "prompt": "x"}\n')
    (tmp_path / "eagle3").mkdir()
    assert decode.shipped_prompts(Path("humaneval")) == Path("humaneval")
    assert decode.shipped_method("eagle3:num_nodes=4") == "eagle3:num_nodes=4"


@pytest.mark.slow
def test_decode_and_bench_run_shipped_names_from_another_folder(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    common = ["--limit", "2", "--max-new-tokens", "4", "--compile-cache", str(tmp_path / "cache")]
    run = subprocess.run([str(BIN / "specblock-decode"), "--prompts", "humaneval", "--method", "eagle3",
                          "--out", "out.jsonl", "--batch-size", "1", *common],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    shipped = [json.loads(x) for x in (CHECKOUT / "assets/prompts/humaneval.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [r["id"] for r in shipped[:2]]
    assert {(r["settings"]["method"], r["settings"]["target"]) for r in rows} == {("assets/drafters/eagle3",
                                                                                   "assets/target")}
    run = subprocess.run([str(BIN / "specblock-bench"), "--prompts", "humaneval", "--methods", "eagle3",
                          "--out-dir", "bench", "--rounds", "1", "--warmup-prompts", "0", *common],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((tmp_path / "bench" / "results.json").read_text())
    assert results["meta"]["num_prompts"] == 2
    assert (tmp_path / "bench" / "outputs_eagle3_T0_b1.jsonl").exists()
