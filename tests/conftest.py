"""Shared fixtures: tiny random Hugging Face models built and saved in the test (no downloads)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# JAX's persistent compilation cache, shared by the xdist workers and by the command-line tools the
# tests start as subprocesses (they inherit these variables), and kept between local runs: an
# executable one process compiled, the others load instead of compiling it again. Every compile is
# cached, however short; the size cap turns on the cache's file lock, so no process reads a
# half-written entry. SBJ_TEST_JAX_CACHE="" turns it off.
_CACHE_DIR = os.environ.get("SBJ_TEST_JAX_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache", "jax"))
if _CACHE_DIR:
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.abspath(_CACHE_DIR))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 * 2**30))

# Step sizing's cost model is not measured for every loop a test decodes with (each measurement
# compiles and times the loop's step): without one a sized loop verifies the whole tree every step
# and compiles that size alone (decoding/speculative.py `step_ms`), as a fixed loop costs to
# compile; tests/test_sizing.py gives costs (sizes switching) and measures one model.
os.environ.setdefault("SPECBLOCK_JAX_STEP_COSTS", "off")

# The tests check what the code computes, not how fast XLA's code runs, and most of their time is
# XLA:CPU compiling (LLVM): compiling without LLVM's optimisations halves it (measured on
# test_speculative's random-tree tests: 23 executables, 104-116 s of XLA compile against 47-49 s).
# Subprocesses inherit it; the compilation cache keys on it.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

import jax
import numpy as np
import pytest

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def make_hf_model(kind: str, seed: int = 0):
    """A random tiny transformers model: 'qwen3' (tied), 'qwen3-untied', 'llama3' (llama3 rope
    scaling, untied) or 'llama-bias' (attention biases, tied)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    if kind.startswith("qwen3"):
        cfg = Qwen3Config(**TINY, head_dim=16, tie_word_embeddings=kind == "qwen3", eos_token_id=None)
        model = Qwen3ForCausalLM(cfg)
    elif kind == "llama3":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        cfg = LlamaConfig(**TINY, rope_parameters=rope, rms_norm_eps=1e-5, eos_token_id=None)
        model = LlamaForCausalLM(cfg)
    elif kind == "llama-bias":
        cfg = LlamaConfig(**TINY, attention_bias=True, tie_word_embeddings=True, eos_token_id=None)
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():  # HF initialises biases to zero; make them matter
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.5)
    else:
        raise ValueError(kind)
    with torch.no_grad():  # peaky attention, so that positions and masks visibly matter
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)
    return model.eval()


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory):
    """kind -> (folder with the saved HF model, the torch model)."""
    out = {}
    for kind in ("qwen3", "qwen3-untied", "llama3", "llama-bias"):
        model = make_hf_model(kind)
        path = tmp_path_factory.mktemp(kind)
        model.save_pretrained(path)
        out[kind] = (path, model)
    return out


@pytest.fixture(scope="module")
def target(request):
    """The module's tiny peaked target over its `V` tokens (helpers.peaked_tiny_target; one per
    vocabulary and process, so modules with the same V share it and its compiled loops)."""
    from helpers import peaked_tiny_target

    return peaked_tiny_target(request.module.V)


@pytest.fixture(scope="session")
def small_vocab_target():
    """The sampling tests' tiny peaked target over helpers_sampling.V tokens (clearly non-uniform)."""
    from helpers_sampling import peaked_target

    return peaked_target()


@pytest.fixture(scope="session")
def rng():
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """A random tiny Qwen3 saved with the shipped tokenizer (for the command-line tools)."""
    import specblock_jax as sbj

    tok = sbj.models.load_tokenizer("assets/tokenizer")
    cfg = sbj.models.config.tiny(vocab_size=len(tok), bos_token_id=0, eos_token_ids=(1,))
    path = tmp_path_factory.mktemp("tiny_target")
    sbj.save_target(sbj.init_target(cfg, seed=2, tokenizer=tok), path)
    return path


def _memory_maps() -> tuple[int, int]:
    """(memory maps this process holds, the kernel's per-process limit vm.max_map_count)."""
    try:
        with open("/proc/self/maps") as f:
            held = sum(1 for _ in f)
        with open("/proc/sys/vm/max_map_count") as f:
            return held, int(f.read())
    except (OSError, ValueError):
        return 0, 1


@pytest.fixture(autouse=True, scope="module")
def _release_executables_near_the_map_limit():
    """After a module, drops every cached executable if this worker holds more than half the
    kernel's memory maps. XLA:CPU maps each executable's code in many small sections; a worker
    that kept every executable of the suite alive crashed inside a later compilation (a segfault,
    and in a long bench "LLVM compilation error: Cannot allocate memory") at Linux's default
    vm.max_map_count of 65,530. Below the threshold executables stay cached, so later modules reuse
    them; above it they are reloaded from the persistent compilation cache."""
    yield
    held, limit = _memory_maps()
    if held < limit // 2:
        return
    import gc

    from specblock_jax.decoding.compiled import release

    release(0)
    jax.clear_caches()
    gc.collect()


# --- scheduling: the longest tests first ------------------------------------------------------------
# The xdist workers take tests in collection order, so a long test collected last runs alone while
# the other worker idles. tests/durations.json holds seconds per test id measured on a fresh clone
# here (a scheduling hint only: nothing asserts on it); the longest are collected first, the rest
# keep their order. `pytest --store-durations` rewrites it from the run's own durations.
_DURATIONS = os.path.join(os.path.dirname(__file__), "durations.json")


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help="write this run's per-test seconds (setup + call + teardown) to tests/durations.json")


def pytest_collection_modifyitems(config, items):
    import json

    try:
        with open(_DURATIONS) as f:
            seconds = json.load(f)
    except (OSError, ValueError):
        return
    items.sort(key=lambda item: -seconds.get(item.nodeid, 0.0))  # stable: unknown tests keep their order


_MEASURED: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _MEASURED[report.nodeid] = _MEASURED.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    import json

    if not session.config.getoption("--store-durations") or hasattr(session.config, "workerinput"):
        return  # only the controller (or a run without xdist) writes
    try:
        with open(_DURATIONS) as f:
            old = json.load(f)
    except (OSError, ValueError):
        old = {}
    old.update({k: round(v, 1) for k, v in _MEASURED.items()})
    with open(_DURATIONS, "w") as f:
        json.dump(dict(sorted(old.items(), key=lambda kv: -kv[1])), f, indent=0)
        f.write("\n")
