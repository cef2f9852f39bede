"""Scale-out: device meshes, partition rules, sharded training and decoding, multi-host runs.

    from specblock_jax import parallel
    parallel.initialize()                                   # jax.distributed from flags / env
    mesh = parallel.make_mesh("data=4,model=2")
    results = sbj.generate(target, prompts, mesh=mesh)      # batch over data, target TP over model
    train(task, cfg, target, data, prompts, mesh=mesh)      # FSDP + TP train step, sharded ckpts

docs/scale_out.md has the launch recipes (Cloud TPU pod slice, multi-node GPU) and the figures.
"""

from specblock_jax.parallel.activation import constrain, constrain_batch, constrain_cache, use_plan
from specblock_jax.parallel.distributed import (HostShard, fetch, host_gather_floats, host_max,
                                                host_min, host_shard,
                                                host_sum, initialize, local_rows, sync)
from specblock_jax.parallel.mesh import (AXES, PARAM_RULES, ShardingPlan, make_mesh, mesh_str,
                                         param_logical_axes, parse_mesh, shard_bytes, tree_bytes)

__all__ = [
    "AXES", "HostShard", "PARAM_RULES", "ShardingPlan", "constrain", "constrain_batch",
    "constrain_cache", "fetch", "host_gather_floats", "host_max", "host_min", "host_shard",
    "host_sum", "initialize", "local_rows", "make_mesh", "mesh_str", "param_logical_axes",
    "parse_mesh", "shard_bytes", "sync", "tree_bytes", "use_plan",
]
