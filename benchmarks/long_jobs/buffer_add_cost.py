"""ReplayBuffer.add at the bench's buffer (64 x 256 positions, 3 feature layers, H=256), with and without
donation (the pre-fix insert copied the buffer): `.venv/bin/python benchmarks/long_jobs/buffer_add_cost.py`."""
import time, jax, jax.numpy as jnp, numpy as np
from specblock_jax.adaptation import buffer as B
from specblock_jax.decoding.compiled import compiled
S = 672
h = jnp.ones((1, S), jnp.int32); hl = jnp.array([300]); pl = jnp.array([100]); f = jnp.ones((1, S, 3, 256))
def bench(donate):
    b = B.ReplayBuffer(64, 256, 3, 256)
    if not donate:  # the pre-fix insert
        def add(*a):
            args = (b.data, jnp.asarray(np.array([0], np.int32)), h, hl, pl, f)
            exe, _ = compiled(B._insert, (b.window,), *args)
            b.data = exe(*args)
    else:
        add = lambda: b.add(h, hl, pl, f, 1)
    for _ in range(3): add(); jax.block_until_ready(b.data)
    ts = []
    for _ in range(20):
        t = time.perf_counter(); add(); jax.block_until_ready(b.data); ts.append(time.perf_counter() - t)
    return 1e3 * np.median(ts), 1e3 * min(ts), 1e3 * max(ts)
for d in (False, True, False, True):
    print("donated" if d else "copied ", "ms median/min/max", [round(x, 2) for x in bench(d)])
