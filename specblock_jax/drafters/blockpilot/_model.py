"""BlockPilot: a per-request block size for the DFlash drafter, picked after prefill by a small MLP.

Features of the target's next-token distribution after the prompt (`Prefill.logits` [B, V], taken
at temperature 1):
    "topk": its k largest probabilities, sorted, and its entropy (k + 1 numbers)
    "full": the whole probability vector (V numbers)
    "logits": the raw logits (V numbers; what BlockPilot's released policy reads)
standardised with the training set's mean and std (stored with the policy). The policy is an MLP
Linear(F -> W) -> ReLU -> [Linear(W -> W) + residual -> ReLU] -> Linear(W -> C) over the C
candidate sizes (`sizes`, e.g. 14..18), trained with cross-entropy on oracle labels
(`_train.BlockPilotTask`, the kind's training task). With `residual` "post_relu" the
middle block is [ReLU(Linear(W -> W)) + residual], as in BlockPilot's released MLP
(drafters/blockpilot/_released.py).

`BlockPilotDrafter` wraps a `DFlashDrafter` whose static block size is max(sizes). Served by
`sbj.generate` (one device, no adapter, `masked` False), it is a routing drafter (serving/routed.py): each request
is routed to its chosen size after a prefill (`route`), and every size's requests are decoded by a
DFlash drafter of exactly that block size (`for_group`), so a size-b request drafts and verifies b
nodes. At batch > 1 (`pack`, the default) each batch of similar-length requests is served at the
largest size its rows chose, so a job of few requests is not split into part-filled batches
(`pack=false`: every request at exactly its own size). Inside one loop (under a mesh, with serving-time adaptation, `masked=True` (loading:
`masked=true`), or called directly) it masks:
`init_state` runs the policy on every row and stores the chosen sizes in the drafter state, so one
compiled loop serves any mix of sizes at the cost of max(sizes); `propose`/`update` are the DFlash
drafter's.

Folder layout (`save_blockpilot`): config.json {"kind": "blockpilot", "dflash_dir" (relative
to the folder, or absolute), "policy": PolicyConfig} + policy.safetensors.
"""

from __future__ import annotations

import dataclasses
import json
from typing import ClassVar
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import load_file, save_file

from specblock_jax.drafters.base import LoadedDrafter
from specblock_jax.drafters.dflash._model import DFlashDrafter
from specblock_jax.drafters.io import fill_params, flatten_params, load_drafter

FEATURE_KINDS = ("topk", "full", "logits")
RESIDUALS = ("pre_relu", "post_relu")


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    sizes: tuple[int, ...]  # candidate block sizes, class i -> sizes[i]
    features: str = "topk"  # "topk" | "full" | "logits"
    top_k: int = 32
    vocab_size: int = 0
    width: int = 256
    residual: str = "pre_relu"  # "pre_relu": relu(h + mid(h)) | "post_relu": relu(mid(h)) + h

    def __post_init__(self):
        if self.features not in FEATURE_KINDS or self.residual not in RESIDUALS:
            raise ValueError(f"policy features {self.features!r} / residual {self.residual!r}: "
                             f"choose from {FEATURE_KINDS} / {RESIDUALS}")

    @property
    def in_dim(self) -> int:
        return self.top_k + 1 if self.features == "topk" else self.vocab_size


def features(logits: jax.Array, kind: str, top_k: int = 32) -> jax.Array:
    """[B, V] next-token logits -> [B, F] fp32 features (module docstring)."""
    if kind not in FEATURE_KINDS:
        raise ValueError(f"features must be one of {FEATURE_KINDS}, got {kind!r}")
    if kind == "logits":
        return logits.astype(jnp.float32)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    p = jnp.exp(logp)
    if kind == "full":
        return p
    entropy = -jnp.sum(p * logp, axis=-1, keepdims=True)
    return jnp.concatenate([jax.lax.top_k(p, top_k)[0], entropy], axis=-1)


class PolicyMLP(nnx.Module):
    def __init__(self, c: PolicyConfig, rngs: nnx.Rngs):
        self.post_relu = c.residual == "post_relu"
        self.mean = nnx.Param(jnp.zeros((c.in_dim,)))
        self.std = nnx.Param(jnp.ones((c.in_dim,)))
        self.inp = nnx.Linear(c.in_dim, c.width, rngs=rngs)
        self.mid = nnx.Linear(c.width, c.width, rngs=rngs)
        self.out = nnx.Linear(c.width, len(c.sizes), rngs=rngs)

    def __call__(self, x, dropout: float = 0.0, key=None):
        """x [B, F] raw features -> [B, C] logits; dropout (training) needs a PRNG key."""
        def drop(h, k):
            if not dropout:
                return h
            return jnp.where(jax.random.bernoulli(k, 1 - dropout, h.shape), h / (1 - dropout), 0.0)

        keys = jax.random.split(key, 2) if dropout else (None, None)
        h = (x - self.mean[...]) / self.std[...]
        h = drop(jax.nn.relu(self.inp(h)), keys[0])
        if self.post_relu:
            h = drop(jax.nn.relu(self.mid(h)), keys[1]) + h
        else:
            h = drop(jax.nn.relu(h + self.mid(h)), keys[1])
        return self.out(h)


def init_policy(c: PolicyConfig, seed: int | jax.Array = 0) -> tuple[nnx.GraphDef, dict]:
    """(graphdef, params) of a randomly initialised policy (mean 0, std 1); seed: an int or a key."""
    graphdef, state = nnx.split(PolicyMLP(c, rngs=nnx.Rngs(seed)))
    return graphdef, nnx.to_pure_dict(state)


def choose(graphdef, params, c: PolicyConfig, logits: jax.Array) -> jax.Array:
    """[B, V] prefill logits -> [B] int32 chosen block sizes."""
    cls = jnp.argmax(nnx.merge(graphdef, params)(features(logits, c.features, c.top_k)), axis=-1)
    return jnp.asarray(c.sizes, jnp.int32)[cls]


@dataclasses.dataclass(frozen=True)
class BlockPilotDrafter:
    """DFlash drafting with a per-request block size. params = {"dflash": DFlash params,
    "policy": policy params}. `dflash.block_size` must be max(policy.sizes)."""

    kind: ClassVar[str] = "blockpilot"
    dflash: DFlashDrafter
    policy: PolicyConfig
    policy_graphdef: nnx.GraphDef = dataclasses.field(repr=False)  # not printed
    masked: bool = False  # True: one loop at max(sizes), smaller sizes masked (no routing)
    # routed at batch > 1: True serves each batch of similar-length requests at its rows' largest
    # chosen size (`pack`), so batches stay full; False splits batches by size, each request at
    # exactly its own (a job of few requests then decodes many part-filled batches)
    pack: bool = True

    def __post_init__(self):
        if self.dflash.block_size != max(self.policy.sizes):
            raise ValueError(f"the DFlash drafter's block size {self.dflash.block_size} must be "
                             f"max(sizes) = {max(self.policy.sizes)}")

    num_nodes = property(lambda self: self.dflash.num_nodes)
    # serving-time adaptation trains the DFlash drafter inside (adaptation/adapter.py)
    adapt_part = property(lambda self: (("dflash",), self.dflash))
    max_children = property(lambda self: self.dflash.max_children)
    hidden_ids = property(lambda self: self.dflash.hidden_ids)
    forwards_per_step = property(lambda self: self.dflash.forwards_per_step)

    @property
    def routes(self) -> bool:
        return not self.masked

    def route(self, params, logits):
        """[B, V] the target's logits after each prompt -> [B] int32 chosen block sizes."""
        return choose(self.policy_graphdef, params["policy"], self.policy, logits)

    def pack_group(self, sizes: list[int]) -> int | None:
        """The size a batch whose rows chose `sizes` is served at: the largest (an accelerator's
        step costs about the same at any of the window's sizes, and no row drafts less than it
        chose), or None with `pack` False (each request at its own size)."""
        return max(sizes) if self.pack else None

    def for_group(self, params, size: int) -> LoadedDrafter:
        """The DFlash drafter with block size `size` and its params: serves requests routed to it."""
        if size not in self.policy.sizes:
            raise ValueError(f"block size {size} is not one of the policy's sizes {self.policy.sizes}")
        return LoadedDrafter(dataclasses.replace(self.dflash, block_size=int(size)), params["dflash"])

    def init_state(self, params, prefill, max_len: int):
        block = choose(self.policy_graphdef, params["policy"], self.policy, prefill.logits)
        return self.dflash.init_state(params["dflash"], prefill, max_len, block=block)

    def propose(self, params, state, ctx, key):
        return self.dflash.propose(params["dflash"], state, ctx, key)

    def update(self, params, state, ctx, result, hidden):
        return self.dflash.update(params["dflash"], state, ctx, result, hidden)


def save_blockpilot(path: str | os.PathLike, policy: PolicyConfig, policy_params: dict, dflash_dir: str) -> Path:
    """Writes config.json (policy settings, the DFlash folder it drives) and policy.safetensors (fp32)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta = {"kind": BlockPilotDrafter.kind, "dflash_dir": dflash_dir, "policy": dataclasses.asdict(policy)}
    (path / "config.json").write_text(json.dumps(meta, indent=2))
    flat = {k: np.asarray(jax.device_get(v), np.float32) for k, v in flatten_params(policy_params).items()}
    save_file(flat, str(path / "policy.safetensors"), metadata={"format": "flax"})
    return path


def load_blockpilot(path, meta, target, dtype, decoding):
    """The `load` of the "blockpilot" kind (drafters/registry.py)."""
    raw = dict(meta["policy"])
    raw["sizes"] = tuple(raw["sizes"])
    policy = PolicyConfig(**raw)
    if policy.features in ("full", "logits") and policy.vocab_size != target.config.vocab_size:
        raise ValueError(f"{path}: policy trained for vocab {policy.vocab_size}, the target has "
                         f"{target.config.vocab_size}")
    decoding = dict(decoding)
    masked, pack = decoding.pop("masked", False), decoding.pop("pack", True)
    for name, value in (("masked", masked), ("pack", pack)):
        if not isinstance(value, bool):
            raise ValueError(f"{path}: {name} must be true or false, got {value!r}")
    dflash_dir = Path(meta["dflash_dir"])
    dflash_dir = dflash_dir if dflash_dir.is_absolute() else Path(path) / dflash_dir
    dflash, dparams = load_drafter(dflash_dir, target, dtype, **{**decoding, "block_size": max(policy.sizes)})
    graphdef, template = nnx.split(nnx.eval_shape(lambda: PolicyMLP(policy, rngs=nnx.Rngs(0))))
    params = _load_policy(Path(path), nnx.to_pure_dict(template))
    return BlockPilotDrafter(dflash, policy, graphdef, masked, pack), {"dflash": dparams, "policy": params}


def _load_policy(path: Path, template: dict) -> dict:
    flat = load_file(str(path / "policy.safetensors"))
    params = fill_params(template, flat, jnp.float32, str(path))
    if flat:
        raise ValueError(f"{path}: unexpected tensors {sorted(flat)}")
    return params
