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

2. JAX's probe for a TPU. JAX with no `jax_platforms` set tries every backend it has a factory
   for, the TPU one included, on every host:
   - with the `tpu` extra installed (libtpu, for specblock_jax/aot), it loads libtpu.so, whose
     start-up looks for a Cloud TPU (metadata server, TPU_ACCELERATOR_TYPE, TPU_WORKER_HOSTNAMES),
     prints ~4 lines to stderr ("could not determine TPU accelerator type", "unexpected worker
     hostname ...") and fails;
   - without it (a plain `pip install`), the load fails and JAX logs "Unable to initialize backend
     'tpu': INTERNAL: Failed to open libtpu.so ..." at INFO, which every CLI that configures
     logging at INFO (specblock-decode, specblock-regenerate) prints;
   and JAX falls back to the CPU either way. So on a host with no TPU chip on its PCI bus
   (Google's vendor id, as jax/_src/hardware_utils.py probes) and no GPU plugin for JAX,
   `jax_platforms` defaults to "cpu": the backend JAX would have picked anyway, without the probe.
   Left alone: a `JAX_PLATFORMS` the user set (even empty), a TPU VM (JAX must pick the TPU, or
   say it cannot), a host with a JAX GPU plugin. specblock_jax/aot does not need a TPU backend:
   it loads libtpu's compiler for a topology description (`jax.experimental.topologies`), which
   works under "cpu". `default_platforms` is the decision, `cpu_unless_accelerator` applies it.
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


def default_platforms(environ, tpu_chip: bool, gpu_plugin: bool) -> str | None:
    """The `jax_platforms` to default to: "cpu" when the user set no JAX_PLATFORMS and the host
    has neither a TPU chip nor a JAX GPU plugin (whether libtpu is installed or not: without a
    chip its probe can only fail), else None (JAX decides)."""
    if "JAX_PLATFORMS" in environ or tpu_chip or gpu_plugin:
        return None
    return "cpu"


def cpu_unless_accelerator() -> bool:
    """Sets `jax_platforms` to "cpu" where JAX's TPU probe could only fail (see the module
    docstring); True when it did."""
    if default_platforms(os.environ, tpu_chip_present(), gpu_plugin_installed()) is None:
        return False
    import jax

    if jax.config.jax_platforms is not None:  # set in this process (jax.config.update)
        return False
    jax.config.update("jax_platforms", "cpu")
    return True


cpu_unless_accelerator()
