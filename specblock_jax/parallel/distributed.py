"""Multi-host runs: `jax.distributed` start-up from flags or environment, per-host data shards,
and small cross-host agreements (all hosts of one jitted program must use the same shapes).

    initialize(coordinator="10.0.0.1:1234", num_processes=2, process_id=0)   # or from env
    mine = host_shard(records)                # records[process_index::process_count]
    source = HostShard(tfds_source)           # random-access view, equal length on every host
    bucket = host_max([local_bucket])[0]      # every host agrees on a static shape

Environment (used when the flag is not given): SBJ_COORDINATOR_ADDRESS, SBJ_NUM_PROCESSES,
SBJ_PROCESS_ID, SBJ_LOCAL_DEVICE_IDS (comma separated). On Cloud TPU pods, SLURM and Open MPI,
`initialize(auto=True)` with none of them lets JAX detect the cluster itself.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import numpy as np

ENV = {"coordinator": "SBJ_COORDINATOR_ADDRESS", "num_processes": "SBJ_NUM_PROCESSES",
       "process_id": "SBJ_PROCESS_ID", "local_device_ids": "SBJ_LOCAL_DEVICE_IDS"}
_STARTED = False


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: Sequence[int] | None = None,
               auto: bool = False) -> bool:
    """Starts `jax.distributed` (before any other JAX call) from the arguments, else the SBJ_*
    environment, else (auto=True) JAX's cluster detection. Returns whether it was started; with
    nothing given and auto=False it does nothing (a single-process run)."""
    global _STARTED
    if _STARTED:
        return True
    coordinator = coordinator or os.environ.get(ENV["coordinator"]) or None
    if num_processes is None and os.environ.get(ENV["num_processes"]):
        num_processes = int(os.environ[ENV["num_processes"]])
    if process_id is None and os.environ.get(ENV["process_id"]):
        process_id = int(os.environ[ENV["process_id"]])
    if local_device_ids is None and os.environ.get(ENV["local_device_ids"]):
        local_device_ids = [int(i) for i in os.environ[ENV["local_device_ids"]].split(",")]
    if coordinator is None and not auto:
        if num_processes not in (None, 1) or process_id not in (None, 0):
            raise ValueError("num_processes / process_id given without a coordinator address "
                             f"(--coordinator or {ENV['coordinator']})")
        return False
    if coordinator is not None and (num_processes is None or process_id is None):
        raise ValueError(f"coordinator {coordinator!r} needs num_processes and process_id "
                         f"(flags or {ENV['num_processes']} / {ENV['process_id']})")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id, local_device_ids=local_device_ids)
    _STARTED = True
    return True


def add_flags(parser: Any) -> None:
    """--coordinator, --num-processes, --process-id, --distributed on an argparse parser."""
    g = parser.add_argument_group("multi-host (jax.distributed)")
    g.add_argument("--coordinator", default=None,
                   help=f"host:port of process 0 (env {ENV['coordinator']})")
    g.add_argument("--num-processes", type=int, default=None, help=f"env {ENV['num_processes']}")
    g.add_argument("--process-id", type=int, default=None, help=f"env {ENV['process_id']}")
    g.add_argument("--distributed", action="store_true",
                   help="start jax.distributed with cluster auto-detection (Cloud TPU, SLURM, MPI)")


def initialize_from_args(args: Any) -> bool:
    return initialize(args.coordinator, args.num_processes, args.process_id,
                      auto=bool(args.distributed))


def host_shard(items: Sequence[Any], index: int | None = None, count: int | None = None) -> list:
    """This host's items: items[index::count] (default: this process of all processes)."""
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    return list(items[index::count])


class HostShard:
    """A random-access view of `source` for one host: rows index, index + count, ...; every host
    gets len(source) // count rows (the remainder is dropped so all hosts run as many steps)."""

    def __init__(self, source: Any, index: int | None = None, count: int | None = None):
        self.source = source
        self.index = jax.process_index() if index is None else index
        self.count = jax.process_count() if count is None else count
        if not 0 <= self.index < self.count:
            raise ValueError(f"host index {self.index} outside [0, {self.count})")
        self.n = len(source) // self.count
        if self.n == 0:
            raise ValueError(f"{len(source)} examples cannot be split over {self.count} hosts")

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.source[self.index + int(i) * self.count]


def _gather(values: Sequence[int]) -> np.ndarray:
    """[processes, len(values)] int64 of every host's values (the same length on every host)."""
    local = np.asarray(values, np.int64)
    if jax.process_count() == 1:
        return local[None]
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(local)).reshape(jax.process_count(), -1)


def host_max(values: Sequence[int]) -> list[int]:
    """Element-wise max over hosts."""
    return [int(v) for v in _gather(values).max(axis=0)]


def host_min(values: Sequence[int]) -> list[int]:
    """Element-wise min over hosts."""
    return [int(v) for v in _gather(values).min(axis=0)]


def host_sum(values: Sequence[int]) -> list[int]:
    """Element-wise sum over hosts."""
    return [int(v) for v in _gather(values).sum(axis=0)]


def sync(name: str) -> None:
    """A barrier across hosts (no-op for one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def local_rows(x: jax.Array) -> np.ndarray:
    """The rows of a [B, ...] global array that this host's devices hold (all rows in a
    single-process run), in order: the host's part of a batch split over "data"."""
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    shards = {}
    for s in x.addressable_shards:
        rows = s.index[0]
        shards.setdefault((rows.start or 0), np.asarray(s.data))
    return np.concatenate([shards[k] for k in sorted(shards)], axis=0)


def fetch(tree: Any) -> Any:
    """The full value of every leaf as numpy, on every host (all-gathers sharded leaves)."""
    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return np.asarray(jax.device_get(x))
        from jax.sharding import NamedSharding, PartitionSpec as P

        full = jax.jit(lambda a: a, out_shardings=NamedSharding(x.sharding.mesh, P()))(x)
        return np.asarray(full.addressable_data(0))

    return jax.tree.map(one, tree)


def host_gather_floats(values: Sequence[float]) -> list[float]:
    """Every host's `values` (lengths may differ), concatenated in process order."""
    if jax.process_count() == 1:
        return [float(v) for v in values]
    from jax.experimental import multihost_utils

    n = max(host_max([len(values)])[0], 1)
    local = np.full((n,), np.nan, np.float64)
    local[:len(values)] = values
    allv = np.asarray(multihost_utils.process_allgather(local)).reshape(-1)
    return [float(v) for v in allv if not np.isnan(v)]
