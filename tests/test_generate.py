"""Batched autoregressive `generate`: HF greedy parity, stop conditions, sampling, compilations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specblock_jax as sbj
from specblock_jax.decoding import compilation_count
from specblock_jax.decoding import compiled as compiled_mod

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], list(range(20, 40)), [3]]


@pytest.mark.parametrize("kind", ["qwen3", "llama3"])
def test_greedy_equals_transformers_argmax_decoding(hf_dirs, kind):
    path, model = hf_dirs[kind]
    target = sbj.load_target(path)
    results = sbj.generate(target, PROMPTS, max_new_tokens=24, options=sbj.DecodeOptions(batch_size=3))
    for prompt, res in zip(PROMPTS, results):
        with torch.no_grad():
            ref = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert res.token_ids == ref
        assert res.stats.finish_reason == "length" and res.stats.new_tokens == 24


def test_stop_token_ends_each_sequence_on_its_own(hf_dirs):
    target = sbj.load_target(hf_dirs["qwen3"][0])
    free = sbj.generate(target, PROMPTS, max_new_tokens=16)
    stop = free[0].token_ids[3]  # a token sequence 0 emits at step 3
    results = sbj.generate(target, PROMPTS, max_new_tokens=16, options=sbj.DecodeOptions(stop_tokens=[stop]))
    for f, r in zip(free, results):
        if stop in f.token_ids:
            cut = f.token_ids.index(stop) + 1
            assert r.token_ids == f.token_ids[:cut] and r.stats.finish_reason == "stop"
        else:
            assert r.token_ids == f.token_ids and r.stats.finish_reason == "length"
    assert results[0].token_ids[-1] == stop


def test_no_recompilation_for_new_prompts_in_the_same_bucket(hf_dirs):
    target = sbj.load_target(hf_dirs["qwen3"][0])
    sbj.generate(target, [[1, 2, 3], [4, 5]], max_new_tokens=8, options=sbj.DecodeOptions(batch_size=2))
    warm = compilation_count()
    sbj.generate(target, [[7] * 10, [9, 9, 9, 9]], max_new_tokens=8, seed=4,
                 sampling=sbj.Sampling(temperature=0.7, top_k=5, top_p=0.9),
                 options=sbj.DecodeOptions(batch_size=2))
    sbj.generate(target, [[2] * 16, [3]], max_new_tokens=8, options=sbj.DecodeOptions(batch_size=2))
    assert compilation_count() == warm
    sbj.generate(target, [[2] * 17, [3]], max_new_tokens=8, options=sbj.DecodeOptions(batch_size=2))  # next length bucket
    assert compilation_count() == warm + 1


def test_sampling_is_seeded_and_independent_of_batching(hf_dirs):
    target = sbj.load_target(hf_dirs["llama3"][0])
    kw = dict(max_new_tokens=12, sampling=sbj.Sampling(1.0), seed=7)
    a = sbj.generate(target, PROMPTS, **kw, options=sbj.DecodeOptions(batch_size=4))
    b = sbj.generate(target, PROMPTS, **kw, options=sbj.DecodeOptions(batch_size=1))
    c = sbj.generate(target, PROMPTS, **{**kw, "seed": 8}, options=sbj.DecodeOptions(batch_size=4))
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]
    greedy = sbj.generate(target, PROMPTS, max_new_tokens=12)
    top1 = sbj.generate(target, PROMPTS, max_new_tokens=12, seed=3, sampling=sbj.Sampling(temperature=1.0, top_k=1))
    assert [r.token_ids for r in greedy] == [r.token_ids for r in top1]


def test_text_prompts_are_tokenized_and_decoded(tmp_path, hf_dirs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained("assets/tokenizer", local_files_only=True)
    cfg = sbj.models.config.tiny(vocab_size=len(tok), bos_token_id=0, eos_token_ids=(1,))
    target = sbj.init_target(cfg, seed=1, tokenizer=tok)
    res = sbj.generate(target, ["def add(a, b):\n", "import os"], max_new_tokens=10)
    for r in res:
        assert r.text == tok.decode(r.token_ids, skip_special_tokens=True)
        assert len(r.token_ids) >= 1


@pytest.mark.slow
def test_a_new_executable_is_warmed_by_a_short_run_counted_as_compile_time(hf_dirs, monkeypatch):
    """`compiled(..., warm=)` runs a new executable once on the warm-up arguments (on CPU) and
    counts it as compile time; `generate`'s warm-ups cap every row's budget (two tokens, or one more
    step of a running stream) and leave the outputs as they were."""
    import time

    import jax
    import jax.numpy as jnp

    import importlib

    compiled_mod, decode_mod, refill_mod = (importlib.import_module(f"specblock_jax.decoding.{m}")
                                            for m in ("compiled", "runner", "refill"))

    calls = []

    def slow_warm(args):
        calls.append(args)
        time.sleep(0.2)
        return (args[0] + 1,)

    def double(x):
        return x * 2

    exe, seconds = compiled_mod.compiled(double, (), jnp.ones(3), warm=slow_warm)
    assert len(calls) == 1 and seconds >= 0.2
    assert compiled_mod.compiled(double, (), jnp.ones(3), warm=slow_warm) == (exe, 0.0) and len(calls) == 1

    target = sbj.load_target(hf_dirs["qwen3"][0])
    plain = [r.token_ids for r in sbj.generate(target, PROMPTS, max_new_tokens=9,
                                               options=sbj.DecodeOptions(batch_size=2, refill=True))]
    seen = []  # (name, budgets, warm-up budgets, generated or None, warm-up state copied)

    def recording(fn, static, *args, warm=None, **kw):
        if warm is not None and (fn, static, compiled_mod._signature(args), kw.get("donate_argnums", ())) \
                not in compiled_mod._EXECUTABLES:
            w = warm(args)
            if fn.__name__ == "decode_loop":  # (params, drafter params, inputs)
                seen.append((fn.__name__, np.asarray(args[2].budgets), np.asarray(w[2].budgets), None, None))
            elif fn.__name__ in ("run", "insert_rows"):  # (params, drafter params, state, ...)
                fresh = all(a is not b for a, b in zip(jax.tree.leaves(w[2]), jax.tree.leaves(args[2])))
                seen.append((fn.__name__, np.asarray(args[2].budgets), np.asarray(w[2].budgets),
                             np.asarray(args[2].generated), fresh))
            else:
                seen.append((fn.__name__, None, None, None, None))
        return compiled_mod.compiled(fn, static, *args, warm=warm, **kw)

    monkeypatch.setattr(decode_mod, "compiled", recording)
    monkeypatch.setattr(refill_mod, "compiled", recording)
    compiled_mod.release(0)  # every executable new again
    static = sbj.generate(target, PROMPTS, max_new_tokens=9, options=sbj.DecodeOptions(batch_size=4, refill=False))
    stream = sbj.generate(target, PROMPTS, max_new_tokens=9, options=sbj.DecodeOptions(batch_size=2, refill=True))
    assert [r.token_ids for r in static] == [r.token_ids for r in stream] == plain
    assert {"decode_loop", "start", "run", "insert_rows"} <= {name for name, *_ in seen}
    for name, budgets, warm_budgets, generated, fresh in seen:
        if name == "decode":  # budgets capped at two tokens
            assert budgets.tolist() == [9] * 4 and warm_budgets.tolist() == [2] * 4
        if name in ("run", "insert_rows"):  # a copy of the state, each row one step from its end
            assert fresh and (warm_budgets == np.minimum(budgets, generated + 1)).all()


def test_compiled_drops_the_oldest_executables_near_the_memory_map_limit(hf_dirs, monkeypatch):
    """XLA:CPU maps each executable's code in many sections: past MAP_SHARE of vm.max_map_count,
    `compiled` drops the oldest executables before compiling a new one, and decoding is unchanged."""
    target = sbj.load_target(hf_dirs["qwen3"][0])
    first = sbj.generate(target, PROMPTS, max_new_tokens=6, options=sbj.DecodeOptions(batch_size=2))
    held, evicted = compiled_mod.cached_count(), compiled_mod.evicted_count()
    assert held >= 1
    maps = compiled_mod.maps_in_use()
    if maps is None:
        pytest.skip("no /proc here: the guard is off")
    monkeypatch.setattr(compiled_mod, "map_limit", lambda: int(maps / compiled_mod.MAP_SHARE) // 2)  # over it now
    again = sbj.generate(target, PROMPTS, max_new_tokens=6, options=sbj.DecodeOptions(batch_size=4))
    assert compiled_mod.evicted_count() > evicted  # the old executables went before the new compile
    assert [r.token_ids for r in again] == [r.token_ids for r in first]
    monkeypatch.setattr(compiled_mod, "map_limit", lambda: None)  # no /proc: nothing is dropped
    mark = compiled_mod.evicted_count()
    sbj.generate(target, PROMPTS, max_new_tokens=6, options=sbj.DecodeOptions(batch_size=3))
    assert compiled_mod.evicted_count() == mark
