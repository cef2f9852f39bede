"""BlockPilot's released policy (AMAP-ML/BlockPilot `utils/model.pt`) as our policy, and back.

Read from the public code (`utils/predict.py`, `dataset.py`, `benchmark.py`): `model.pt` is the
state dict of an MLP, stored in bfloat16,
    layers.0: Linear(V -> W), then layers.1 .. layers.{n-1}: Linear(W -> W), each followed by ReLU
    and dropout, layers i >= 1 adding their input after the ReLU; fc_out: Linear(W -> C)
(W = 2048, n = 2, C = 5 in the release), whose class c picks block size 14 + c for z-lab's
Qwen3-{4B,8B}-DFlash-b16. Its input is `output.logits` of the target's prefill with
`logits_to_keep=1`: the raw next-token logits after the prompt ([V] = 151,936 for Qwen3), not
probabilities, not top-k, not standardised. Ours is `PolicyConfig(sizes=(14, .., 18),
features="logits", residual="post_relu", width=W)` with mean 0 and std 1, the same function.

Refused, with the reason: a policy whose input width is not the target's vocabulary (features we
do not compute, e.g. one trained on hidden states), n != 2 hidden layers (our MLP has exactly one
W -> W layer), tensors the layout does not have; on export, a policy that reads other features,
adds its residual before the ReLU, standardises its input, or picks sizes other than 14..18
(their predictor adds 14 to the class). This module is numpy only: `specblock-convert blockpilot`
(train/convert.py) reads and writes model.pt with torch.
"""

from __future__ import annotations

import numpy as np

from specblock_jax.drafters.blockpilot._model import PolicyConfig

FIRST_SIZE = 14  # utils/predict.py: block = argmax + 14
DTYPE = "bfloat16"  # the release's dtype (predict.py runs the MLP in it)


def policy_from_state(state: dict[str, np.ndarray], vocab_size: int, first_size: int = FIRST_SIZE,
                      where: str = "model.pt") -> tuple[PolicyConfig, dict]:
    """(PolicyConfig, our policy params) of their state dict {name: [out, in] array}; `vocab_size`:
    the target's vocabulary, the width of the features we compute."""
    state = dict(state)
    hidden = sorted(k for k in state if k.startswith("layers."))
    expected = {f"layers.{i}.{p}" for i in range(len(hidden) // 2) for p in ("weight", "bias")}
    if set(hidden) != expected or {"fc_out.weight", "fc_out.bias"} - set(state):
        raise ValueError(f"{where}: tensors {sorted(state)} are not BlockPilot's MLP "
                         "(layers.N.{weight,bias}, fc_out.{weight,bias})")
    if len(hidden) // 2 != 2:
        raise ValueError(f"{where}: {len(hidden) // 2} hidden layers (n_layers); our policy MLP has "
                         "exactly two (input, one residual W -> W layer), as the release")
    w0, b0 = state.pop("layers.0.weight"), state.pop("layers.0.bias")
    w1, b1 = state.pop("layers.1.weight"), state.pop("layers.1.bias")
    wo, bo = state.pop("fc_out.weight"), state.pop("fc_out.bias")
    if state:
        raise ValueError(f"{where}: unexpected tensors {sorted(state)}")
    width, in_dim = w0.shape
    if in_dim != vocab_size:
        raise ValueError(f"{where}: the policy reads {in_dim} features; the features we compute are the "
                         f"target's raw logits ({vocab_size} tokens): trained for another vocabulary, or "
                         "on other features (hidden states?)")
    if w1.shape != (width, width) or wo.shape[1] != width or b0.shape != (width,) or b1.shape != (width,) \
            or bo.shape != (wo.shape[0],):
        raise ValueError(f"{where}: inconsistent shapes {[x.shape for x in (w0, b0, w1, b1, wo, bo)]}")
    policy = PolicyConfig(sizes=tuple(range(first_size, first_size + wo.shape[0])), features="logits",
                          vocab_size=vocab_size, width=width, residual="post_relu")
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    t = lambda x: np.ascontiguousarray(f32(x).T)  # noqa: E731 (safetensors writes the raw buffer)
    params = {"mean": np.zeros((in_dim,), np.float32), "std": np.ones((in_dim,), np.float32),
              "inp": {"kernel": t(w0), "bias": f32(b0)}, "mid": {"kernel": t(w1), "bias": f32(b1)},
              "out": {"kernel": t(wo), "bias": f32(bo)}}
    return policy, params


def state_from_policy(policy: PolicyConfig, params: dict) -> dict[str, np.ndarray]:
    """Their state dict (fp32 numpy, [out, in]) of our policy; ValueError with the reason when
    their predictor would not compute the same sizes."""
    why = []
    if policy.features != "logits":
        why.append(f"features {policy.features!r} (their predictor reads the raw logits)")
    if policy.residual != "post_relu":
        why.append("the residual is added before the ReLU (theirs after)")
    if tuple(policy.sizes) != tuple(range(FIRST_SIZE, FIRST_SIZE + len(policy.sizes))) or len(policy.sizes) != 5:
        why.append(f"sizes {tuple(policy.sizes)} (their predictor picks 14 + class of 5 classes)")
    mean, std = np.asarray(params["mean"]), np.asarray(params["std"])
    if np.any(mean != 0) or np.any(std != 1):
        why.append("input standardisation (theirs has none)")
    if why:
        raise ValueError("BlockPilot's model.pt cannot hold this policy: " + "; ".join(why))
    a = lambda x: np.asarray(x, np.float32)  # noqa: E731
    t = lambda x: np.ascontiguousarray(a(x).T)  # noqa: E731
    return {"layers.0.weight": t(params["inp"]["kernel"]), "layers.0.bias": a(params["inp"]["bias"]),
            "layers.1.weight": t(params["mid"]["kernel"]), "layers.1.bias": a(params["mid"]["bias"]),
            "fc_out.weight": t(params["out"]["kernel"]), "fc_out.bias": a(params["out"]["bias"])}
