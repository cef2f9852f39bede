"""How libtpu's cost analysis counts bytes, checked on toy programs for v5p:2x2x1 (compiled here, no
TPU; the counts `aot` prices from, not measurements):
1. `x @ W` for 1, 2, 4, 8 bf16 [4096, 4096] weights split over 4 chips (8.4 MB a chip each), passed
   as separate arguments and as one stacked array: the bytes counted per weight byte, and how many
   weights the compiler prefetches (copy-start).
2. `lax.switch` over 1-8 branches, branch k reading k + 1 of those weights: a switch is counted at
   its costliest branch, not the sum.

    python benchmarks/tpu_aot/count_checks.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from specblock_jax.aot.topology import get_topology, topology_mesh

H, MB = 4096, 1e6


def main() -> None:
    mesh = topology_mesh(get_topology("v5p:2x2x1"))
    x = jax.ShapeDtypeStruct((1, H), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
    w_bytes = H * H * 2 / mesh.shape["model"]

    def weights(n):
        return jax.ShapeDtypeStruct((n, H, H), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, None, "model")))

    def chain(x, ws):
        for w in ws:
            x = jax.lax.with_sharding_constraint(jax.nn.relu(x @ w), NamedSharding(mesh, P()))
        return x

    one = jax.ShapeDtypeStruct((H, H), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, "model")))
    for n in (1, 2, 4, 8):
        for label, args in (("separate arguments", [one] * n), ("one stacked argument", weights(n))):
            c = jax.jit(chain).lower(x, args).compile()
            counted = c.cost_analysis()["bytes accessed"]
            print(f"{n} weights as {label} ({n * w_bytes / MB:.1f} MB a chip): counted {counted / MB:.1f} MB = "
                  f"{counted / (n * w_bytes):.2f}x; prefetches (copy-start): {c.as_text().count('copy-start(')}")
    idx = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P()))
    for nb in (1, 2, 4, 8):
        branches = [lambda x, w, k=k: sum(x @ w[j] for j in range(k + 1)) for k in range(nb)]
        c = jax.jit(lambda i, x, w: jax.lax.switch(i, branches, x, w)).lower(idx, x, weights(8)).compile()
        counted = c.cost_analysis()["bytes accessed"]
        print(f"switch of {nb}: counted {counted / MB:.1f} MB; costliest branch's weights {nb * w_bytes / MB:.1f}, "
              f"all branches' {nb * (nb + 1) / 2 * w_bytes / MB:.1f}")


if __name__ == "__main__":
    main()
