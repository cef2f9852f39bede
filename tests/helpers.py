"""Helpers shared by several test files (fixtures live in conftest.py; a test file never imports
another test file)."""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
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
    from specblock_jax.drafters.eagle3._train import Eagle3Task

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


def run_cli(main, args, capsys) -> tuple[int, str]:
    """(exit status, stderr stripped) of a command-line `main(args)`, a SystemExit's code included."""
    try:
        code = main(args)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err.strip()
