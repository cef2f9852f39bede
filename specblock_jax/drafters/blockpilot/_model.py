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

`BlockPilotDrafter` wraps a `DFlashDrafter` whose static block size is max(sizes). Every row
drafts and verifies at its own chosen size inside one batch: `init_state` runs the policy on the
prefill's logits (the batch's one prefill; no second one) and stores each row's size in the
DFlash state (`block` [B]), and the DFlash drafter masks the block slots past it (a row of size b
drafts b - 1 tokens, a tree of b valid nodes). `sbj.generate` (decoding/sized.py) then reads the
chosen sizes once per batch on the host and runs the batch's decoding loop compiled at the
*largest size its rows chose* (`at_size`): a batch whose rows all chose small sizes does not pay
for max(sizes), and a job compiles at most len(sizes) loops. With continuous batching (refill)
the stream re-reads its live rows' sizes at every return to the host (each refill) and runs the
next segment at their largest, so a refilled request never drafts less than it chose. Under a
mesh the loop is one executable with the prefill inside: it runs at max(sizes), every row still
masked to its own size. `stats.block_size` is each request's chosen size.

`oracle` (measurements: `specblock-bench`'s `:oracle=LABELS`): a table prompt token ids -> size
that replaces the policy's choice on the host after the prefill (`given_sizes`); a prompt missing
from it is an error.

Pairing: a policy is trained on labels measured with one DFlash drafter (a label folder's
settings.json names it). `save_blockpilot(..., labels_dflash=...)` records the SHA-256 of that
drafter's model.safetensors in config.json ("labels_dflash_sha256"); `load_blockpilot` checks it
against the DFlash folder it drives and refuses a mismatch (a folder without the field loads,
with a warning).

Decoding keys of earlier folders: "masked" and "pack" (the retired routing serving) are read and
ignored with a DeprecationWarning: every batch now serves per-row sizes in one loop.

Folder layout (`save_blockpilot`): config.json {"kind": "blockpilot", "dflash_dir" (relative
to the folder, or absolute), "policy": PolicyConfig} + policy.safetensors.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import ClassVar, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import load_file, save_file

from specblock_jax import writing
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
    "policy": policy params}. `dflash.block_size` must be max(policy.sizes).

    size: the static block size of the loop this drafter drafts in (0: max(sizes)); rows that
    chose less are masked to their size (`at_size`). oracle: prompt token ids -> size, given on
    the host in place of the policy's choice (module docstring); not part of equality, so an
    oracle shares the policy's compiled loops."""

    kind: ClassVar[str] = "blockpilot"
    dflash: DFlashDrafter
    policy: PolicyConfig
    policy_graphdef: nnx.GraphDef = dataclasses.field(repr=False)  # not printed
    size: int = 0
    oracle: Mapping[tuple[int, ...], int] | None = dataclasses.field(default=None, compare=False, hash=False,
                                                                     repr=False)

    def __post_init__(self):
        if self.dflash.block_size != max(self.policy.sizes):
            raise ValueError(f"the DFlash drafter's block size {self.dflash.block_size} must be "
                             f"max(sizes) = {max(self.policy.sizes)}")
        if self.size and self.size not in self.policy.sizes:
            raise ValueError(f"block size {self.size} is not one of the policy's sizes {self.policy.sizes}")

    @property
    def served(self) -> DFlashDrafter:
        """The DFlash drafter at the loop's static block size."""
        return dataclasses.replace(self.dflash, block_size=self.size) if self.size else self.dflash

    num_nodes = property(lambda self: self.served.num_nodes)
    # serving-time adaptation trains the DFlash drafter inside (adaptation/adapter.py)
    adapt_part = property(lambda self: (("dflash",), self.dflash))
    max_children = property(lambda self: self.dflash.max_children)
    hidden_ids = property(lambda self: self.dflash.hidden_ids)
    forwards_per_step = property(lambda self: self.dflash.forwards_per_step)

    # -- per-row sizes chosen at the prefill (the protocol decoding/sized.py reads) --
    def at_size(self, size: int) -> "BlockPilotDrafter":
        """This drafter in a loop compiled at static block size `size` (rows above it draft at it)."""
        return dataclasses.replace(self, size=int(size))

    def row_sizes(self, state) -> jax.Array:
        """[B] int32 each row's chosen block size, from the drafter state."""
        return state.block

    def with_row_sizes(self, state, sizes: jax.Array):
        return state._replace(block=jnp.clip(sizes.astype(jnp.int32), 1, self.dflash.block_size))

    def given_sizes(self, ids: Sequence[Sequence[int]]) -> list[int] | None:
        """The oracle's sizes of prompts `ids` (host), or None without an oracle (the policy chooses)."""
        if self.oracle is None:
            return None
        out = []
        for i, toks in enumerate(ids):
            size = self.oracle.get(tuple(int(t) for t in toks))
            if size is None:
                raise ValueError(f"oracle: prompt {i} ({len(toks)} tokens) has no entry in the oracle's table")
            if size not in self.policy.sizes:
                raise ValueError(f"oracle: size {size} is not one of the policy's sizes {self.policy.sizes}")
            out.append(int(size))
        return out

    def init_state(self, params, prefill, max_len: int):
        block = choose(self.policy_graphdef, params["policy"], self.policy, prefill.logits)
        return self.dflash.init_state(params["dflash"], prefill, max_len, block=block)

    def propose(self, params, state, ctx, key):
        return self.served.propose(params["dflash"], state, ctx, key)

    def update(self, params, state, ctx, result, hidden):
        return self.served.update(params["dflash"], state, ctx, result, hidden)


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_blockpilot(path: str | os.PathLike, policy: PolicyConfig, policy_params: dict, dflash_dir: str,
                    labels_dflash: str | os.PathLike | None = None) -> Path:
    """Writes config.json (policy settings, the DFlash folder it drives) and policy.safetensors (fp32).
    labels_dflash: the DFlash folder the policy's training labels were measured with; the SHA-256
    of its model.safetensors goes into config.json ("labels_dflash_sha256", module docstring)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta = {"kind": BlockPilotDrafter.kind, "dflash_dir": dflash_dir, "policy": dataclasses.asdict(policy)}
    if labels_dflash is not None:
        meta["labels_dflash_sha256"] = file_sha256(Path(labels_dflash) / "model.safetensors")
    (path / "config.json").write_text(json.dumps(meta, indent=2))
    flat = {k: np.asarray(jax.device_get(v), np.float32) for k, v in flatten_params(policy_params).items()}
    save_file(flat, str(path / "policy.safetensors"), metadata={"format": "flax"})
    writing.follow_umask(path)  # safetensors writes 0600; the configs beside it follow the umask
    return path


def load_blockpilot(path, meta, target, dtype, decoding):
    """The `load` of the "blockpilot" kind (drafters/registry.py)."""
    raw = dict(meta["policy"])
    raw["sizes"] = tuple(raw["sizes"])
    policy = PolicyConfig(**raw)
    if policy.features in ("full", "logits") and policy.vocab_size != target.config.vocab_size:
        raise ValueError(f"{path}: policy trained for vocab {policy.vocab_size}, the target has "
                         f"{target.config.vocab_size}")
    dflash_dir = Path(meta["dflash_dir"])
    dflash_dir = dflash_dir if dflash_dir.is_absolute() else Path(path) / dflash_dir
    check_pairing(path, meta, dflash_dir)
    dflash, dparams = load_drafter(dflash_dir, target, dtype, **{**decoding, "block_size": max(policy.sizes)})
    graphdef, template = nnx.split(nnx.eval_shape(lambda: PolicyMLP(policy, rngs=nnx.Rngs(0))))
    params = _load_policy(Path(path), nnx.to_pure_dict(template))
    return BlockPilotDrafter(dflash, policy, graphdef), {"dflash": dparams, "policy": params}


_UNPAIRED_WARNED: set[str] = set()


def check_pairing(path, meta: dict, dflash_dir: Path) -> None:
    """ValueError unless the policy's labels came from the DFlash drafter in `dflash_dir`
    (config.json "labels_dflash_sha256" == SHA-256 of its model.safetensors); a folder without
    the field warns once per folder."""
    want = meta.get("labels_dflash_sha256")
    if want is None:
        if str(path) not in _UNPAIRED_WARNED:
            _UNPAIRED_WARNED.add(str(path))
            warnings.warn(f"{path}: config.json does not record which DFlash drafter its policy's labels came "
                          f"from (labels_dflash_sha256); the pairing with {dflash_dir} is unchecked", stacklevel=3)
        return
    got = file_sha256(dflash_dir / "model.safetensors")
    if got != want:
        raise ValueError(f"{path}: its policy was trained on labels from a DFlash drafter with model.safetensors "
                         f"SHA-256 {want[:12]}..., but it drives {dflash_dir} ({got[:12]}...): retrain the "
                         "policy on labels from this drafter, or point dflash_dir at the one it was trained with")


def _load_policy(path: Path, template: dict) -> dict:
    flat = load_file(str(path / "policy.safetensors"))
    params = fill_params(template, flat, jnp.float32, str(path))
    if flat:
        raise ValueError(f"{path}: unexpected tensors {sorted(flat)}")
    return params
