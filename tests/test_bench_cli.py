"""`specblock-bench`: methods side by side in one run, tables, JSON and a plot."""

from __future__ import annotations

import argparse
import gzip
import json
import re

import pytest

from helpers import export_random_eagle3
from specblock_jax.decoding.compiled import cached_count
from specblock_jax_cli.infer import bench, bench_report
from specblock_jax_cli.infer.auto_plot import plot_auto
from specblock_jax_cli.infer.labels import method_label
import specblock_jax as sbj
from specblock_jax.drafters.prompt_lookup import PromptLookup

PHASES_MS = ("propose_ms", "update_ms", "tree_forward_ms", "verify_ms", "forward_1_ms")
STEP_KEYS = {*PHASES_MS, "draft_ms_per_step", "verify_ms_per_step", "ideal_speedup", "achieved_over_ideal",
             "step_profiles", "calibrated", "calibrate_s", "calibration"}

PL = sbj.LoadedDrafter(PromptLookup(), ())  # prompt lookup with its (empty) weights


@pytest.mark.slow
def test_bench_writes_results_table_and_plot(tiny_ckpt, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    # prompts of one length (25 tokens, one length bucket): the loops compile once per batch size and T
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt": f"x = {i}\ny = 2\n" * 3}) + "\n"
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
        # 3 rounds (the default) of 1, 2 and 1 prompts; the pooled speedup is over their sums
        assert len(r["round_speedups"]) == 3 and sum(r["round_new_tokens"]) == r["new_tokens"]
        assert sum(r["round_wall_s"]) == pytest.approx(r["wall_s"])
    for r in rows:  # the step profile of every method
        assert STEP_KEYS <= set(r) and r["forward_1_ms"] > 0 and r["calibrated"] is None
        assert sum(p["steps"] for p in r["step_profiles"]) > 0
        assert r["achieved_over_ideal"] == pytest.approx(r["speedup"] / r["ideal_speedup"])
    ar0, pl0 = rows[0], rows[1]
    assert ar0["speedup"] == 1.0 and ar0["round_speedups"] == [1.0] * 3
    assert ar0["tau_median"] == 1.0 and ar0["draft_s_per_token"] == 0
    assert ar0["ideal_speedup"] == 1.0 and ar0["verify_ms_per_step"] is None and ar0["propose_ms"] is None
    assert pl0["same_as_ar"] == 1.0  # greedy speculative output is the target's own
    assert pl0["draft_s_per_token"] > 0
    assert all(pl0[k] > 0 for k in PHASES_MS)
    assert pl0["draft_ms_per_step"] == pytest.approx(pl0["propose_ms"] + pl0["update_ms"])
    assert pl0["verify_ms_per_step"] == pytest.approx(pl0["tree_forward_ms"] + pl0["verify_ms"])
    assert pl0["ideal_speedup"] == pytest.approx(pl0["tau_run"] * pl0["forward_1_ms"] / pl0["verify_ms_per_step"])
    assert 0 < pl0["draft_share"] < 1
    # the rows' commit counts, summed (what a row-switched update is priced by): each row's steps
    assert ar0["commit_hist"] is None and sum(pl0["commit_hist"]) == pl0["target_forwards"] - pl0["prompts"]
    assert data["meta"]["num_prompts"] == 4 and data["meta"]["machine"]["backend"] == "cpu"
    md = (out / "results.md").read_text()
    assert "| 0 | 2 | prompt_lookup |" in md and "4 prompts in 3 rounds" in md
    assert f"| {bench_report.speedup_cell(pl0)} |" in md
    for column in ("speedup [round min-max]", "draft ms/token", "verify ms/step", "1-token fwd ms", "calibrated (s)"):
        assert f"| {column} |" in md
    # the step profile's ideal speedup is noise on a shared CPU (issue 64): results.json keeps it, no table shows it
    assert "| ideal speedup |" not in md and "| achieved / ideal |" not in md
    assert rows[4]["speedup"] == 1.0 and rows[5]["same_as_ar"] == 1.0  # batch 3 has its own baseline
    assert (out / "speedup.png").read_bytes()[:4] == b"\x89PNG"
    lines = (out / "outputs_prompt_lookup_T0_b2.jsonl").read_text().splitlines()
    assert [json.loads(x)["token_ids"] for x in lines] == [
        json.loads(x)["token_ids"] for x in (out / "outputs_ar_T0_b3.jsonl").read_text().splitlines()]
    where, fastest, own = capsys.readouterr().out.rstrip("\n").splitlines()[-3:]  # the closing lines
    assert where == f"outputs: {out}/ (results.md, results.json, speedup.png, outputs_*.jsonl)"
    best = max(rows[1::2], key=lambda r: r["speedup"])
    assert bench_report.speedup_cell(best) in fastest and f"batch {best['batch_size']})" in fastest
    assert fastest.startswith("fastest: prompt_lookup," if best["speedup"] > 1 else "fastest: target-only;")
    cmd = own.removeprefix("your own model: specblock-bench ").split()
    assert cmd[:4] == ["--target", "/path/to/hf_model", "--prompts", "your_prompts.jsonl"]
    assert "--methods ar,prompt_lookup,/path/to/drafter --temperatures 0,1 --batch-size 2,3 " \
           "--max-new-tokens 16" in own
    assert bench.parse_args(cmd).target == "/path/to/hf_model"  # every flag printed exists


@pytest.mark.slow
def test_bench_runs_adaptation_next_to_the_plain_drafter(tiny_ckpt, tmp_path, monkeypatch):
    export_random_eagle3(tiny_ckpt, tmp_path / "eagle3")
    prompts = tmp_path / "p.jsonl"
    texts = [f"x = {i}\ny = 2\n" * 3 for i in range(6)]  # one length bucket
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt": t}) + "\n" for i, t in enumerate(texts)))
    out, calibrated_on, real_calibrate = tmp_path / "bench", [], bench.calibrate

    def calibrate(target, drafter, cal_prompts, *a, **kw):
        calibrated_on.append(list(cal_prompts))
        return real_calibrate(target, drafter, cal_prompts, *a, **kw)

    monkeypatch.setattr(bench, "calibrate", calibrate)
    held = cached_count()
    assert bench.main(["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out-dir", str(out),
                       "--methods", f"{tmp_path / 'eagle3'},prompt_lookup:calibrate=true", "--adapt",
                       "--max-new-tokens", "12", "--calibrate-prompts", "2", "--calibrate-grid", "num_nodes=3,6",
                       "--calibrate-grid", "depth=2",  # an EAGLE-3 knob: prompt lookup ignores it
                       "--adapt-settings", "cost_scale=0,min_rows=1,eval_rows=1,steps=1,window=32,batch_rows=1"]) == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    # the first 2 prompts calibrated and were left out of the measurement: no prompt is both
    assert calibrated_on == [texts[:2]] and all(r["prompts"] == 4 for r in rows)
    measured = [json.loads(x)["id"] for x in (out / "outputs_ar_T0_b1.jsonl").read_text().splitlines()]
    assert measured == ["2", "3", "4", "5"]
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert meta["calibration_prompts"] == {"source": str(prompts), "held_out": True, "ids": ["0", "1"]}
    assert "(ids 0, 1), excluded from measurement" in (out / "results.md").read_text()
    assert [method_label(r["method"]) for r in rows] == [
        "ar", "eagle3", "eagle3:adapt=true", "prompt_lookup:calibrate=true"]
    cal = rows[3]
    assert cal["calibration"]["prompts"] == 2 and [r["num_nodes"] for r in cal["calibration"]["table"]] == [3, 6]
    best = max(cal["calibration"]["table"], key=lambda r: r["tokens_per_s"])["num_nodes"]
    assert cal["calibrated"] == {"num_nodes": best} and cal["calibrate_s"] > 0 and cal["same_as_ar"] == 1.0
    assert cal["step_profiles"][0]["num_nodes"] == best  # it ran at the chosen setting
    assert f"num_nodes={best} (" in (out / "results.md").read_text()
    plain, adapted = rows[1], rows[2]
    assert adapted["same_as_ar"] == 1.0 and plain["adapt"] is None
    assert adapted["adapt"]["updates"] == 1 and adapted["adapt_s"] > 0
    assert adapted["wall_s"] == adapted["decode_s"] + adapted["adapt_s"]  # tokens/s counts updates
    assert sum(adapted["round_wall_s"]) == pytest.approx(adapted["wall_s"])  # each round counts its own
    events = [json.loads(x) for x in (out / "adapt_eagle3__adapt-true_T0_b1.jsonl").read_text().splitlines()]
    # rounds of 1, 2 and 1 prompts at batch 1: only round 2's first batch leaves a request queued in
    # its call, the only point where an update can still pay (nothing tells it of later rounds)
    assert [e["update"] for e in events] == [False, True, False, False]
    assert (out / "adapt_tau.png").read_bytes()[:4] == b"\x89PNG"
    assert cached_count() == held  # the run released every executable it compiled


def test_bench_rejects_bad_calibration_settings():
    with pytest.raises(SystemExit, match="no tree to calibrate"):
        bench.split_calibrate("ar:calibrate=true")
    assert bench.split_calibrate("x/eagle3:num_nodes=8:calibrate=true:adapt=true") == (
        "x/eagle3:num_nodes=8:adapt=true", True)
    assert bench.parse_grid(["num_nodes=8,16", "depth=3"]) == {"num_nodes": (8, 16), "depth": (3,)}
    with pytest.raises(SystemExit, match="unknown knob"):
        bench.parse_grid(["nodes=8"])


def test_bench_oracle_option_is_split_off_and_named_portably():
    """A kind's host-side setting (BlockPilot's oracle=, from the registry) is split off by name;
    one the drafter's kind does not have is refused naming the kind."""
    assert bench.split_host_settings("a/blockpilot:oracle=data/l/heldout:masked=false") == (
        "a/blockpilot:masked=false", {"oracle": "data/l/heldout"})
    assert bench.split_host_settings("a/dflash:block_size=4") == ("a/dflash:block_size=4", {})
    served = bench.Method("prompt_lookup", sbj.LoadedDrafter(PromptLookup(), ()))
    with pytest.raises(SystemExit, match="oracle= is not a setting of the prompt_lookup kind"):
        bench.apply_host_settings(served, {"oracle": "x"}, None, "prompt_lookup:oracle=x")
    row = {"method": "a/blockpilot:oracle=data/l/heldout", "temperature": 0.0, "batch_size": 8}
    assert bench_report.output_name(row) == "outputs_blockpilot__oracle-data-l-heldout_T0_b8.jsonl"


@pytest.mark.slow
def test_an_interrupted_bench_keeps_the_groups_it_finished(tiny_ckpt, tmp_path, monkeypatch):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt": "x = 1\n" * (i + 2)}) + "\n" for i in range(2)))
    out, real, calls = tmp_path / "bench", bench.run_rounds, []

    def dies_in_the_second_group(target, prompts, methods, temperature, batch_size, args, *rest):
        calls.append(temperature)
        if temperature == 1.0:
            raise KeyboardInterrupt  # the run is killed while the T=1 group decodes
        return real(target, prompts, methods, temperature, batch_size, args, *rest)

    monkeypatch.setattr(bench, "run_rounds", dies_in_the_second_group)
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out-dir", str(out),
                    "--methods", "prompt_lookup", "--temperatures", "0,1", "--max-new-tokens", "8"])
    data = json.loads((out / "results.json").read_text())
    assert calls == [0.0, 1.0] and data["meta"]["complete"] is False
    assert [(r["temperature"], r["method"]) for r in data["results"]] == [(0.0, "ar"), (0.0, "prompt_lookup")]
    assert len(list(out.glob("outputs_prompt_lookup_T0_b*.jsonl"))) == 1
    assert "partial" in (out / "results.md").read_text()


@pytest.mark.parametrize("broken", ["summarise", "compare"])
def test_a_reporting_bug_keeps_the_groups_decoding(broken, tiny_ckpt, tmp_path, monkeypatch):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt": "x = 1\n" * (i + 2)}) + "\n" for i in range(2)))

    def fails(*a, **k):
        raise TypeError("a bug in the summary")

    monkeypatch.setattr(bench, broken, fails)
    out = tmp_path / "bench"
    with pytest.raises(TypeError, match="a bug in the summary"):
        bench.main(["--target", str(tiny_ckpt), "--prompts", str(prompts), "--out-dir", str(out),
                    "--methods", "prompt_lookup", "--max-new-tokens", "8", "--rounds", "1", "--warmup-prompts", "0"])
    kept = json.load(gzip.open(out / "unreported_T0_b1.json.gz", "rt"))
    assert [k["method"] for k in kept] == ["ar", "prompt_lookup"]
    if broken == "summarise":  # raw results: every prompt's tokens and stats, and the rounds' timings
        assert all(len(k["results"]) == 2 and len(k["results"][0]["token_ids"]) == 8 for k in kept)
        assert kept[0]["results"][0]["target_forwards"] > 0 and len(kept[0]["rounds"]) == 1
    else:  # the summarised rows
        assert all(k["new_tokens"] == 16 for k in kept)


@pytest.mark.slow
def test_rounds_interleave_the_methods_without_changing_any_output(tiny_ckpt, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt": f"a = {i}\n" * 3}) + "\n" for i in range(5)))
    common = ["--target", str(tiny_ckpt), "--prompts", str(prompts), "--methods", "prompt_lookup",
              "--temperatures", "0,1", "--max-new-tokens", "12", "--batch-size", "2", "--warmup-prompts", "0"]
    assert bench.main([*common, "--out-dir", str(tmp_path / "one"), "--rounds", "1"]) == 0
    capsys.readouterr()
    assert bench.main([*common, "--out-dir", str(tmp_path / "three")]) == 0  # 3 rounds: the default
    log = capsys.readouterr().out
    # chunks of 2, 1 and 2 prompts, each decoded by both methods before the next chunk, in rotated order
    bars = re.findall(r"T=0 b=2 \S+ \[round \d/3\]", log)
    order = [b for i, b in enumerate(bars) if i == 0 or b != bars[i - 1]]  # a bar redraws its line
    assert order == ["T=0 b=2 ar [round 1/3]", "T=0 b=2 prompt_lookup [round 1/3]",
                     "T=0 b=2 prompt_lookup [round 2/3]", "T=0 b=2 ar [round 2/3]",
                     "T=0 b=2 ar [round 3/3]", "T=0 b=2 prompt_lookup [round 3/3]"]
    one = json.loads((tmp_path / "one/results.json").read_text())["results"]
    three = json.loads((tmp_path / "three/results.json").read_text())["results"]
    for a, b in zip(one, three):
        assert (a["method"], a["temperature"], b["prompts"]) == (b["method"], b["temperature"], 5)
        assert a["tau_median"] == b["tau_median"] and a["new_tokens"] == b["new_tokens"]
        assert a["tau_run"] == b["tau_run"] and a["target_forwards"] == b["target_forwards"]
    for name in ("outputs_prompt_lookup_T0_b2.jsonl", "outputs_prompt_lookup_T1_b2.jsonl"):  # sampled too
        assert (tmp_path / "one" / name).read_text() == (tmp_path / "three" / name).read_text()
    with pytest.raises(SystemExit) as exit_:
        bench.main([*common, "--out-dir", str(tmp_path / "x"), "--rounds", "0"])
    assert exit_.value.code == 2


def test_auto_decisions_plot_draws_every_auto_run(tmp_path):
    def events(options):
        return [{"chunk": i, "option": o, "why": "explore" if i < 3 else "fastest", "requests": 2}
                for i, o in enumerate(options)]

    rows = [{"method": "ar", "temperature": 0.0, "batch_size": 1},
            {"method": "auto:x/eagle3", "temperature": 0.0, "batch_size": 1,
             "auto_events": events(["ar", 8, 16, 8, 8, "ar"])},
            {"method": "auto:x/dflash", "temperature": 1.0, "batch_size": 1,
             "auto_events": events(["ar", 4, 8, "ar"])}]
    plot_auto(rows, tmp_path / "auto.png")
    assert (tmp_path / "auto.png").read_bytes()[:4] == b"\x89PNG"


def test_rounds_tell_the_adapter_and_auto_nothing_of_later_rounds(monkeypatch):
    """A server knows the requests it holds, not how many the job sends after them: every round's
    call gets the same adapter and auto method, which the bench never writes to."""
    class FakeAdapter:
        time_s = 0.0  # (bench reads the adapter's time per round)

        def __setattr__(self, name, value):
            raise AssertionError(f"the bench told the adapter {name}={value!r}")

    auto, held = bench.sbj.serving.AutoServe(PL), FakeAdapter()
    before = dict(vars(auto))
    seen = []

    served = bench.Method("auto:m", PL, auto)
    monkeypatch.setattr(served, "generate", lambda target, prompts, adapter=None, **kw: (
        seen.append((len(prompts), served.auto is auto, adapter is held)) or []))
    monkeypatch.setattr(bench, "prepare_method", lambda *a: {"method": "m", "served": served, "adapter": held,
                                                             "calibration": None})
    monkeypatch.setattr(bench, "summarise", lambda *a: {})
    args = argparse.Namespace(rounds=3, max_new_tokens=10, seed=0, no_refill=False, queue=0)
    bench.run_rounds(None, list(range(9)), ["m"], 0.0, 1, args)
    assert seen == [(3, True, True)] * 3
    assert vars(auto) == before  # nothing about the rounds still to come


def test_rotation_puts_every_method_in_every_position():
    for n in range(1, 7):
        methods = [f"m{i}" for i in range(n)]
        orders = [bench.rotation(methods, r) for r in range(n)]
        assert orders[0] == methods
        for r, order in enumerate(orders):
            assert order == [methods[(r + j) % n] for j in range(n)]  # a cyclic shift by r
        assert all(sorted(col) == methods for col in zip(*orders))  # each method once per position
        assert bench.rotation(methods, n + 1) == orders[1 % n]


def test_rounds_run_the_methods_in_rotated_order(monkeypatch):
    ran = []

    def fake_decode(target, prep, prompts, temperature, batch_size, args, start=0, results=None, **kw):
        ran.append((start, prep["method"]))
        return results

    monkeypatch.setattr(bench, "decode_prompts", fake_decode)
    monkeypatch.setattr(bench, "prepare_method", lambda target, m, *a: {"method": m, "adapter": None})
    monkeypatch.setattr(bench, "summarise", lambda prep, results, t, b, rounds: {"method": prep["method"],
                                                                                 "rounds": rounds})
    args = argparse.Namespace(rounds=4, max_new_tokens=8)
    rows = bench.run_rounds(None, list(range(8)), ["ar", "a", "b"], 0.0, 1, args)
    assert ran == [(0, "ar"), (0, "a"), (0, "b"), (2, "a"), (2, "b"), (2, "ar"),
                   (4, "b"), (4, "ar"), (4, "a"), (6, "ar"), (6, "a"), (6, "b")]
    assert [r["method"] for r in rows] == ["ar", "a", "b"]  # rows keep the methods' order
    assert all(r["rounds"] == [(0, 0.0)] * 4 for r in rows)  # one (tokens, seconds) per round


def test_speedup_is_pooled_over_rounds_with_the_per_round_range():
    def row(method, tokens, walls):
        return {"method": method, "temperature": 0.0, "batch_size": 1, "round_new_tokens": tokens,
                "round_wall_s": walls, "ideal_speedup": 2.0, "token_ids": [[1, 2]]}

    ar = row("ar", [100, 100, 100], [1.0, 2.0, 1.0])  # 100, 50, 100 tokens/s; pooled 300 / 4 s = 75
    m = row("x/eagle3", [100, 100, 100], [0.5, 2.5, 0.5])  # 200, 40, 200; pooled 300 / 3.5 s
    slow = row("prompt_lookup", [90, 100, 110], [1.0, 2.0, 1.0])  # 90, 50, 110; pooled 300 / 4 s
    bench_report.compare([ar, m, slow], 0.0)
    assert m["speedup"] == pytest.approx(8 / 7) and m["round_speedups"] == pytest.approx([2.0, 0.8, 2.0])
    assert bench_report.speedup_cell(m) == "1.14x [0.80-2.00]"  # pooled, not the mean of rounds (1.6)
    assert m["achieved_over_ideal"] == pytest.approx(4 / 7) and m["same_as_ar"] == 1.0
    assert bench_report.speedup_cell(ar) == "1.00x [1.00-1.00]"
    assert bench_report.speedup_cell(slow) == "1.00x [0.90-1.10]"
    lines = bench_report.closing_lines([ar, m, slow], "out", "specblock-bench ...")
    assert lines[1] == "fastest: eagle3, 1.14x [0.80-2.00] target-only's tokens/s (T=0, batch 1)"
    slow_only = bench_report.closing_lines([ar, slow], "out", "cmd")
    assert slow_only[1].startswith("fastest: target-only; the best other method, prompt_lookup, ran at 1.00x")
    unprofiled = {**row("auto:x/eagle3", [100, 100, 100], [1.0, 2.0, 1.0]), "ideal_speedup": None}
    bench_report.compare([ar, unprofiled], 0.0)  # its tree phases never profiled: no ideal
    assert unprofiled["speedup"] == pytest.approx(1.0) and unprofiled["achieved_over_ideal"] is None
    bench_report.compare([ar, m], 1.0)
    assert m["same_as_ar"] is None  # sampled: outputs differ by design


def test_calibration_prompts_are_disjoint_from_the_measured_ones(tmp_path):
    records = [{"id": str(i), "prompt": f"p{i}"} for i in range(6)]

    def args(**kw):
        return argparse.Namespace(**{"calibrate_prompts": 2, "calibrate_from": None, "limit": None,
                                     "prompts": tmp_path / "p.jsonl", **kw})

    assert bench.calibration_split(records, args(), False) == ([], records)  # no method calibrates
    cal, measured = bench.calibration_split(records, args(limit=3), True)
    assert cal == records[:2] and measured == records[2:5]  # held out, then --limit of the rest
    other = tmp_path / "cal.jsonl"
    other.write_text("".join(json.dumps({"id": f"c{i}", "prompt": f"c{i}"}) + "\n" for i in range(3)))
    cal, measured = bench.calibration_split(records, args(calibrate_from=other), True)
    assert [r["id"] for r in cal] == ["c0", "c1"] and measured == records
    other.write_text(json.dumps({"id": "c", "prompt": "p4"}) + "\n")
    with pytest.raises(SystemExit, match="measured record.s. 4 repeat a calibration prompt"):
        bench.calibration_split(records, args(calibrate_from=other), True)
    with pytest.raises(SystemExit, match="no prompt left to measure"):
        bench.calibration_split(records, args(calibrate_prompts=6), True)
