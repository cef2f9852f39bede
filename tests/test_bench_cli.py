"""`specblock-bench`: methods side by side in one run, tables, JSON and a plot."""

from __future__ import annotations

import json

from conftest import export_random_eagle3
from infer import bench


def test_bench_writes_results_table_and_plot(tiny_ckpt, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt": "x = 1\ny = 2\n" * (i + 2)}) + "\n"
                               for i in range(4)))
    out = tmp_path / "bench"
    assert bench.main(["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out-dir", str(out),
                       "--methods", "prompt_lookup", "--temperatures", "0,1", "--max-new-tokens", "16",
                       "--batch-size", "2,3"]) == 0
    data = json.loads((out / "results.json").read_text())
    rows = data["results"]
    assert [(r["batch_size"], r["temperature"], r["method"]) for r in rows] == [
        (b, t, m) for b in (2, 3) for t in (0.0, 1.0) for m in ("ar", "prompt_lookup")]
    for r in rows:
        assert r["prompts"] == 4 and r["new_tokens"] > 0 and r["tokens_per_s"] > 0
        assert r["tau_min"] <= r["tau_median"] <= r["tau_max"]
    ar0, pl0 = rows[0], rows[1]
    assert ar0["speedup"] == 1.0 and ar0["tau_median"] == 1.0 and ar0["draft_s_per_token"] == 0
    assert pl0["same_as_ar"] == 1.0  # greedy speculative output is the target's own
    assert pl0["draft_s_per_token"] > 0
    assert data["meta"]["num_prompts"] == 4 and data["meta"]["machine"]["backend"] == "cpu"
    assert "| 0 | 2 | prompt_lookup |" in (out / "results.md").read_text()
    assert rows[4]["speedup"] == 1.0 and rows[5]["same_as_ar"] == 1.0  # batch 3 has its own baseline
    assert (out / "speedup.png").read_bytes()[:4] == b"\x89PNG"
    lines = (out / "outputs_prompt_lookup_T0_b2.jsonl").read_text().splitlines()
    assert [json.loads(x)["token_ids"] for x in lines] == [
        json.loads(x)["token_ids"] for x in (out / "outputs_ar_T0_b3.jsonl").read_text().splitlines()]


def test_bench_runs_adaptation_next_to_the_plain_drafter(tiny_ckpt, tmp_path):
    export_random_eagle3(tiny_ckpt, tmp_path / "eagle3")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt": "x = 1\ny = 2\n" * (i + 2)}) + "\n"
                               for i in range(4)))
    out = tmp_path / "bench"
    assert bench.main(["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out-dir", str(out),
                       "--methods", str(tmp_path / "eagle3"), "--adapt", "--max-new-tokens", "12",
                       "--adapt-settings", "cost_scale=0,min_rows=1,eval_rows=1,steps=1,window=32,batch_rows=1"]) == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [bench.method_label(r["method"]) for r in rows] == ["ar", "eagle3", "eagle3:adapt=true"]
    plain, adapted = rows[1], rows[2]
    assert adapted["same_as_ar"] == 1.0 and plain["adapt"] is None
    assert adapted["adapt"]["updates"] == 3 and adapted["adapt_s"] > 0
    assert adapted["wall_s"] == adapted["decode_s"] + adapted["adapt_s"]  # tokens/s counts updates
    events = [json.loads(x) for x in (out / "adapt_eagle3__adapt-true_T0_b1.jsonl").read_text().splitlines()]
    assert len(events) == 4 and sum(e["update"] for e in events) == 3
    assert (out / "adapt_tau.png").read_bytes()[:4] == b"\x89PNG"
