"""Ahead-of-time TPU compiles from this CPU (specblock_jax/aot, specblock-aot): the embedded
target's steps compile for v5e:2x2 with positive costs, the two layer accountings agree, a
configuration too large for the chip reports fits false with its numbers, clear errors for an
unknown topology and a missing libtpu, and decoding on the CPU is unchanged by libtpu. Also: decoding
keeps the rolled layer scan (only aot unrolls it), DFlash's target head is vocab-split, no libtpu
probe warnings on a CPU host, and phases without libtpu's estimate are priced by the roofline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from specblock_jax import _quiet, aot
from specblock_jax.aot import cost, report, topology
from specblock_jax.models import attention, kernel_cost
from specblock_jax.models.config import ModelConfig, RopeConfig, tiny
from specblock_jax.models.kv_cache import init_cache
from specblock_jax.models.target import init_target
from specblock_jax.models.transformer import apply, causal_mask
from specblock_jax.parallel.mesh import ShardingPlan, shard_bytes

ROOT = Path(__file__).resolve().parents[1]
TARGET = str(ROOT / "assets" / "target")
needs_libtpu = pytest.mark.skipif(not topology.libtpu_installed(),
                                  reason="libtpu is not installed (pip install 'specblock-jax[tpu]')")
COSTS = ("flops", "bytes_accessed")


def _compiled_with_costs(rec: dict) -> None:
    assert rec["compiled"], rec.get("error")
    assert all(rec[k] > 0 for k in COSTS), rec
    assert 0 < rec["device_bytes"] <= rec["hbm_bytes"] == 16 * 2**30 and rec["fits"]
    assert rec["compile_s"] > 0


@needs_libtpu
def test_embedded_target_only_step_compiles_for_v5e():
    out = aot.price_method(TARGET, "ar", "v5e:2x2", batch=2, context=64, max_new=32,
                           phases_wanted=("target_step",))
    assert out["chip"] == "v5e" and out["devices"] == 4 and out["mesh"] == "data=1,model=4"
    assert set(out["phases"]) == {"target_step"} and out["accounting"] == "unrolled"
    for rec in out["phases"].values():
        _compiled_with_costs(rec)


@needs_libtpu
def test_embedded_eagle3_step_compiles_for_v5e():
    out = aot.price_method(TARGET, str(ROOT / "assets" / "drafters" / "eagle3"), "v5e:2x2", batch=2,
                           context=64, max_new=32, phases_wanted=("spec_step",))
    assert out["nodes"] == 16
    assert set(out["phases"]) == {"spec_step"}
    for rec in out["phases"].values():
        _compiled_with_costs(rec)


def _small(num_layers: int) -> ModelConfig:
    """A small bf16 target with TPU-friendly widths (multiples of 128)."""
    return ModelConfig("qwen3", 2048, 256, 512, num_layers, 4, 2, 128, rope=RopeConfig(1e6),
                       max_position_embeddings=1024, dtype="bfloat16", eos_token_ids=(1,))


@needs_libtpu
def test_unrolled_and_multiplied_layer_accounting_agree():
    """XLA counts a loop body once: both accountings price all L layers. FLOPs agree within 2%
    (the compiler's bytes accessed are not linear in depth, see aot/price.py: not compared), and
    the rolled loop alone would have counted one layer of six."""
    kw = dict(batch=2, context=128, max_new=64, mesh="data=2,model=2", phases_wanted=("target_step",))
    unrolled = aot.price_method(_small(6), "ar", "v5e:2x2", accounting="unrolled", **kw)["phases"]["target_step"]
    mult = aot.price_method(_small(6), "ar", "v5e:2x2", accounting="multiplied", **kw)["phases"]["target_step"]
    assert unrolled["layer_loop"] == "unrolled" and mult["layer_loop"] == "multiplied"
    assert mult["flops"] == pytest.approx(unrolled["flops"], rel=0.02)
    assert mult["bytes_accessed"] > 0 and mult["fits"] and unrolled["fits"]
    one = aot.price_method(_small(1), "ar", "v5e:2x2", accounting="unrolled", **kw)["phases"]["target_step"]
    assert unrolled["flops"] > 4 * one["flops"]


def test_decoding_keeps_the_rolled_layer_scan_unless_aot_unrolls_it():
    """The target trainer's config (scan_unroll = L) unrolls only its cacheless forward: a forward
    with a KV cache still runs the rolled scan (one `while`), and aot's `cost.unrolled` config
    unrolls that too (no loop). Logits, hidden taps and the written cache are the same all ways."""
    cfg = tiny(num_layers=3, dtype="float32")
    trainer_cfg = cfg.replace(scan_unroll=3)
    params = init_target(cfg).params
    tokens = jnp.array([[5, 6, 7, 8]], jnp.int32)
    pos = jnp.arange(4, dtype=jnp.int32)[None]

    def run(c, cached):
        graphdef = init_target(c).graphdef
        fn = jax.jit(lambda p, cache: apply(graphdef, p, tokens, pos, causal_mask(1, 4), cache,
                                            hidden_ids=(1, 3)))
        cache = init_cache(c, 1, 16) if cached else None
        return fn.lower(params, cache).as_text(), fn(params, cache)

    text, ref = run(cfg, True)
    assert "stablehlo.while" in text  # decoding's default: the rolled scan
    outs = {}
    for name, c, cached, loops in (("trainer, cached", trainer_cfg, True, True),
                                   ("aot, cached", cost.unrolled(cfg), True, False),
                                   ("trainer, cacheless", trainer_cfg, False, False),
                                   ("default, cacheless", cfg, False, True)):
        text, outs[name] = run(c, cached)
        assert ("stablehlo.while" in text) == loops, name
    for name, out in outs.items():
        np.testing.assert_allclose(out.logits, ref.logits, rtol=1e-5, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(out.hidden, ref.hidden, rtol=1e-5, atol=1e-5, err_msg=name)
        if out.cache is not None:
            np.testing.assert_allclose(out.cache.k, ref.cache.k, rtol=1e-5, atol=1e-5, err_msg=name)
    assert cost.unrolled(cfg, 2).num_layers == 2 == cost.unrolled(cfg, 2).cache_scan_unroll


@needs_libtpu
def test_dflash_target_head_is_vocab_split():
    """DFlash's copy of the target's LM head ("head" [H, V], 1.24 GB at Qwen3-8B in bf16) is split
    over "model" like the target's own head and embedding, not replicated on every chip."""
    cfg = aot.load_target_config("qwen3-8b")
    _, dparams = aot.released_drafter("dflash", cfg)
    topo = aot.get_topology("v5e:2x2")
    plan = ShardingPlan(topology.topology_mesh(topo, "data=1,model=4"))
    sh = plan.param_shardings(dparams)
    assert sh["head"].spec == P(None, "model") and sh["embed"].spec == P("model", None)
    head = dparams["head"]
    assert head.shape == (4096, 151936)
    split = shard_bytes({"head": head}, {"head": sh["head"]})
    assert split == head.size * head.dtype.itemsize // 4


@needs_libtpu
def test_too_large_for_the_chip_reports_fits_false():
    """A 4M-token vocabulary at width 2048 (34 GB of bf16 embeddings) on replicated v5e chips."""
    big = ModelConfig("llama", 2**22, 2048, 4096, 1, 16, 8, 128, dtype="bfloat16")
    out = aot.price_method(big, "ar", "v5e:2x2", mesh="data=4,model=1", batch=4, context=64, max_new=32,
                           phases_wanted=("prefill",))
    rec = out["phases"]["prefill"]
    assert rec["fits"] is False
    assert rec["device_bytes"] > rec["hbm_bytes"] == 16 * 2**30, rec
    json.dumps(out)  # the record is JSON-ready


@needs_libtpu
def test_unknown_topology_lists_valid_names():
    for name in ("v9x:2x2", "v5p:1x1x1", "v5e"):
        with pytest.raises(aot.UnknownTopologyError) as err:
            aot.get_topology(name)
        assert name in str(err.value) and "v5e:2x2" in str(err.value) and "v5p:2x2x1" in str(err.value)


def test_missing_libtpu_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(topology, "libtpu_installed", lambda: False)
    with pytest.raises(aot.MissingLibtpuError, match=r"pip install 'specblock-jax\[tpu\]'"):
        aot.price_method(TARGET, "ar", "v5e:2x2")
    from specblock_jax_cli.infer import aot as cli

    assert cli.main(["--target", TARGET, "--method", "ar", "--topology", "v5e:2x2",
                     "--out", str(tmp_path / "x.json")]) == 2
    assert "specblock-jax[tpu]" in capsys.readouterr().err and not (tmp_path / "x.json").exists()


_DECODE = """
import json, sys
import jax
import specblock_jax as sbj
{extra}
target = sbj.load_target({target!r})
res = sbj.generate(target, [[5, 6, 7, 8, 9, 10]], max_new_tokens=12)
print(json.dumps({{"backend": jax.default_backend(), "tokens": [int(t) for t in res[0].token_ids]}}))
"""


def _decode(extra: str, env: dict) -> dict:
    code = _DECODE.format(extra=extra, target=TARGET)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_libtpu
def test_cpu_decoding_unchanged_by_libtpu():
    """Greedy decoding with libtpu installed and a TPU topology loaded in the same process equals
    decoding with JAX kept off libtpu (JAX_PLATFORMS=cpu), and stays on the CPU backend."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    plain = _decode("", {**env, "JAX_PLATFORMS": "cpu"})
    with_tpu = _decode("from specblock_jax import aot; aot.get_topology('v5e:2x2')", env)
    assert plain["backend"] == with_tpu["backend"] == "cpu"
    assert len(plain["tokens"]) == 12 and with_tpu["tokens"] == plain["tokens"]
    assert jax.default_backend() == "cpu"


_PROBE = "import specblock_jax, jax; jax.numpy.ones(1); print(jax.default_backend())"


@needs_libtpu
@pytest.mark.skipif(_quiet.tpu_chip_present() or _quiet.gpu_plugin_installed(),
                    reason="a host with an accelerator: JAX must probe for it")
def test_no_libtpu_probe_warnings_on_a_cpu_host(tmp_path):
    """With libtpu installed and JAX_PLATFORMS unset, bare JAX probes for a TPU (libtpu prints
    its warnings to stderr); importing specblock_jax skips the probe and stays on the CPU. (libtpu
    is silent when another process holds its lock file: ALLOW_MULTIPLE_LIBTPU_LOAD makes the
    probe run whatever else runs on the host.)"""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"} | {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}

    def run(code):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    bare = run("import jax; jax.numpy.ones(1)")
    assert "TPU" in bare.stderr  # the probe the package default avoids
    ours = run(_PROBE)
    assert ours.stdout.strip() == "cpu"
    assert "TPU" not in ours.stderr and "libtpu" not in ours.stderr, ours.stderr


def test_cpu_default_leaves_accelerators_and_user_choice_alone(monkeypatch):
    """No "cpu" default on a TPU VM, with a GPU plugin, or when the user set JAX_PLATFORMS."""
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(_quiet, "tpu_chip_present", lambda: True)
    assert _quiet.cpu_unless_accelerator() is False
    monkeypatch.setattr(_quiet, "tpu_chip_present", lambda: False)
    monkeypatch.setattr(_quiet, "gpu_plugin_installed", lambda: True)
    assert _quiet.cpu_unless_accelerator() is False
    monkeypatch.setattr(_quiet, "gpu_plugin_installed", lambda: False)
    monkeypatch.setenv("JAX_PLATFORMS", "")
    assert _quiet.cpu_unless_accelerator() is False


def test_negative_compiler_estimate_is_labelled_and_priced_by_the_roofline():
    """libtpu's optimal_seconds is negative (no estimate) for many programs: the record keeps None,
    the table says so, and the phase is priced by max(FLOPs / peak, bytes / bandwidth)."""
    raw = {"optimal_seconds": -1.0, "flops": 197e9, "bytes_accessed": 2 * 819e6}  # 1 ms of FLOPs, 2 of bytes
    priced = cost.checked(raw)
    assert priced["optimal_seconds"] is None and cost.multiplied(raw, raw, 4)["optimal_seconds"] is None
    rec = {"compiled": True, **priced, "device_bytes": 2**30, "hbm_bytes": 16 * 2**30, "fits": True,
           "compile_s": 1.0}
    result = {"target": "t", "method": "ar", "topology": "v5e:2x2", "chip": "v5e", "mesh": "data=1,model=4",
              "batch": 1, "context": 8, "nodes": 0, "phases": {"target_step": rec}}
    assert report.roofline_seconds(rec, "v5e") == pytest.approx(0.002)
    assert report.step_seconds(result) == pytest.approx(0.002)
    assert report.step_seconds(result, key="optimal") is None
    row = report.markdown_table([result]).splitlines()[-1]
    assert "| 2.000 | no estimate |" in row
    ok = {**rec, "optimal_seconds": 0.0021}
    assert "| 2.000 | 2.100 |" in report.markdown_table([{**result, "phases": {"target_step": ok}}])


@needs_libtpu
@pytest.mark.parametrize("method", ["specblock", "eagle3"])
def test_drafter_input_projections_and_kv_cache_split_over_model(method):
    """Issue 57: at Qwen3-8B shapes on a v5e:2x2 mesh (model = 4), the drafters' input projections
    (fc; SpecBlock's fuse and shift) and the drafter KV cache in the loop state hold a quarter of
    their bytes per device (they were replicated), while the batch split stays."""
    from specblock_jax.aot import phases
    from specblock_jax.decoding.loop import make_loop
    from specblock_jax.models.kv_cache import cache_length
    from specblock_jax.models.target import abstract_target

    cfg = aot.load_target_config("qwen3-8b")
    drafter, dparams = aot.released_drafter(method, cfg)
    plan = ShardingPlan(topology.topology_mesh(aot.get_topology("v5e:2x2"), "data=1,model=4"))
    sh = plan.param_shardings(dparams)
    names = ["fc", "fuse", "shift"] if method == "specblock" else ["fc"]
    for name in names:
        w = dparams["draft"][name]
        assert shard_bytes(w, sh["draft"][name]) == w.size * w.dtype.itemsize // 4, name
    graphdef, params = abstract_target(cfg)
    loop = make_loop(graphdef=graphdef, cfg=cfg, drafter=drafter, cache_len=cache_length(256, 64, drafter.num_nodes),
                     max_new=64, greedy=True)
    inputs = phases.abstract_inputs(plan, 1, 256)
    state = jax.eval_shape(lambda p, d, i: phases.prefill(loop, plan, p, d, i), params, dparams, inputs)
    cache = state.drafter_state.cache
    cache_sh = phases.state_shardings(plan, state, 1).drafter_state.cache
    total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
    assert shard_bytes(cache, cache_sh) == total // 4
    assert all(s.spec == P(None, "model", None, None) for s in jax.tree.leaves(cache_sh))


def test_forced_row_bucket_traces_one_branch_of_the_update_switch():
    """Pricing SpecBlock's update per bucket (issue 57 item 2): under `forced_row_bucket(n)` the row
    switch traces only the bucket holding n rows (no conditional left), and that branch computes
    what the switch computes when the step committed n rows."""
    from specblock_jax.drafters.common import bucket_of, forced_row_bucket, row_buckets, switch_on_rows

    assert row_buckets(9) == (2, 4, 9) and [bucket_of(c, 9) for c in (1, 2, 3, 4, 5, 9)] == [2, 2, 4, 4, 9, 9]
    x = jnp.arange(9.0)

    def update(count):  # a new function per trace: JAX reuses traces of one (price_method clears them)
        return switch_on_rows(count, 9, lambda r, v: v[:r].sum(), x)

    count = jnp.asarray([1, 3])  # the batch's largest: 3 rows -> bucket 4
    assert "cond" in str(jax.make_jaxpr(lambda c: update(c))(count))
    with forced_row_bucket(3):
        jaxpr = str(jax.make_jaxpr(lambda c: update(c))(count))
        forced = update(count)
    assert "cond" not in jaxpr
    assert float(forced) == float(update(count)) == 6.0  # 0 + 1 + 2 + 3


def test_kernel_calls_are_counted_in_the_hlo_and_analytic_costs_added():
    """Each tagged kernel's custom calls are counted across multi-line instructions; analytic
    kernels add calls x their cost, a CostEstimate kernel adds nothing (the compiler counts it)."""
    hlo = ('%a = f32[8]{0} custom-call(%p), custom_call_target="tpu_custom_call", backend_config={\n'
           '"x": 1}, metadata={op_name="jit(f)/sbj_kernel_splash_causal_0/pallas_call"}\n'
           '%b = f32[8]{0} custom-call(%a), metadata={op_name="jit(f)/sbj_kernel_splash_causal_0/pallas_call"}\n'
           '%c = f32[8]{0} add(%b, %b), metadata={op_name="jit(f)/sbj_kernel_splash_causal_0/add"}\n'
           '%d = f32[8]{0} custom-call(%c), metadata={op_name="jit(f)/sbj_kernel_cache_prefix_1/pallas_call"}\n')
    log = {"sbj_kernel_splash_causal_0": kernel_cost.KernelCost("splash_causal", 459e12, 0.0, 0.0, "analytic"),
           "sbj_kernel_cache_prefix_1": kernel_cost.KernelCost("cache_prefix", 1e12, 1e9, 0.0, "CostEstimate"),
           "sbj_kernel_unused_2": kernel_cost.KernelCost("unused", 1.0, 1.0, 0.0, "analytic")}
    calls = cost.kernel_calls(hlo, log)
    assert [(k["name"], k["calls"]) for k in calls] == [("splash_causal", 2), ("cache_prefix", 1)]
    base = {"optimal_seconds": 0.001, "flops": 1e9, "bytes_accessed": 1e6}
    out = cost.with_kernels(base, calls, topology.CHIPS["v5p"])
    assert out["flops"] == 1e9 + 2 * 459e12 and out["bytes_accessed"] == 1e6
    assert out["optimal_seconds"] == pytest.approx(0.001 + 2.0)  # 1 s of FLOPs at v5p's peak, per call
    assert cost.kernel_label(calls) == "splash_causal x2 analytic; cache_prefix x1 CostEstimate"


@needs_libtpu
def test_pallas_attention_compiles_for_tpu_and_a_step_costs_at_least_its_kernels(monkeypatch):
    """Cascade attention on v5e:2x2: the prompt runs splash attention (prompts from 256 tokens
    here, to keep the compile small) and the one-token step the committed-prefix kernel, one call
    per layer each; the priced phase's FLOPs and roofline time are at least the kernels'
    arithmetic at peak (the compiler alone sees no FLOPs in splash)."""
    monkeypatch.setattr(attention, "PREFILL_ROWS", 256)
    out = aot.price_method(_small(2), "ar", "v5e:2x2", batch=2, context=256, max_new=64, attention="cascade",
                           phases_wanted=("prefill", "target_step"))
    peak = topology.CHIPS["v5e"].bf16_tflops * 1e12
    for phase, name, source in (("prefill", "splash_causal", "analytic"), ("target_step", "cache_prefix", "CostEstimate")):
        rec = out["phases"][phase]
        assert rec["compiled"] and rec["fits"], rec.get("error")
        (kernel,) = [k for k in rec["kernels"] if k["name"] == name]
        assert kernel["calls"] == 2 and kernel["source"] == source
        work = kernel["calls"] * kernel["flops"]
        assert rec["flops"] >= work > 0
        assert report.roofline_seconds(rec, "v5e") >= work / peak
