"""The trainer's step of EAGLE-3-v2, SpecBlock-v2 now and SpecBlock-v2 before the attention change, in one
process (results.md, "The whole train step"):

    git show efd6446:specblock_jax/drafters/specblock_train.py > /tmp/old_sbt.py
    nice -n 19 .venv/bin/python benchmarks/specblock_train_profile/step_compare.py /tmp/old_sbt.py
"""

import importlib.util
import json
import sys
from pathlib import Path

import jax

import specblock_jax as sbj
import specblock_jax.drafters.registry as reg
from specblock_jax.drafters import specblock_train as new
from specblock_jax.drafters.eagle3_train import Eagle3Task
from specblock_jax.training.trainer import make_optimizer, make_train_step


def load(name: str, path: Path):
    """A module from a file (this folder's run.py; the old specblock_train.py given)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


R = load("run", Path(__file__).resolve().parent / "run.py")

# the old module registers the kind "specblock" again: load it with registration switched off
register, reg.register = reg.register, lambda *a, **k: None
old = load("old_sbt", Path(sys.argv[1]))
reg.register = register

target = sbj.load_target(R.ROOT / "assets/target")
out = {}
for name, cls in (("eagle3", Eagle3Task), ("specblock_after", new.SpecBlockTask), ("specblock_before", old.SpecBlockTask)):
    s, cfg = R.settings("eagle3" if name == "eagle3" else "specblock")
    task, data = cls(s, target), R.batch(cfg["batch_size"], cfg["max_len"])
    params, (tx, _) = task.init_params(jax.random.key(0)), make_optimizer(cfg)
    out[name] = R.measure_step(make_train_step(task, tx), params, tx, task.frozen(), data, jax.random.key(1), 5)
    print(name, out[name], flush=True)
print(json.dumps(out))
