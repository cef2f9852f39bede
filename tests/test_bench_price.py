"""`specblock-bench --price TOPO,PRESET`: priced step columns from the TPU compiler beside the measured ones."""

from __future__ import annotations

import json

import pytest

from specblock_jax import aot
from specblock_jax.serving.auto import AutoServe
from specblock_jax.serving.methods import Method
from specblock_jax.drafters.base import LoadedDrafter
from specblock_jax_cli.infer import bench
from specblock_jax_cli.infer.bench_price import PRICED_KEYS, PriceSpec, Pricer, method_shape
import specblock_jax as sbj
from specblock_jax.drafters.prompt_lookup import PromptLookup

needs_libtpu = pytest.mark.skipif(not aot.topology.libtpu_installed(),
                                  reason="needs libtpu: pip install 'specblock-jax[tpu]'")

PL = sbj.LoadedDrafter(PromptLookup(), ())  # prompt lookup with its (empty) weights


def _prompts(tmp_path, n=2):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "prompt": "x = 1\ny = 2\n" * (i + 2)}) + "\n" for i in range(n)))
    return path


@needs_libtpu
def test_bench_prices_each_method_beside_the_measured_columns(tiny_ckpt, tmp_path, monkeypatch):
    calls = []
    real = aot.price_method
    monkeypatch.setattr(aot, "price_method", lambda *a, **k: calls.append((a[1], k.get("nodes"))) or real(*a, **k))
    out = tmp_path / "bench"
    # priced at the tiny checkpoint's own shapes (a preset name works the same; this compiles fastest)
    assert bench.main(["--target", str(tiny_ckpt), "--prompts", str(_prompts(tmp_path)), "--out-dir", str(out),
                       "--methods", "prompt_lookup", "--max-new-tokens", "8", "--rounds", "1",
                       "--warmup-prompts", "0", "--price", f"v5e:2x2,{tiny_ckpt}", "--price-context", "32"]) == 0
    assert sorted(calls, key=str) == [("ar", None), ("prompt_lookup", 8)]  # the method's own tree size
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["price"]["topology"] == "v5e:2x2" and data["meta"]["price"]["context"] == 32
    ar, pl = data["results"]
    assert set(PRICED_KEYS) <= set(ar) and set(PRICED_KEYS) <= set(pl)
    assert ar["priced_step_ms"] > 0 and ar["priced_speedup"] == 1.0 and ar["priced_draft_ms_per_token"] is None
    assert pl["priced_step_ms"] > 0 and pl["priced_draft_ms_per_token"] >= 0
    # this run's acceptance x the priced target-only step / the priced speculative step
    assert pl["priced_speedup"] == pytest.approx(pl["tau_run"] * ar["priced_step_ms"] / pl["priced_step_ms"])
    assert pl["speedup"] > 0 and pl["same_as_ar"] == 1.0  # the measured columns are still there
    md = (out / "results.md").read_text()
    assert "estimates, not measurements" in md and "acceptance (tau_run) from this run" in md
    assert "| priced step ms | priced speedup | priced draft ms/token |" in md
    assert f"{pl['priced_speedup']:.2f}x |" in md


def test_pricer_compiles_each_shape_once_and_prices_by_the_roofline(monkeypatch):
    """Each phase costs max(FLOPs / peak, bytes / bandwidth) on the chip (v5e: 197 TFLOP/s, 819
    GB/s), whatever libtpu's optimal_seconds says (None: its estimate was negative); a phase whose
    counts are unknown is not priced."""
    calls = []
    bw, peak = 819e9, 197e12

    def phase(seconds_by_bytes: float | None, flops: float = 1e9):
        return {"compiled": True, "optimal_seconds": None,
                "flops": None if seconds_by_bytes is None else flops,
                "bytes_accessed": None if seconds_by_bytes is None else seconds_by_bytes * bw}

    def fake(target, method, topology, **kw):  # the counts the TPU compiler would report
        calls.append((method, kw.get("nodes"), kw["batch"]))
        if method == "ar":
            return {"chip": "v5e", "phases": {"target_step": phase(0.002)}}
        # spec_step compute-bound: 0.003 s of FLOPs over 0.001 s of bytes
        return {"chip": "v5e", "phases": {"propose": phase(0.0002), "update": phase(None),
                                          "spec_step": phase(0.001, flops=0.003 * peak)}}

    for name, fn in (("require_libtpu", lambda: None), ("get_topology", lambda t: t),
                     ("load_target_config", lambda t: t), ("price_method", fake)):
        monkeypatch.setattr(aot, name, fn)
    pricer = Pricer(PriceSpec.parse("v5e:2x2,qwen3-8b", 512, 64))
    row = pricer.row(Method("prompt_lookup", PL), 2.5, 4)
    assert row["priced_step_ms"] == pytest.approx(3.0) and row["priced_speedup"] == pytest.approx(2.5 * 2 / 3)
    assert row["priced_draft_ms_per_token"] is None  # update's counts are unknown: not priced
    assert pricer.row(Method("prompt_lookup", PL), 1.5, 4)["priced_speedup"] == pytest.approx(1.5 * 2 / 3)
    assert pricer.row(Method("ar", None), 1.0, 4) == {"priced_step_ms": pytest.approx(2.0), "priced_speedup": 1.0,
                                        "priced_draft_ms_per_token": None}
    pricer.row(Method("prompt_lookup", PL), 2.0, 8)  # another batch is another compile
    assert calls == [("ar", None, 4), ("prompt_lookup", 8, 4), ("ar", None, 8), ("prompt_lookup", 8, 8)]


def test_price_without_libtpu_fails_before_decoding_and_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(aot.topology, "libtpu_installed", lambda: False)
    monkeypatch.setattr(bench.sbj, "load_target", lambda *a: pytest.fail("decoded without libtpu"))
    with pytest.raises(SystemExit, match=r"specblock-jax\[tpu\]"):
        bench.main(["--prompts", str(_prompts(tmp_path)), "--out-dir", str(tmp_path / "o"),
                    "--price", "v5e:2x2,qwen3-0.6b"])


@pytest.mark.parametrize("text", ["v5e:2x2", "v5e:2x2,", ",qwen3-8b", "v5e:2x2,qwen3-8b,x"])
def test_price_spec_names_its_form_on_a_bad_value(text):
    with pytest.raises(SystemExit, match="TOPOLOGY,PRESET"):
        PriceSpec.parse(text)


@needs_libtpu
def test_unknown_topology_or_preset_fails_before_decoding(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.sbj, "load_target", lambda *a: pytest.fail("decoded with a bad --price"))
    for price, message in (("v9z:2x2,qwen3-0.6b", "valid names include"), ("v5e:2x2,qwen9", "neither a preset")):
        with pytest.raises(SystemExit, match=message):
            bench.main(["--prompts", str(_prompts(tmp_path)), "--out-dir", str(tmp_path / "o"), "--price", price])


def test_method_shape_prices_the_methods_tree_or_block_size(tiny_ckpt):
    cfg = aot.load_target_config(str(tiny_ckpt))
    eagle, _ = aot.released_drafter("eagle3:top_k=2:depth=3", cfg, nodes=8)
    dflash, _ = aot.released_drafter("dflash", cfg, block=8)
    assert method_shape(Method("ar", None)) == {"method": "ar"}
    assert method_shape(Method("prompt_lookup", PL)) == {"method": "prompt_lookup", "nodes": 8}
    assert method_shape(Method("e", LoadedDrafter(eagle, ()))) == {"method": "eagle3:top_k=2:depth=3", "nodes": 8}
    assert method_shape(Method("d", LoadedDrafter(dflash, ()))) == {"method": "dflash", "block": 8}
    assert method_shape(Method("auto:prompt_lookup", PL, AutoServe(PL))) is None  # no one step to price


def test_a_price_cache_is_reused_by_a_later_pricer_on_the_same_code_and_missed_on_other_code(monkeypatch, tmp_path):
    from specblock_jax_cli.infer import bench_price

    calls = []

    def fake(target, method, topology, **kw):
        calls.append(method)
        rec = {"compiled": True, "optimal_seconds": None, "flops": 1e9, "bytes_accessed": 819e9 * 0.002}
        return {"chip": "v5e", "phases": {"target_step" if method == "ar" else "spec_step": rec}}

    for name, fn in (("require_libtpu", lambda: None), ("get_topology", lambda t: t),
                     ("load_target_config", lambda t: t), ("price_method", fake)):
        monkeypatch.setattr(aot, name, fn)
    spec = PriceSpec.parse("v5e:2x2,qwen3-8b", 512, 64)
    first = Pricer(spec, tmp_path)
    row = first.row(Method("prompt_lookup", PL), 2.0, 4)
    assert calls == ["ar", "prompt_lookup"] and set(first.sources.values()) == {"compiled"}
    again = Pricer(spec, tmp_path)
    assert again.row(Method("prompt_lookup", PL), 2.0, 4) == row and calls == ["ar", "prompt_lookup"]  # nothing compiled
    assert all(v.startswith("cache ") for v in again.sources.values()) and len(again.sources) == 2
    assert len(list(tmp_path.glob("*.json"))) == 2
    other_batch = Pricer(spec, tmp_path)
    other_batch.row(Method("prompt_lookup", PL), 2.0, 8)
    assert calls == ["ar", "prompt_lookup"] * 2  # another batch is another entry
    monkeypatch.setattr(bench_price, "code_digest", lambda: "other code")
    Pricer(spec, tmp_path).row(Method("prompt_lookup", PL), 2.0, 4)
    assert calls == ["ar", "prompt_lookup"] * 3  # the library changed: compiled again


def test_price_only_fills_the_cache_without_decoding_and_the_bench_then_compiles_nothing(
        tiny_ckpt, tmp_path, monkeypatch, capsys):
    calls = []

    def fake(target, method, topology, **kw):
        calls.append((method, kw["batch"]))
        rec = {"compiled": True, "optimal_seconds": None, "flops": 1e9, "bytes_accessed": 819e9 * 0.002}
        return {"chip": "v5e", "phases": {"target_step" if method == "ar" else "spec_step": rec}}

    for name, fn in (("require_libtpu", lambda: None), ("get_topology", lambda t: t),
                     ("load_target_config", lambda t: t), ("price_method", fake)):
        monkeypatch.setattr(aot, name, fn)
    args = ["--target", str(tiny_ckpt), "--prompts", str(_prompts(tmp_path)), "--out-dir", str(tmp_path / "b"),
            "--methods", "prompt_lookup", "--max-new-tokens", "8", "--rounds", "1", "--warmup-prompts", "0",
            "--price", "v5e:2x2,qwen3-8b", "--price-cache", str(tmp_path / "cache"), "--batch-size", "1,2"]
    real_generate = bench.sbj.generate
    monkeypatch.setattr(bench.sbj, "generate", lambda *a, **k: pytest.fail("decoded with --price-only"))
    assert bench.main(args + ["--price-only"]) == 0
    assert calls == [("ar", 1), ("prompt_lookup", 1), ("ar", 2), ("prompt_lookup", 2)]
    assert not (tmp_path / "b" / "results.json").exists()
    assert "batch 2 prompt_lookup: {\"spec_step\": 2.0} (compiled)" in capsys.readouterr().out
    monkeypatch.setattr(bench.sbj, "generate", real_generate)
    assert bench.main(args) == 0
    assert len(calls) == 4  # every step read from the cache
    sources = json.loads((tmp_path / "b" / "results.json").read_text())["meta"]["price"]["sources"]
    assert len(sources) == 4 and all(v.startswith("cache ") for v in sources.values())
    with pytest.raises(SystemExit, match="--price-only needs"):
        bench.main([a for a in args if a != str(tmp_path / "cache") and a != "--price-cache"] + ["--price-only"])


def test_a_row_switched_update_is_priced_as_the_runs_mix_of_buckets(monkeypatch, small_vocab_target):
    """SpecBlock's update switches on the rows a step committed; XLA prices the switch at its
    costliest branch. With the run's commit counts the bench prices each bucket alone and weighs
    them by the run's steps (issue 57 item 2), replaces the switch's update inside the step, and
    says which it did; without counts it says it priced the switch."""
    import jax

    from specblock_jax.drafters.specblock import SpecBlockTask

    bw = 819e9
    task = SpecBlockTask({"num_nodes": 10, "num_blocks": 2}, small_vocab_target)
    drafter = task.decoding_drafter(task.init_params(jax.random.key(0)))
    rows = drafter.drafter.update_rows
    assert rows == 2 * drafter.drafter.config.block_size + 1
    update_ms = {None: 0.5, 2: 0.2, 4: 0.3, rows: 0.45}
    calls = []

    def phase(ms):
        return {"compiled": True, "optimal_seconds": None, "flops": 1.0, "bytes_accessed": ms / 1e3 * bw}

    def fake(target, method, topology, **kw):
        calls.append((method, kw.get("row_bucket"), kw.get("phases_wanted")))
        if method == "ar":
            return {"chip": "v5e", "phases": {"target_step": phase(2.0)}}
        if kw.get("row_bucket") is not None:
            return {"chip": "v5e", "phases": {"update": phase(update_ms[kw["row_bucket"]])}}
        return {"chip": "v5e", "phases": {"propose": phase(0.4), "update": phase(update_ms[None]),
                                          "spec_step": phase(3.0)}}

    for name, fn in (("require_libtpu", lambda: None), ("get_topology", lambda t: t),
                     ("load_target_config", lambda t: t), ("price_method", fake)):
        monkeypatch.setattr(aot, name, fn)
    pricer = Pricer(PriceSpec.parse("v5e:2x2,qwen3-8b", 512, 64))
    commits = [0, 3, 1, 4, 2] + [0] * 6  # steps committing 1-2 tokens run bucket 2 (4), 3-4 bucket 4 (6)
    row = pricer.row(Method("specblock", drafter), 2.0, 1, commits)
    mix = (4 * 0.2 + 6 * 0.3) / 10
    assert row["priced_update"]["share_of_steps"] == {2: 0.4, 4: 0.6}
    assert row["priced_update"]["ms"] == pytest.approx(mix)
    assert row["priced_step_ms"] == pytest.approx(3.0 - 0.5 + mix)
    assert row["priced_draft_ms_per_token"] == pytest.approx((0.4 + mix) / 2.0)
    assert row["priced_speedup"] == pytest.approx(2.0 * 2.0 / (3.0 - 0.5 + mix))
    assert {c[1] for c in calls if c[1] is not None} == {2, 4}  # only the buckets that ran
    assert all(c[2] == ("update",) for c in calls if c[1] is not None)
    plain = pricer.row(Method("specblock", drafter), 2.0, 1)
    assert plain["priced_step_ms"] == pytest.approx(3.0) and "costliest" in plain["priced_update"]["by"]
