"""Serving policies above the decoding loop: auto serving (target-only or speculation, whichever
measures faster), tree calibration for the machine at hand, the
per-prompt step profile, and the method strings of the command-line tools."""

from specblock_jax.serving import calibrate
from specblock_jax.serving.auto import AutoServe
from specblock_jax.serving.methods import Method, parse_method, resolve_method
