"""Quiets two start-up messages of other packages; imported first by `specblock_jax`.

1. transformers' "PyTorch was not found" advisory. specblock-jax uses transformers only for
   tokenizers, which need no PyTorch, and the run install has none, so `import transformers` would
   print `[transformers] PyTorch was not found. Models won't be available ...` on every run.
   transformers emits it through `logger.warning_advice` while `transformers/__init__.py` runs, and
   `warning_advice` returns early when TRANSFORMERS_NO_ADVISORY_WARNINGS is set. So the variable
   must be set before transformers is first imported; `transformers.utils.logging.set_verbosity_*`
   cannot help (importing it runs the package `__init__` first), nor can a level on the stdlib
   `transformers` logger (transformers resets it). In transformers 5.24 this advisory is the only
   `warning_advice` call; real warnings and errors go through `logger.warning` / `logger.error`
   and are unaffected. `setdefault` leaves a value the user set alone.

2. libtpu's probe for a TPU. With the `tpu` extra installed (libtpu, for specblock_jax/aot), JAX
   with no `jax_platforms` set tries every backend it has a factory for, the TPU one included: it
   loads libtpu.so, whose start-up looks for a Cloud TPU (metadata server, TPU_ACCELERATOR_TYPE,
   TPU_WORKER_HOSTNAMES), prints ~4 lines to stderr ("could not determine TPU accelerator type",
   "unexpected worker hostname ...") and fails, and JAX falls back to the CPU. So on a host with no
   TPU chip on its PCI bus (Google's vendor id, as jax/_src/hardware_utils.py probes) and no GPU
   plugin for JAX, `jax_platforms` defaults to "cpu": the backend JAX would have picked anyway,
   without the probe. Left alone: a `JAX_PLATFORMS` the user set (even empty), a TPU VM (JAX must
   pick the TPU), a host with a JAX GPU plugin. specblock_jax/aot does not need a TPU backend: it
   loads libtpu's compiler for a topology description (`jax.experimental.topologies`), which
   works under "cpu".
"""

import glob
import importlib.metadata
import importlib.util
import os
import pkgutil

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips' PCI vendor id


def tpu_chip_present() -> bool:
    """Whether a Google PCI device (a TPU chip) is attached."""
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                if f.read().strip() == GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            continue
    return False


def gpu_plugin_installed() -> bool:
    """Whether a JAX GPU plugin is installed (jax-cuda*/jax-rocm*: a `jax_plugins` module or a
    `jax_plugins` entry point, the two ways JAX discovers PJRT plugins; libtpu is neither)."""
    spec = importlib.util.find_spec("jax_plugins")
    modules = [m.name for m in pkgutil.iter_modules(spec.submodule_search_locations)] if spec else []
    return bool(modules) or bool(importlib.metadata.entry_points(group="jax_plugins"))


def cpu_unless_accelerator() -> bool:
    """Sets `jax_platforms` to "cpu" where libtpu would only probe and fail (see the module
    docstring); True when it did."""
    if ("JAX_PLATFORMS" in os.environ or importlib.util.find_spec("libtpu") is None
            or tpu_chip_present() or gpu_plugin_installed()):
        return False
    import jax

    if jax.config.jax_platforms is not None:  # set in this process (jax.config.update)
        return False
    jax.config.update("jax_platforms", "cpu")
    return True


cpu_unless_accelerator()
