"""Exact paired acceptance (adaptation/replay.py): replaying served sequences through a drafter's
tree builder and the greedy rule gives, per sequence, exactly the decoding steps that greedy
decoding with those weights takes, for weights that did not serve the sequences."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import specblock_jax as sbj
from specblock_jax.adaptation import AdaptConfig, Adapter
from specblock_jax.adaptation.replay import buffer_spans, replay_tau
from specblock_jax.drafters.dflash._train import DFlashTask
from specblock_jax.drafters.eagle3._train import Eagle3Task
from specblock_jax.drafters.specblock._train import SpecBlockTask

V = 32


def _weights(task, seed, scale):
    return task.decoding_drafter(jax.tree.map(lambda x: x * scale if x.ndim >= 2 else x,
                                              task.init_params(jax.random.key(seed))))


@pytest.mark.parametrize("kind", ["eagle3", "specblock", "dflash"])
@pytest.mark.slow
def test_replayed_steps_equal_real_greedy_decoding_for_other_weights(target, kind):
    if kind == "eagle3":
        task = Eagle3Task({"num_nodes": 10, "top_k": 3, "depth": 3}, target)
    elif kind == "specblock":
        task = SpecBlockTask({"num_nodes": 10, "num_blocks": 2}, target)
    else:
        task = DFlashTask({"num_layers": 1, "block_size": 4, "num_anchors": 2, "mask_token_id": 3}, target)
    served, other = _weights(task, 1, 1.0), _weights(task, 2, 3.0)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, V, rng.integers(3, 15)).tolist() for _ in range(6)]
    # serve with one weight set, collecting the sequences and features (the adapter never updates)
    ad = Adapter(served, AdaptConfig(cost_scale=1e9, prior_gain=0.0, window=64, capacity=8, min_rows=100))
    real = {"served": sbj.generate(target, prompts, drafter=served, adapter=ad, max_new_tokens=20,
                                   options=sbj.DecodeOptions(batch_size=6)),
            "other": sbj.generate(target, prompts, drafter=other, max_new_tokens=20,
                                  options=sbj.DecodeOptions(batch_size=6))}
    rows = ad.buffer.rows(list(range(6)))
    start, end = buffer_spans(rows["valid"], rows["loss_mask"])
    tokens = np.asarray(rows["tokens"])
    which = [next(i for i, p in enumerate(prompts) if tokens[r, :int(start[r])].tolist() == p) for r in range(6)]
    run = jax.jit(replay_tau, static_argnums=(0, 1))
    taus = {}
    for name, (d, params) in (("served", served), ("other", other)):
        steps, committed = run(d, V, params, rows["tokens"], rows["hidden"], start, end)
        res = [real[name][i] for i in which]
        assert steps.tolist() == [r.stats.target_forwards - 1 for r in res]
        assert committed.tolist() == [r.stats.new_tokens - 1 for r in res]
        taus[name] = float(np.sum(committed) / np.sum(steps))
    assert taus["served"] != taus["other"]  # the two weight sets differ on these sequences
