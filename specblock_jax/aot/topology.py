"""TPU topologies without a TPU: chip facts, the libtpu probe, topology devices and meshes on them.

    topo = get_topology("v5p:2x2x1")          # 4 TPU v5p devices described by libtpu, no hardware
    mesh = topology_mesh(topo, "data=1,model=4")

`get_topology` needs libtpu (the `tpu` extra: `pip install 'specblock-jax[tpu]'`); without it every
entry point of this package raises `MissingLibtpuError`, which names the extra. Only the compiler
of libtpu is used: nothing runs on a TPU, and JAX's default backend stays what it was.

libtpu takes a lock file (/tmp/libtpu_lockfile) when it is loaded, and a JAX process on a host
with libtpu installed loads it while probing for a TPU at its first backend initialisation (then
falls back to the CPU) unless `jax_platforms` skips the probe (specblock_jax/_quiet.py does on
hosts with no accelerator). A topology description compiles only, so this module sets
ALLOW_MULTIPLE_LIBTPU_LOAD=1 (libtpu's own switch) before loading the plugin: a CPU process that
holds the lock does not block ahead-of-time compiles.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any

from specblock_jax.parallel.mesh import make_mesh, parse_mesh

INSTALL_HINT = "pip install 'specblock-jax[tpu]'"


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU chip generation (Cloud TPU documentation, "TPU versions" pages: v5e, v5p, v6e
    system architecture; HBM per chip, HBM bandwidth, peak bf16 FLOP/s)."""

    name: str  # "v5e" | "v5p" | "v6e"
    device_kind: str  # what libtpu's devices report
    hbm_bytes: int
    hbm_gbps: float  # GB/s per chip
    bf16_tflops: float  # peak dense bf16 TFLOP/s per chip
    examples: tuple[str, ...]  # valid topology names (the compiler accepts more of the same form)


GiB = 2**30
CHIPS: dict[str, Chip] = {
    "v5e": Chip("v5e", "TPU v5 lite", 16 * GiB, 819.0, 197.0,
                ("v5e:2x2", "v5e:2x4", "v5e:4x4", "v5e:4x8", "v5e:8x8", "v5e:8x16", "v5e:16x16")),
    "v5p": Chip("v5p", "TPU v5", 95 * GiB, 2765.0, 459.0,
                ("v5p:2x2x1", "v5p:2x2x2", "v5p:2x2x4", "v5p:2x4x4", "v5p:4x4x4", "v5p:4x4x8")),
    "v6e": Chip("v6e", "TPU v6 lite", 32 * GiB, 1640.0, 918.0,
                ("v6e:2x2", "v6e:2x4", "v6e:4x4", "v6e:4x8", "v6e:8x8", "v6e:8x16", "v6e:16x16")),
}


def valid_names() -> list[str]:
    return [n for chip in CHIPS.values() for n in chip.examples]


class MissingLibtpuError(ImportError):
    """libtpu (the TPU compiler) is not installed."""

    def __init__(self):
        super().__init__("ahead-of-time TPU compiles need libtpu, which is not installed: "
                         f"{INSTALL_HINT} (the `tpu` extra pins the libtpu of this project's jax)")


class UnknownTopologyError(ValueError):
    """A topology name libtpu does not know (the message lists valid ones)."""


def libtpu_installed() -> bool:
    """Whether libtpu can be loaded (the `libtpu` package, or TPU_LIBRARY_PATH naming a file)."""
    path = os.environ.get("TPU_LIBRARY_PATH")
    return bool(path and os.path.isfile(path)) or importlib.util.find_spec("libtpu") is not None


def require_libtpu() -> None:
    """Raises `MissingLibtpuError` (naming the `tpu` extra) unless libtpu is installed."""
    if not libtpu_installed():
        raise MissingLibtpuError()


@dataclasses.dataclass(frozen=True)
class Topology:
    """A TPU slice described by libtpu: `devices` are real TPU device descriptions (no hardware)."""

    name: str  # e.g. "v5p:2x2x1"
    chip: Chip
    devices: tuple[Any, ...]

    @property
    def num_devices(self) -> int:
        return len(self.devices)


def get_topology(name: str) -> Topology:
    """The devices of topology `name` ("v5e:2x2", "v5p:2x2x1", "v6e:2x4", ...). An unknown
    generation or a shape libtpu refuses raises `UnknownTopologyError` listing valid names; no
    libtpu raises `MissingLibtpuError`. (v5p needs at least 2x2x1: 1x1x1 is refused.)"""
    gen = name.partition(":")[0]
    listing = f"valid names include: {', '.join(valid_names())}"
    if gen not in CHIPS or ":" not in name:
        raise UnknownTopologyError(f"unknown TPU topology {name!r} (generations: "
                                   f"{', '.join(CHIPS)}); {listing}")
    require_libtpu()
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # see the module docstring
    from jax.experimental import topologies

    try:
        desc = topologies.get_topology_desc(topology_name=name, platform="tpu")
    except Exception as e:  # libtpu's INVALID_ARGUMENT for a shape it does not accept
        raise UnknownTopologyError(f"libtpu refused TPU topology {name!r}: {e}; {listing}") from None
    return Topology(name, CHIPS[gen], tuple(desc.devices))


def default_mesh(topo: Topology, train: bool = False) -> str:
    """Decoding: every chip tensor-parallel ("data=1,model=n"); training: every chip FSDP over
    data ("data=n,model=1"), the project's training plan."""
    n = topo.num_devices
    return f"data={n},model=1" if train else f"data=1,model={n}"


def topology_mesh(topo: Topology, spec: str | None = None, train: bool = False):
    """A ("data", "model") mesh over the topology's devices (`parallel.make_mesh`); spec None =
    `default_mesh`. The sizes must multiply to the device count."""
    spec = spec or default_mesh(topo, train)
    parse_mesh(spec)  # a clear error for a malformed spec
    return make_mesh(spec, devices=list(topo.devices))
