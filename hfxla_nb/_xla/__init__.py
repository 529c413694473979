"""The only package of hfxla_nb that imports `torch_xla` (the backend seam).

Everything here imports `torch_xla` lazily, inside the function that needs it, so that
`import hfxla_nb` stays fast and works where torch_xla is not installed. PyTorch/XLA's README
announces a successor; keeping every call behind this one thin package keeps a port small.

`PRIVATE_NAMES` below lists every name torch_xla does not promise to keep that the seam uses,
with the torch_xla versions each was checked on; tests/test_xla_private_names.py probes them
all, so an upgrade fails in one place, naming what is missing. The submodules:

- `loader`: importing torch_xla, and checks that never start the runtime (safe in the kernel
  before a fork);
- `process`: SPMD mode, spawning, the device, syncs, ranks, random state, the compile cache;
  graphs compiled off the step and run later by key; torch_xla's metric and counter names
  (plain strings), and its counters and metrics as plain data;
- `sharding`: meshes, shardings, FSDPv2, layer checkpointing.

Functions that start the runtime must only run inside a launched worker (or in the kernel
when the user asked for in-kernel work); each submodule says which of its functions do.
"""

from __future__ import annotations

#: Every private torch_xla name the seam uses (`torch_xla._XLAC`, underscored names, the
#: experimental and debug modules, which promise no stability), and the few private torch names
#: it needs to reach torch_xla's kernels -> the torch_xla versions it was checked on.
#: A dotted path: a module, then attributes. Where one goes missing the seam falls back or
#: fails; tests/test_xla_private_names.py names it first.
PRIVATE_NAMES: dict[str, tuple[str, ...]] = {
    # loader: whether the runtime and the computation cache exist (no runtime start)
    "torch_xla._XLAC._xla_runtime_is_initialized": ("2.8", "2.9"),
    "torch_xla._XLAC._xla_computation_cache_is_initialized": ("2.8", "2.9"),
    # process.spawn: xmp.spawn's one-process body, without its second fork
    "torch_xla._internal.pjrt._run_thread_per_device": ("2.8", "2.9"),
    "torch_xla._internal.pjrt.initialize_multiprocess": ("2.8", "2.9"),
    "torch_xla._internal.pjrt._SpawnFn": ("2.8", "2.9"),
    "torch_xla.experimental.plugins.using_dynamic_plugins": ("2.8", "2.9"),
    "torch_xla.experimental.plugins.default": ("2.8", "2.9"),
    "torch_xla.experimental.plugins.DevicePlugin.physical_chip_count": ("2.8", "2.9"),
    # process.spawn: torch_xla's `.item()` fallback counter, made before rank threads race
    # to make it (torch's names here were checked with the torch each torch_xla was built for)
    "torch._C.DispatchKeySet": ("2.8", "2.9"),
    "torch._C.DispatchKey.XLA": ("2.8", "2.9"),
    "torch.ops.aten._local_scalar_dense.default": ("2.8", "2.9"),
    "torch_xla.debug.metrics.clear_counters": ("2.8", "2.9"),
    # process.to_cpu: many tensors to the host in one transfer
    "torch_xla._XLAC._xla_get_cpu_tensors": ("2.8", "2.9"),
    # process: compile a traced graph under its key, run it later with new inputs
    "torch_xla._XLAC._xla_get_tensor_id": ("2.8", "2.9"),
    "torch_xla._XLAC._get_tensors_xla_device_data_node": ("2.8", "2.9"),
    "torch_xla._XLAC._get_tensors_handle": ("2.8", "2.9"),
    "torch_xla._XLAC._get_graph_hash": ("2.8", "2.9"),
    "torch_xla._XLAC._xla_warm_up_cache": ("2.8", "2.9"),
    "torch_xla._XLAC._clear_pending_irs": ("2.8", "2.9"),
    "torch_xla._XLAC._run_cached_graph": ("2.8", "2.9"),
    "torch_xla._XLAC._check_tensor_need_materialization": ("2.8", "2.9"),
    # process: a graph run again by its key (the seed, the parameters' data)
    "torch_xla._XLAC._get_seed_info_id": ("2.8", "2.9"),
    "torch_xla._XLAC._get_base_seed_as_tensor": ("2.8", "2.9"),
    "torch_xla._XLAC._replace_xla_tensor": ("2.8", "2.9"),
    # process.end_step: a step run by its graph ends with its step closures, no sync
    "torch_xla.core.xla_model._run_step_closures": ("2.8", "2.9"),
    "torch_xla._XLAC._set_buffer_donation": ("2.8", "2.9"),
    "torch_xla._XLAC._xla_get_enable_alias_with_buffer_donor_config": ("2.8", "2.9"),
    "torch_xla._XLAC._xla_set_enable_alias_with_buffer_donor_config": ("2.8", "2.9"),
    # sharding: read and copy a tensor's SPMD sharding; FSDPv2
    "torch_xla._XLAC._get_xla_sharding_spec": ("2.8", "2.9"),
    "torch_xla._XLAC._get_xla_op_sharding": ("2.8", "2.9"),
    "torch_xla._XLAC._xla_mark_sharding": ("2.8", "2.9"),
    "torch_xla.experimental.spmd_fully_sharded_data_parallel.SpmdFullyShardedDataParallel":
        ("2.8", "2.9"),
    # process: torch_xla's debug metrics (the names they count are there too)
    "torch_xla.debug.metrics.counter_names": ("2.8", "2.9"),
    "torch_xla.debug.metrics.counter_value": ("2.8", "2.9"),
    "torch_xla.debug.metrics.metric_names": ("2.8", "2.9"),
    "torch_xla.debug.metrics.metric_data": ("2.8", "2.9"),
    "torch_xla.debug.metrics.executed_fallback_ops": ("2.8", "2.9"),
}

from .loader import (  # noqa: E402
    XlaUnavailableError,
    compiler_flags,
    computation_cache_initialized,
    device_type,
    is_imported,
    is_installed,
    is_spmd,
    is_xla_tensor,
    require_torch_xla,
    runtime_is_initialized,
)
from .process import (  # noqa: E402  # noqa: E402
    BYTES_FROM_DEVICE,
    BYTES_TO_DEVICE,
    CACHED_COMPILE,
    COMPILE_TIME,
    EXECUTE_COUNTERS,
    EXECUTE_TIMES,
    FALLBACK_PREFIX,
    ITEM_OP,
    MARK_STEP,
    PERSISTENT_CACHE_COUNTERS,
    TRANSFER_FROM_DEVICE_TIME,
    TRANSFER_TO_DEVICE_TIME,
    UNCACHED_COMPILE,
    CompiledGraph,
    Declined,
    Slot,
    add_step_closure,
    broadcast_master_param,
    clear_pending,
    compile_graph,
    compile_times,
    device,
    end_step,
    fallback_counts,
    fallbacks_since,
    get_rng_state,
    global_device_count,
    global_ordinal,
    graph_lookups,
    graphs_ran,
    initialize_cache,
    memory_info,
    metric_counts,
    metrics_snapshot,
    optimizer_step,
    pending,
    process_device_count,
    rebase_metrics,
    replace_data,
    set_rng_state,
    spawn,
    sync,
    tensor_id,
    to_cpu,
    use_spmd,
    wait_device_ops,
    world_size,
)
from .sharding import (  # noqa: E402
    checkpoint_layers,
    data_parallel_mesh,
    fsdp_v2,
    mark_sharding,
    replicate,
    replicate_unsharded,
    send_to_device,
    sharding_spec,
    share_sharding,
    watch_mark_sharding,
)

__all__ = [
    "PRIVATE_NAMES",
    # names
    "BYTES_FROM_DEVICE", "BYTES_TO_DEVICE", "CACHED_COMPILE", "COMPILE_TIME", "EXECUTE_COUNTERS",
    "EXECUTE_TIMES", "FALLBACK_PREFIX", "ITEM_OP", "MARK_STEP", "PERSISTENT_CACHE_COUNTERS",
    "TRANSFER_FROM_DEVICE_TIME", "TRANSFER_TO_DEVICE_TIME", "UNCACHED_COMPILE",
    # loader (never start the runtime)
    "XlaUnavailableError", "compiler_flags", "computation_cache_initialized", "device_type",
    "is_imported", "is_installed", "is_spmd", "is_xla_tensor", "require_torch_xla",
    "runtime_is_initialized",
    # process
    "add_step_closure", "broadcast_master_param", "device", "end_step", "get_rng_state",
    "global_device_count", "global_ordinal", "initialize_cache", "memory_info", "optimizer_step",
    "process_device_count", "set_rng_state", "spawn", "sync", "to_cpu", "use_spmd",
    "wait_device_ops", "world_size",
    # graphs
    "CompiledGraph", "Declined", "Slot", "clear_pending", "compile_graph", "fallback_counts",
    "fallbacks_since", "graph_lookups", "pending", "replace_data", "tensor_id",
    # sharding
    "checkpoint_layers", "data_parallel_mesh", "fsdp_v2", "mark_sharding", "replicate",
    "replicate_unsharded", "send_to_device", "share_sharding", "sharding_spec",
    "watch_mark_sharding",
    # metrics
    "compile_times", "graphs_ran", "metric_counts", "metrics_snapshot", "rebase_metrics",
]
