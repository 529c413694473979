"""The only module of hfxla_nb that imports `torch_xla`.

Everything here imports `torch_xla` lazily, inside the function that needs it, so that
`import hfxla_nb` stays fast and works where torch_xla is not installed. PyTorch/XLA's README
announces a successor; keeping every call behind this one thin module keeps a port small.

Functions are grouped by whether they start the XLA runtime. Those under "Safe" never do and
may be called in the notebook kernel before a fork; those under "Starts the runtime" must only
run inside a launched worker (or in the kernel when the user asked for in-kernel work).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import Any


class XlaUnavailableError(ImportError):
    """Raised when an operation needs torch_xla and it is not installed."""


# ---------------------------------------------------------------------------------------------
# torch_xla's metric and counter names (torch_xla 2.9, XLA on the CPU and TPU), written only
# here: `observe.metrics` summarizes them, fine_tune's loop counts some (`train.counts`). A
# rename upstream is one edit.
# ---------------------------------------------------------------------------------------------

# Metrics (`torch_xla.debug.metrics.metric_data`: a count, a total, the latest samples).
COMPILE_TIME = "CompileTime"  # one sample (ns) per compilation
EXECUTE_TIMES = ("ExecuteTime", "ExecuteReplicatedTime")  # one per execution (SPMD: replicated)
TRANSFER_FROM_DEVICE_TIME = "TransferFromDeviceTime"  # one per device-to-host transfer
TRANSFER_TO_DEVICE_TIME = "TransferToDeviceTime"  # one per host-to-device transfer
BYTES_FROM_DEVICE = "InboundData"  # bytes of those transfers
BYTES_TO_DEVICE = "OutboundData"

# Counters (`counter_value`): the fallbacks where a metric above is missing, and the rest.
UNCACHED_COMPILE = "UncachedCompile"  # compilations
CACHED_COMPILE = "CachedCompile"  # graphs found in the in-memory computation cache
EXECUTE_COUNTERS = ("ExecuteComputation", "ExecuteReplicated")  # executions
MARK_STEP = "MarkStep"  # `torch_xla.sync()` / `xm.mark_step()` calls
FALLBACK_PREFIX = "aten::"  # every op that ran on the CPU has a counter `aten::<op>`
ITEM_OP = "aten::_local_scalar_dense"  # what `.item()` shows up as among those fallbacks
# The persistent compile cache: hits, misses, and entries this XLA could not load.
PERSISTENT_CACHE_COUNTERS = {"hits": "PersistentCacheHit", "misses": "PersistentCacheMiss",
                             "unreadable": "PersistentCacheDeserializeFailure"}


def _require():
    try:
        import torch_xla  # noqa: F401
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise XlaUnavailableError(
            "torch_xla is not installed. A TPU VM or Colab/Kaggle TPU runtime has it; "
            "elsewhere run `pip install torch_xla` with the same minor version as torch "
            "(for example torch==2.9.0 torch_xla==2.9.0)."
        ) from error
    return sys.modules["torch_xla"]


# ---------------------------------------------------------------------------------------------
# Safe: never start the runtime
# ---------------------------------------------------------------------------------------------


def is_installed() -> bool:
    """Whether torch_xla can be imported, without importing it."""
    return importlib.util.find_spec("torch_xla") is not None


def is_imported() -> bool:
    """Whether torch_xla was already imported in this process."""
    return "torch_xla" in sys.modules


def runtime_is_initialized() -> bool:
    """Whether this process has started the XLA (PJRT) runtime.

    A process that has started it must not fork workers that use XLA: they hang forever. If
    torch_xla was never imported, the runtime cannot have started, so nothing is imported here.
    """
    if not is_imported():
        return False
    xlac = getattr(sys.modules["torch_xla"], "_XLAC", None)
    check = getattr(xlac, "_xla_runtime_is_initialized", None)
    return bool(check()) if check is not None else False


def is_spmd() -> bool:
    """Whether SPMD mode is on in this process (safe before the runtime starts)."""
    if not is_imported():
        return False
    import torch_xla.runtime as xr

    return bool(xr.is_spmd())


def use_spmd() -> None:
    """Turn on SPMD mode; must run before any tensor is placed on the device."""
    _require()
    import torch_xla.runtime as xr

    xr.use_spmd()


def spawn(function: Callable[..., Any], args: tuple = ()) -> None:
    """`xmp.spawn(function, args, start_method="fork")`: one process per chip, threads per core.

    Where xmp.spawn would fork a single process (XLA:CPU, a one-chip TPU host), the calling
    process (a launch's fresh fork) becomes that process: it runs what xmp.spawn's pool process
    runs (`_run_thread_per_device` with the same initializer), without a second fork of a
    process as big as the kernel (about 0.1 s of a launch: bench figure 7).
    """
    _require()
    import torch_xla.distributed.xla_multiprocessing as xmp

    body = _one_process_body(function, args)
    if body is None:
        xmp.spawn(function, args=args, start_method="fork")
    else:
        body()


def _one_process_body(function: Callable[..., Any], args: tuple) -> Callable[[], Any] | None:
    """xmp.spawn's per-process body for `function` when it would fork exactly one process
    (counted as torch_xla's `run_multiprocess` counts), else None; None too where torch_xla's
    internals differ from 2.8/2.9's (then xmp.spawn itself runs)."""
    import functools

    try:
        import torch_xla.runtime as xr
        from torch_xla._internal import pjrt
        from torch_xla.experimental import plugins

        if plugins.using_dynamic_plugins():
            processes = plugins.default().physical_chip_count()
        elif xr.device_type() == "CPU":
            processes = 1
        else:
            return None  # TPU, CUDA, NEURON without plugins: xmp.spawn counts their processes
        if processes != 1 or runtime_is_initialized():
            return None  # several chips; or xmp.spawn's own "already initialized" error
        run, initialize = pjrt._run_thread_per_device, pjrt.initialize_multiprocess
        spawned = pjrt._SpawnFn(function, *args)
    except (ImportError, AttributeError):  # pragma: no cover - other torch_xla versions
        return None
    return functools.partial(run, 0, 1, spawned, initialize)


def add_step_closure(closure: Callable[..., Any], args: tuple = ()) -> None:
    """Run `closure(*args)` after the next graph execution, when tensors hold values.

    Fetching a tensor inside the closure costs a transfer but never an extra execution.
    """
    _require()
    import torch_xla.core.xla_model as xm

    xm.add_step_closure(closure, args=args)


def device_type() -> str | None:
    """The PJRT device type ("TPU", "CPU", ...) if torch_xla is imported, else None."""
    if not is_imported():
        return None
    import torch_xla.runtime as xr

    try:
        return str(xr.device_type())
    except Exception:  # noqa: BLE001 - unknown PJRT_DEVICE
        return None


def to_cpu(tensors: list) -> list:
    """Copy XLA tensors that already hold values to the host in one transfer.

    Meant for step closures (after the graph ran): no extra execution, one
    `TransferFromDevice` for all of them, and no `aten::_local_scalar_dense` fallback.
    """
    torch_xla = _require()
    get_cpu_tensors = getattr(torch_xla._XLAC, "_xla_get_cpu_tensors", None)
    if get_cpu_tensors is None:  # pragma: no cover - other torch_xla versions
        return [tensor.cpu() for tensor in tensors]
    return list(get_cpu_tensors(list(tensors)))


def is_xla_tensor(value: Any) -> bool:
    """Whether `value` is a torch tensor that lives on an XLA device (no import if unused)."""
    device = getattr(value, "device", None)
    return getattr(device, "type", None) == "xla"


# ---------------------------------------------------------------------------------------------
# Starts the runtime: only inside a launched worker
# ---------------------------------------------------------------------------------------------


def device():
    """The default XLA device of this process (starts the runtime)."""
    torch_xla = _require()
    return torch_xla.device()


def sync() -> None:
    """Cut the lazy graph here and run it (`torch_xla.sync()`, formerly `xm.mark_step()`)."""
    torch_xla = _require()
    if hasattr(torch_xla, "sync"):
        torch_xla.sync()
    else:  # pragma: no cover - torch_xla < 2.6
        import torch_xla.core.xla_model as xm

        xm.mark_step()


# Graphs compiled off the step (torch_xla's Dynamo API: compile a traced graph under its own
# key, run it later by that key with new inputs). `train/evaluate.py` compiles evaluation this
# way while training compiles; docs/architecture.md says why `sync()` cannot.


def tensor_id(tensor) -> int:
    """torch_xla's id of a device tensor (what `graph_inputs` names inputs by)."""
    return int(_require()._XLAC._xla_get_tensor_id(tensor))


def graph_inputs(outputs: list, known: list) -> tuple[bytes, list[int], list]:
    """The graph of `outputs` (traced, not run): `(key, input ids, inputs)`, its device-data
    inputs in order, each with the id of the tensor it came from. An input from a `known`
    tensor is that tensor; any other is a new tensor on its data. (A new tensor on a weight's
    data would take over its buffer's owner id, and the next step would no longer donate
    that buffer: another graph.)"""
    xlac = _require()._XLAC
    ids, inputs = xlac._get_tensors_xla_device_data_node(outputs, known)
    return xlac._get_graph_hash(outputs), list(ids), list(inputs)


def compile_graph(outputs: list) -> None:
    """Compile the graph of `outputs` into torch_xla's cache under `graph_inputs`' key,
    without running it; the GIL is released while it compiles."""
    _require()._XLAC._xla_warm_up_cache(outputs, [])


def clear_pending() -> None:
    """Drop every pending (traced, not run) tensor's graph: those tensors become
    placeholders that must not be read, and no later sync includes them."""
    torch_xla = _require()
    torch_xla._XLAC._clear_pending_irs(str(torch_xla.device()))


def run_compiled(key: bytes, inputs: list) -> list:
    """Run a graph `compile_graph` compiled, on new inputs (same shapes, same order)."""
    return list(_require()._XLAC._run_cached_graph(key, inputs))


def graph_lookups() -> int:
    """How many graphs syncs have looked up in torch_xla's compile cache (found or not): a sync
    looks up its graph right after it took its pending tensors, before it compiles."""
    _require()
    import torch_xla.debug.metrics as met

    return sum(int(met.counter_value(name) or 0) for name in (UNCACHED_COMPILE, CACHED_COMPILE))


def global_device_count() -> int:
    """All devices the runtime sees (starts the runtime)."""
    _require()
    import torch_xla.runtime as xr

    return int(xr.global_runtime_device_count())


def world_size() -> int:
    """Number of replicated processes (starts the runtime)."""
    _require()
    import torch_xla.runtime as xr

    return int(xr.world_size())


def process_device_count() -> int:
    """Devices this process drives: 1 per chip on v4 and later, one thread each on v2/v3 and on
    the CPU (starts the runtime)."""
    _require()
    import torch_xla.runtime as xr

    return int(xr.addressable_runtime_device_count())


def global_ordinal() -> int:
    """This replica's rank (starts the runtime)."""
    _require()
    import torch_xla.runtime as xr

    return int(xr.global_ordinal())


def data_parallel_mesh(axis: str = "data"):
    """A `(devices, 1)` mesh named `(axis, "model")` over every device, for SPMD: "data" for
    data parallelism, "fsdp" for FSDPv2 (parameters sharded on the same axis as the batch)."""
    _require()
    import numpy as np
    import torch_xla.distributed.spmd as xs

    count = global_device_count()
    return xs.Mesh(np.arange(count), (count, 1), (axis, "model"))


def fsdp_v2(model, mesh, layer_classes: set | None = None, checkpoint: bool = False):
    """Wrap `model` in PyTorch/XLA's SPMD FSDPv2: parameters sharded over the mesh's "fsdp"
    axis, the logits of the output sharded on the batch; each layer of `layer_classes`
    wrapped (and recomputed in the backward pass with torch_xla's checkpoint when asked)."""
    _require()
    import functools
    import warnings

    import torch_xla.distributed.spmd as xs
    from torch_xla.distributed.fsdp import checkpoint_module
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel as FSDPv2,
    )

    def shard_output(output, mesh):
        # A layer returns a tensor (or a tuple); the model a ModelOutput with logits.
        if isinstance(output, tuple):
            output = output[0]
        tensor = getattr(output, "logits", output)
        xs.mark_sharding(tensor, mesh, ("fsdp",) + (None,) * (tensor.dim() - 1))

    # FSDPv2 puts an optimization barrier on each wrapped module's backward through a full
    # backward hook; the whole model returns a ModelOutput, so torch warns ("For backward hooks
    # to be called, module output should be a Tensor...") on the first step: the layers'
    # barriers still run, and the user can do nothing about it. Silenced in this worker only.
    warnings.filterwarnings("ignore", message="For backward hooks to be called",
                            category=UserWarning, module="torch.nn.modules.module")
    policy = wrapper = None
    if layer_classes:
        policy = functools.partial(transformer_auto_wrap_policy,
                                   transformer_layer_cls=set(layer_classes))
        if checkpoint:
            def wrapper(module, *args, **kwargs):
                return FSDPv2(checkpoint_module(module), *args, **kwargs)
    return FSDPv2(model, mesh=mesh, shard_output=shard_output, auto_wrap_policy=policy,
                  auto_wrapper_callable=wrapper)


def checkpoint_layers(model, layer_classes: set) -> int:
    """Recompute each layer of `layer_classes` in the backward pass with torch_xla's own
    checkpoint (transformers' gradient checkpointing is removed by XLA's compiler); returns
    how many layers were wrapped."""
    _require()
    from torch_xla.distributed.fsdp import checkpoint_module

    wrapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) in layer_classes:
                setattr(parent, name, checkpoint_module(child))
                wrapped += 1
    return wrapped


def sharding_spec(tensor) -> str:
    """How `tensor` is sharded ("" or "{replicated}" when it is not)."""
    import torch_xla

    return torch_xla._XLAC._get_xla_sharding_spec(tensor)


def optimizer_step(optimizer) -> None:
    """`xm.optimizer_step`: all-reduce gradients across replicas, then step."""
    import torch_xla.core.xla_model as xm

    xm.optimizer_step(optimizer)


def share_sharding(tensor, like) -> None:
    """Give `tensor` the SPMD sharding of `like` (nothing when `like` has none)."""
    import torch_xla

    sharding = torch_xla._XLAC._get_xla_op_sharding(like)
    if sharding is not None:
        torch_xla._XLAC._xla_mark_sharding(tensor, sharding)


def mark_sharding(tensor, mesh, spec: tuple) -> None:
    """`xs.mark_sharding`: lay `tensor` out over `mesh`, one mesh axis name (or None) per
    dimension."""
    import torch_xla.distributed.spmd as xs

    xs.mark_sharding(tensor, mesh, spec)


def replicate_unsharded(tensors, mesh) -> None:
    """Mark each of `tensors` that has no SPMD sharding yet as replicated over `mesh`.

    A graph's output is always annotated (at least "{replicated}"), while a tensor uploaded
    without a sharding has none, and the two count as different inputs: without this, the
    second training step compiles a second graph although nothing else changed."""
    import torch_xla.distributed.spmd as xs

    for tensor in tensors:
        if sharding_spec(tensor) == "":
            xs.mark_sharding(tensor, mesh, (None,) * tensor.dim())


def memory_info(dev=None) -> dict[str, int] | None:
    """Device memory (`bytes_used`, `bytes_limit`, `peak_bytes_used`), or None where the
    runtime cannot tell (XLA on the CPU raises UNIMPLEMENTED)."""
    _require()
    import torch_xla.core.xla_model as xm

    try:
        info = xm.get_memory_info(dev if dev is not None else device())
    except Exception:  # noqa: BLE001 - CPU: UNIMPLEMENTED; older versions: other errors
        return None
    keys = ("bytes_used", "bytes_limit", "peak_bytes_used")
    return {key: int(info[key]) for key in keys if key in info} or None


def metrics_snapshot() -> dict[str, Any]:
    """All torch_xla counters and metrics as plain data (starts the runtime).

    Returns:
        `{"counters": {name: int}, "metrics": {name: {"count", "total", "samples"}},
        "fallback_ops": [aten op names]}`. Absent counters are simply missing (torch_xla
        returns None for them).
    """
    _require()
    import torch_xla.debug.metrics as met

    counters = {}
    for name in met.counter_names():
        value = met.counter_value(name)
        if value is not None:
            counters[name] = int(value)
    metrics = {}
    for name in met.metric_names():
        data = met.metric_data(name)
        if data is not None:
            count, total, samples = data
            metrics[name] = {
                "count": int(count),
                "total": float(total),
                "samples": [(float(t), float(v)) for t, v in samples[-50:]],
            }
    fallback_ops = [str(op) for op in met.executed_fallback_ops()]
    return {"counters": counters, "metrics": metrics, "fallback_ops": fallback_ops}


# ---------------------------------------------------------------------------------------------
# Used by fine_tune's worker (start the runtime; only inside a launched worker)
# ---------------------------------------------------------------------------------------------


def metric_counts(names: tuple[str, ...]) -> dict[str, int]:
    """How many samples each torch_xla metric has recorded (0 when absent), e.g.
    `(COMPILE_TIME, *EXECUTE_TIMES, TRANSFER_FROM_DEVICE_TIME)`."""
    _require()
    import torch_xla.debug.metrics as met

    counts = {}
    for name in names:
        data = met.metric_data(name)
        counts[name] = int(data[0]) if data is not None else 0
    return counts


def wait_device_ops() -> None:
    """Block until every execution queued on the devices has finished (for timing)."""
    _require()
    import torch_xla.core.xla_model as xm

    xm.wait_device_ops()


def get_rng_state() -> int:
    """The seed the device's next graph will use for random ops (host-side, no transfer)."""
    _require()
    import torch_xla.core.xla_model as xm

    return int(xm.get_rng_state())


def set_rng_state(seed: int) -> None:
    """Set the device's random seed (dropout masks of the following steps depend on it)."""
    _require()
    import torch_xla.core.xla_model as xm

    xm.set_rng_state(int(seed))


def send_to_device(tensor, dev, mesh=None, partition_spec: tuple | None = None):
    """Copy a CPU tensor to the device; with a mesh, each device receives only its shard.

    Sharding at upload (`send_cpu_data_to_device` with a `ShardingSpec`) avoids uploading
    the whole batch to every device and resharding it there.
    """
    _require()
    import torch_xla.core.xla_model as xm

    sharding = None
    if mesh is not None:
        import torch_xla.distributed.spmd as xs

        sharding = xs.ShardingSpec(mesh, partition_spec)
    return xm.send_cpu_data_to_device([tensor], dev, sharding)[0]


def replicate(tensor, mesh) -> None:
    """Mark `tensor` fully replicated over the mesh, in place.

    Fetching a tensor that is sharded compiles a gather per tensor; a result marked replicated
    inside the step's graph is fetched with no extra compilation.
    """
    import torch_xla.distributed.spmd as xs

    xs.mark_sharding(tensor, mesh, (None,) * tensor.dim())


def broadcast_master_param(model) -> None:
    """Copy rank 0's parameters to every replica (`xm.broadcast_master_param`)."""
    _require()
    import torch_xla.core.xla_model as xm

    xm.broadcast_master_param(model)


# ---------------------------------------------------------------------------------------------
# Compilation tracing and the persistent compile cache
# ---------------------------------------------------------------------------------------------


def compile_times() -> tuple[int, list[float]]:
    """(compilations so far, the seconds of those torch_xla still holds samples of, oldest
    first): the `CompileTime` metric of this process. (0, []) before the runtime started."""
    if not runtime_is_initialized():
        return 0, []
    import torch_xla.debug.metrics as met

    data = met.metric_data(COMPILE_TIME)
    if data is None:
        return 0, []
    count, _, samples = data
    return int(count), [float(value) * 1e-9 for _, value in samples]


def graphs_ran() -> bool:
    """Whether this process has compiled or executed an XLA graph (after which torch_xla no
    longer reads `PT_XLA_DEBUG_LEVEL`). Never starts the runtime."""
    if not runtime_is_initialized():
        return False
    counts = metric_counts((COMPILE_TIME, *EXECUTE_TIMES))
    return any(counts.values())


def computation_cache_initialized() -> bool:
    """Whether torch_xla's computation cache exists (created at the first compilation; the
    persistent cache must be set up before it)."""
    if not is_imported():
        return False
    check = getattr(sys.modules["torch_xla"]._XLAC, "_xla_computation_cache_is_initialized", None)
    return bool(check()) if check is not None else False


def compiler_flags() -> dict[str, str]:
    """XLA_FLAGS and LIBTPU_INIT_ARGS as torch_xla leaves them (its import adds defaults)."""
    _require()
    import os

    return {name: os.environ.get(name, "") for name in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")}


def initialize_cache(path: str, readonly: bool = False) -> None:
    """`torch_xla.runtime.initialize_cache`: compiled programs are written to (and read from)
    `path`. Must run before this process's first compilation."""
    _require()
    import torch_xla.runtime as xr

    xr.initialize_cache(path, readonly=readonly)
