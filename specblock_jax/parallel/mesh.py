"""One mesh abstraction for training and decoding: a 2-D device mesh ("data", "model") and the
logical-axis partition rules of parameters, activations and the KV cache, in one place.

    mesh = make_mesh("data=4,model=2")        # 8 devices; "data=-1,model=2" takes the rest
    plan = ShardingPlan(mesh, fsdp=True)      # training: parameters FSDP-sharded over "data"
    params = plan.put(params)                 # every leaf placed by its key path's rule
    batch_sh = plan.batch_sharding(2)         # [B, T] split over "data"

Logical axes name what a dimension *is*; `LOGICAL_TO_MESH` says which mesh axis it is split over:
    batch     -> data    (activations, KV cache, token batches: data parallelism)
    embed     -> data    (the hidden dimension of *parameters*: FSDP; only when fsdp=True)
    vocab, heads, kv_heads, mlp -> model   (tensor parallelism, Megatron style: column-parallel
                                            q/k/v/gate/up, row-parallel o/down, vocab-split head)
    hidden_out -> model  (the output hidden of a drafter's input projection: fc, fuse, shift)
    head_dim, seq, layers, anything else -> replicated
A dimension is split only when its size divides by the mesh axis size (else it is replicated:
e.g. 2 kv heads on a 4-way model axis), and an FSDP split is skipped for parameters smaller than
`fsdp_min_size` elements. Embedding tables [V, H] are split over the vocabulary only, never FSDP:
a token gather from a table whose H is split over "data" hands its layout to the activations,
which then lose their batch split (the Qwen3-8B train step on a 32x8 mesh needed 1.5 TB of
temporaries per device that way, 84 GB without; docs/scale_out.md).
Parameter rules match the '/'-joined key path of a leaf (regexes over the last keys, so
optimizer states, whose paths end with the parameter's path, get the same sharding as their
parameter); unmatched leaves (norm weights, scalars) are replicated.

Weight layouts (models/layers.py): q_proj [H, N, D], k/v_proj [H, K, D], o_proj [N, D, H],
gate/up [H, F], down [F, H], embed_tokens [V, H], lm_head [H, V]; the drafters' layers use the
same names, their input projections fc [nH, H], fuse [3H, H] and shift [L-1, 2H, H] are split
column-parallel; drafter KV caches ([B, K, S, D] per layer, the drafter state's `cache` field)
split like the target's: batch over "data", kv heads over "model"; DFlash's params hold the target's
embedding and LM head as "embed" [V, H] and "head" [H, V] (vocab-split like the target's: the
Qwen3-8B head is 1.24 GB in bf16).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

AXES = ("data", "model")

# Parameter leaves: regex on the '/'-joined key path -> logical axes of each dimension.
PARAM_RULES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"(^|/)(embed_tokens|embed)$", ("vocab", None)),  # never FSDP: see above
    (r"(^|/)(lm_head|head)$", ("embed", "vocab")),  # "head": DFlash's copy of the target's
    (r"(^|/)q_proj$", ("embed", "heads", "head_dim")),
    (r"(^|/)(k_proj|v_proj)$", ("embed", "kv_heads", "head_dim")),
    (r"(^|/)o_proj$", ("heads", "head_dim", "embed")),
    (r"(^|/)q_bias$", ("heads", "head_dim")),
    (r"(^|/)(k_bias|v_bias)$", ("kv_heads", "head_dim")),
    (r"(^|/)(gate_proj|up_proj)$", ("embed", "mlp")),
    (r"(^|/)down_proj$", ("mlp", "embed")),
    # drafters' input projections, column-parallel (output hidden over "model"): EAGLE-3's and
    # DFlash's fc [nH, H] (target features -> H), SpecBlock's fc, fuse [3H, H] and per-layer shift
    # [L-1, 2H, H]. Split by rows (the 3H input) they would straddle the H-row blocks the
    # factored fuse slices, so each slice would move between chips.
    (r"(^|/)(fc|fuse)$", ("embed", "hidden_out")),
    (r"(^|/)shift$", ("layers", "embed", "hidden_out")),
)

# Activations and caches (logical axes per dimension, used by `constrain` / the plan's helpers).
KV_CACHE_AXES = ("layers", "batch", "kv_heads", "seq", "head_dim")  # [L, B, K, S, D] for all layers
DRAFT_CACHE_AXES = ("batch", "kv_heads", "seq", "head_dim")  # [B, K, S, D]: one drafter layer's k or v
TOKENS_AXES = ("batch", "seq")  # [B, T] token ids, masks, decode outputs

LOGICAL_TO_MESH: dict[str, str | None] = {
    "batch": "data", "embed": "data", "vocab": "model", "heads": "model", "kv_heads": "model",
    "mlp": "model", "hidden_out": "model", "head_dim": None, "seq": None, "layers": None,
}


def parse_mesh(spec: str | Mapping[str, int] | None) -> dict[str, int]:
    """'data=4,model=2' -> {"data": 4, "model": 2}. A missing axis is 1; at most one axis may be -1
    (filled from the device count by `make_mesh`). None or '' -> {"data": -1, "model": 1}."""
    if spec is None or spec == "":
        return {"data": -1, "model": 1}
    if isinstance(spec, Mapping):
        items = dict(spec)
    else:
        items = {}
        for part in str(spec).split(","):
            name, sep, value = part.strip().partition("=")
            if not sep:
                raise ValueError(f"mesh {spec!r}: {part!r} is not axis=size (axes: {AXES})")
            try:
                items[name.strip()] = int(value)
            except ValueError:
                raise ValueError(f"mesh {spec!r}: size {value!r} of {name!r} is not an integer") from None
    unknown = sorted(set(items) - set(AXES))
    if unknown:
        raise ValueError(f"mesh {spec!r}: unknown axes {unknown} (axes: {AXES})")
    out = {a: int(items.get(a, 1)) for a in AXES}
    if any(v == 0 or v < -1 for v in out.values()) or list(out.values()).count(-1) > 1:
        raise ValueError(f"mesh {spec!r}: sizes must be >= 1 (one of them may be -1)")
    return out


def make_mesh(spec: str | Mapping[str, int] | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ("data", "model") mesh over `devices` (default: all devices of all processes).

    jax.make_mesh orders devices so that the "model" axis (the last, most communicating) stays
    within a host / ICI neighbourhood. The product of the sizes must equal the device count; with
    several processes "model" must divide each host's device count (hosts feed their own rows).
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = parse_mesh(spec)
    fixed = int(np.prod([v for v in shape.values() if v != -1]))
    if -1 in shape.values():
        if len(devices) % fixed:
            raise ValueError(f"mesh {spec!r}: {len(devices)} devices do not divide by {fixed}")
        shape = {a: (len(devices) // fixed if v == -1 else v) for a, v in shape.items()}
    if int(np.prod(list(shape.values()))) != len(devices):
        raise ValueError(f"mesh {spec!r} needs {int(np.prod(list(shape.values())))} devices, "
                         f"there are {len(devices)} ({jax.process_count()} processes)")
    if jax.process_count() > 1 and jax.local_device_count() % shape["model"]:
        # each host feeds its own rows: a model group must not straddle hosts
        raise ValueError(f"mesh {spec!r}: model={shape['model']} must divide the "
                         f"{jax.local_device_count()} devices of each host")
    sizes = tuple(shape[a] for a in AXES)
    return jax.make_mesh(sizes, AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)


def mesh_str(mesh: Mesh) -> str:
    return ",".join(f"{a}={mesh.shape[a]}" for a in AXES)


def path_str(path: tuple) -> str:
    """A jax key path as 'a/b/0/c'."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def param_logical_axes(path: str, ndim: int) -> tuple[str | None, ...]:
    """Logical axes of the parameter at key path `path` (replicated if no rule matches its rank).
    The target's stacked layers ("layers/..." with a leading [L] axis) keep that axis whole."""
    stacked = re.match(r"(.*/)?layers/[a-z]", path) is not None
    for pattern, axes in PARAM_RULES:
        if re.search(pattern, path):
            if len(axes) == ndim:
                return axes
            if stacked and len(axes) + 1 == ndim:
                return ("layers",) + axes
    return (None,) * ndim


@dataclasses.dataclass(frozen=True)
class ShardingPlan:
    """How arrays are laid out on `mesh`. Hashable (usable as a static jit argument).

    fsdp: split the parameters' "embed" dimension over "data" (training); decoding keeps the
    weights replicated across data-parallel groups and tensor-parallel inside one (fsdp=False).
    fsdp_min_size: parameters with fewer elements are not FSDP-split (small norms, biases).
    """

    mesh: Mesh
    fsdp: bool = False
    fsdp_min_size: int = 2**16

    @property
    def data_size(self) -> int:
        return self.mesh.shape["data"]

    @property
    def model_size(self) -> int:
        return self.mesh.shape["model"]

    def spec(self, logical: Sequence[str | None], shape: Sequence[int],
             fsdp: bool | None = None) -> P:
        """PartitionSpec for logical axes of an array of `shape` (indivisible dims replicated)."""
        fsdp = self.fsdp if fsdp is None else fsdp
        big = int(np.prod(shape)) >= self.fsdp_min_size
        out, used = [], set()
        for name, size in zip(logical, shape):
            axis = LOGICAL_TO_MESH.get(name) if name else None
            if name == "embed" and not (fsdp and big):
                axis = None
            if axis is None or axis in used or size % self.mesh.shape[axis] or self.mesh.shape[axis] == 1:
                out.append(None)
            else:
                out.append(axis)
                used.add(axis)
        return P(*out)

    def sharding(self, logical: Sequence[str | None], shape: Sequence[int]) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec(logical, shape))

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    def batch_sharding(self, ndim: int, batch: int | None = None) -> NamedSharding:
        """[B, ...] arrays split over "data" along the leading dim (batch=None: assume divisible)."""
        logical = ("batch",) + (None,) * (ndim - 1)
        if batch is None:
            return NamedSharding(self.mesh, P("data", *(None,) * (ndim - 1)))
        return self.sharding(logical, (batch,) + (1,) * (ndim - 1))

    def param_shardings(self, tree: Any) -> Any:
        """A tree of NamedShardings, one per leaf (arrays or ShapeDtypeStructs) by key path."""
        def one(path, x):
            shape = tuple(np.shape(x))
            return self.sharding(param_logical_axes(path_str(path), len(shape)), shape)

        return jax.tree_util.tree_map_with_path(one, tree)

    def cache_shardings(self, cache: Any) -> Any:
        """Shardings for a `KVCache`: k/v [L, B, K, S, D] (or a drafter layer's [B, K, S, D]; batch
        over data, kv heads over model), lengths [B] over data."""
        def one(x):
            shape = tuple(np.shape(x))
            if len(shape) in (4, 5):
                axes = KV_CACHE_AXES if len(shape) == 5 else DRAFT_CACHE_AXES
            else:
                axes = ("batch",) + (None,) * (len(shape) - 1)
            return self.sharding(axes, shape)

        return jax.tree.map(one, cache)

    def put(self, tree: Any, shardings: Any = None) -> Any:
        """Places host or single-device arrays on the mesh (param rules by default). Works in
        multi-process runs (each process holds the full value and keeps its own shards); leaves
        already laid out as asked are returned as they are."""
        shardings = self.param_shardings(tree) if shardings is None else shardings
        return jax.tree.map(put_array, tree, shardings)


def put_array(x: Any, sharding: NamedSharding) -> jax.Array:
    """`x` (numpy or jax, full value on every process) as a global array with `sharding`."""
    if isinstance(x, jax.Array) and x.sharding == sharding:
        return x
    if jax.process_count() == 1 or (isinstance(x, jax.Array) and not x.is_fully_addressable):
        return jax.device_put(x, sharding)  # (a global array is resharded across processes)
    host = np.asarray(jax.device_get(x)) if isinstance(x, jax.Array) else np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def shard_bytes(tree: Any, shardings: Any) -> int:
    """Bytes one device holds of `tree` (arrays or ShapeDtypeStructs) laid out by `shardings`
    (splits are even: only divisible dimensions are split)."""
    total = 0
    flat_sh = jax.tree.leaves(shardings, is_leaf=lambda s: isinstance(s, NamedSharding))
    for x, sh in zip(jax.tree.leaves(tree), flat_sh):
        shard = sh.shard_shape(tuple(x.shape))
        total += int(np.prod(shard)) * np.dtype(x.dtype).itemsize
    return total


def tree_bytes(tree: Any) -> int:
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))
