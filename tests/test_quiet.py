"""No backend warning on a CPU host (specblock_jax/_quiet.py), with or without libtpu installed:
the test venv has libtpu (the test extra installs jax[tpu]), so a plain install without it is
simulated in a subprocess by `sys.modules["libtpu"] = None` (`import libtpu` then fails, as JAX's
`maybe_import_libtpu` expects on such an install, and JAX falls back to dlopen("libtpu.so"))."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specblock_jax import _quiet

NO_LIBTPU = """
import sys
sys.modules["libtpu"] = None  # as on `pip install -e .` without the tpu extra
import logging
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")  # as specblock-decode does
{imports}
import jax
jax.numpy.ones(1)
print(jax.default_backend())
"""


def test_the_decision_defaults_to_cpu_only_without_an_accelerator_or_a_user_choice():
    assert _quiet.default_platforms({}, tpu_chip=False, gpu_plugin=False) == "cpu"
    assert _quiet.default_platforms({}, tpu_chip=True, gpu_plugin=False) is None
    assert _quiet.default_platforms({}, tpu_chip=False, gpu_plugin=True) is None
    assert _quiet.default_platforms({"JAX_PLATFORMS": ""}, tpu_chip=False, gpu_plugin=False) is None
    assert _quiet.default_platforms({"JAX_PLATFORMS": "tpu"}, tpu_chip=False, gpu_plugin=False) is None


@pytest.mark.skipif(_quiet.tpu_chip_present() or _quiet.gpu_plugin_installed(),
                    reason="a host with an accelerator: JAX must probe for it")
def test_no_tpu_backend_message_on_a_cpu_host_without_libtpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}

    def run(imports: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-c", NO_LIBTPU.format(imports=imports)], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    bare = run("")
    assert "Unable to initialize backend 'tpu'" in bare.stderr and "libtpu.so" in bare.stderr  # the simulation holds
    ours = run("import specblock_jax")
    assert ours.stdout.strip() == "cpu"
    assert "tpu" not in ours.stderr.lower(), ours.stderr
