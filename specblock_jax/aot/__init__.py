"""Ahead-of-time compiles for TPU topologies from a CPU host: does a method fit, and what does
each phase of its step cost by the TPU compiler's own model (an estimate, not a measurement).

    from specblock_jax import aot
    cfg = aot.load_preset("qwen3-8b")
    out = aot.price_method(cfg, "eagle3", "v5p:2x2x1", batch=1, context=2048)
    print(aot.markdown_table([out]))

Needs libtpu: `pip install 'specblock-jax[tpu]'` (docs/tpu_aot.md).
"""

from specblock_jax.aot.cost import kernel_label
from specblock_jax.aot.presets import PRESETS, load_preset, load_target_config, released_drafter
from specblock_jax.aot.price import price_method
from specblock_jax.aot.report import roofline_seconds
from specblock_jax.aot.topology import (CHIPS, MissingLibtpuError, UnknownTopologyError, get_topology,
                                        require_libtpu, topology_mesh)

__all__ = [
    "CHIPS", "MissingLibtpuError", "PRESETS", "UnknownTopologyError", "get_topology", "kernel_label", "load_preset",
    "load_target_config", "price_method", "released_drafter", "require_libtpu", "roofline_seconds", "topology_mesh",
]
