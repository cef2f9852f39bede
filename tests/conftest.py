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


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_executables():
    """Drops every cached executable after each test module. The suite compiles hundreds of XLA:CPU
    executables; kept alive together they crashed XLA inside a later compilation (segfault in the
    full run, not in any module alone), and no test reuses another module's executables."""
    yield
    import gc

    import jax

    from specblock_jax.decoding import compiled

    compiled._EXECUTABLES.clear()
    jax.clear_caches()
    gc.collect()


def peaked_tiny_target(vocab_size: int, seed: int = 7):
    """A random 4-layer tiny target without stop tokens whose LM head is scaled x15, so that its
    next-token distribution is far from uniform (drafters then have something to agree with)."""
    import specblock_jax as sbj

    t = sbj.init_target(sbj.models.config.tiny(vocab_size=vocab_size, num_layers=4, eos_token_ids=()),
                        seed=seed)
    params = dict(t.params)
    params["lm_head"] = params["lm_head"] * 15.0
    return t.replace(params=params)


def export_random_eagle3(ckpt, out) -> "object":
    """Writes a randomly initialised EAGLE-3 drafter folder for the target at `ckpt` to `out`
    (num_nodes 8, top-k 2, depth 3); returns the loaded target."""
    import jax

    import specblock_jax as sbj
    from specblock_jax.drafters.eagle3_train import Eagle3Task

    target = sbj.load_target(ckpt)
    task = Eagle3Task({"num_nodes": 8, "top_k": 2, "depth": 3}, target)
    task.export(task.init_params(jax.random.key(0)), str(out))
    return target


def train_on_fixed_batch(task, vocab_size: int, steps: int = 25, mask_last: bool = False):
    """`steps` Adam steps (lr 3e-3) of a TrainTask's jitted loss on one fixed random batch of 4 x 24
    tokens (the first 4 positions, and the last one with `mask_last`, out of the loss) with a fixed
    key. Returns (the loss at every step, the last step's metrics)."""
    import jax
    import jax.numpy as jnp
    import optax

    tokens = jnp.asarray(np.random.default_rng(4).integers(0, vocab_size, (4, 24)), jnp.int32)
    loss_mask = jnp.ones_like(tokens).at[:, :4].set(0)
    if mask_last:
        loss_mask = loss_mask.at[:, -1].set(0)
    batch = {"tokens": tokens, "loss_mask": loss_mask, "attention_mask": jnp.ones_like(tokens)}
    params = task.init_params(jax.random.key(0))
    opt = optax.adam(3e-3)
    state = opt.init(params)

    @jax.jit
    def step(params, state):
        (loss, metrics), grads = jax.value_and_grad(task.loss_fn, has_aux=True)(
            params, task.frozen(), batch, jax.random.key(0))
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss, metrics

    losses = []
    for _ in range(steps):
        params, state, loss, metrics = step(params, state)
        losses.append(float(loss))
    return losses, metrics
