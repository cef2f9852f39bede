"""Silences transformers' "PyTorch was not found" advisory; imported first by the package.

specblock-jax uses transformers only for tokenizers, which need no PyTorch, and the run install
has none, so `import transformers` would print
`[transformers] PyTorch was not found. Models won't be available ...` on every run.

transformers emits it through `logger.warning_advice` while `transformers/__init__.py` runs, and
`warning_advice` returns early when TRANSFORMERS_NO_ADVISORY_WARNINGS is set. So the variable
must be set before transformers is first imported; `transformers.utils.logging.set_verbosity_*`
cannot help (importing it runs the package `__init__` first), nor can a level on the stdlib
`transformers` logger (transformers resets it). In transformers 5.24 this advisory is the only
`warning_advice` call; real warnings and errors go through `logger.warning` / `logger.error` and
are unaffected. `setdefault` leaves a value the user set alone.
"""

import os

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
