"""One process's XLA: its runtime, the graphs it compiles and its counters.

- The process: SPMD mode, spawning, the device, syncs, step closures, transfers, ranks,
  random state and the persistent compile cache.
- torch_xla's metric and counter names (torch_xla 2.8 and 2.9, XLA on the CPU and TPU),
  written only here: `observe.metrics` summarizes them and `fine_tune` counts some
  (`train.config.COUNTED`). A rename upstream is one edit.
- `CompiledGraph`: a traced graph compiled under its own key (torch_xla's Dynamo API) and
  run again by that key on new inputs, with no trace: training steps, decoding steps and
  evaluation batches after their first, and evaluation compiled while training compiles
  (`train.worker.evaluate`; `EvalAhead` there says why `sync()` cannot).
- torch_xla's counters and metrics (`torch_xla.debug.metrics`) as plain data.

Which calls start the runtime matters: a kernel that started it cannot launch workers.
`use_spmd`, `spawn`, `add_step_closure` and `initialize_cache` never start it (they must run
before it does), nor do `compile_times` and `graphs_ran`. Every other function here starts
it: only inside a launched worker, or in the kernel when the user asked for in-kernel work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .loader import degraded, require_torch_xla, runtime_is_initialized

# -- the process: SPMD, spawning, the device, syncs, ranks, random state, cache --

def use_spmd() -> None:
    """Turn on SPMD mode; must run before any tensor is placed on the device."""
    require_torch_xla()
    import torch_xla.runtime as xr

    xr.use_spmd()


def spawn(function: Callable[..., Any], args: tuple = ()) -> None:
    """`xmp.spawn(function, args, start_method="fork")`: one process per chip, threads per core.

    Where xmp.spawn would fork a single process (XLA:CPU, a one-chip TPU host), the calling
    process (a launch's fresh fork) becomes that process: it runs what xmp.spawn's pool process
    runs (`_run_thread_per_device` with the same initializer), without a second fork of a
    process as big as the kernel (`bench/launch_latency.py` measures what that saves).
    """
    require_torch_xla()
    import functools

    import torch_xla.distributed.xla_multiprocessing as xmp

    ranked = functools.partial(_after_item_fallback, function)
    body = _one_process_body(ranked, args)
    if body is None:
        xmp.spawn(ranked, args=args, start_method="fork")
    else:
        body()


_item_fallback_lock = threading.Lock()
_item_fallback_ready = False


def _after_item_fallback(function: Callable[..., Any], index: int, *args: Any) -> Any:
    """`function(index, *args)` in a rank thread, once this process's `.item()` fallback
    counter exists.

    torch_xla counts each CPU fallback op in a map it fills on the op's first call, without a
    lock (`_fallback_counters` in `torch_xla/csrc/aten_fallback.cpp`). Rank threads of one
    process (XLA on the CPU, TPU v2/v3) that call `.item()` for the first time at the same
    moment insert into it together, and about one in 50 such launches died of SIGSEGV in
    `xla_fallback`. So the first rank thread of a process calls the op once through XLA's
    kernel on a host tensor while the others wait; the count it adds is cleared, so a run's
    `.item()` calls are counted from zero. This runs in the rank thread, after torch_xla set
    the process up: on torch_xla 2.8 the same call made before `xmp.spawn` counts as starting
    the runtime, and xmp.spawn then refuses ("Runtime is already initialized"). Other ops that
    fall back are first called by ranks at the same moment far less often, and stay exposed to
    the race.
    """
    global _item_fallback_ready
    with _item_fallback_lock:
        if not _item_fallback_ready:
            import torch
            import torch_xla.debug.metrics as met

            xla = torch._C.DispatchKeySet(torch._C.DispatchKey.XLA)
            torch.ops.aten._local_scalar_dense.default.redispatch(xla, torch.zeros(()))
            met.clear_counters()
            _item_fallback_ready = True
    return function(index, *args)


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
    require_torch_xla()
    import torch_xla.core.xla_model as xm

    xm.add_step_closure(closure, args=args)


def initialize_cache(path: str, readonly: bool = False) -> None:
    """`torch_xla.runtime.initialize_cache`: compiled programs are written to (and read from)
    `path`. Must run before this process's first compilation."""
    require_torch_xla()
    import torch_xla.runtime as xr

    xr.initialize_cache(path, readonly=readonly)


def device():
    """The default XLA device of this process (starts the runtime)."""
    torch_xla = require_torch_xla()
    return torch_xla.device()


def sync() -> None:
    """Cut the lazy graph here and run it (`torch_xla.sync()`, formerly `xm.mark_step()`)."""
    torch_xla = require_torch_xla()
    if hasattr(torch_xla, "sync"):
        torch_xla.sync()
    else:  # pragma: no cover - torch_xla < 2.6
        import torch_xla.core.xla_model as xm

        xm.mark_step()


# How `sync()` moves the device's random seed (`MarkStep` in torch's lazy-tensor core, which
# torch_xla 2.8 and 2.9 use): seed <- 1012031 + seed * 7012063, modulo 2**64.
_SEED_ADD, _SEED_MUL = 1012031, 7012063


def end_step() -> None:
    """End a step that traced nothing (a graph run by its key) as `sync()` would, without a
    sync's walk over every live tensor, which costs the host milliseconds per step for a model
    of a few hundred tensors: the device's seed moves on exactly as a sync moves it (so the
    next step's dropout is the one a traced loop draws), and the step closures run. Anything
    traced since the last sync (an op in a callback) stays pending until the next sync."""
    require_torch_xla()
    import torch_xla.core.xla_model as xm

    run_closures = getattr(xm, "_run_step_closures", None)
    if run_closures is None:  # pragma: no cover - other torch_xla versions
        degraded("torch_xla.core.xla_model._run_step_closures",
                 "each step run by its compiled graph ends with a sync")
        sync()
        return
    set_rng_state((_SEED_ADD + get_rng_state() * _SEED_MUL) % 2**64)
    run_closures()


def to_cpu(tensors: list) -> list:
    """Copy XLA tensors that already hold values to the host in one transfer.

    Meant for step closures (after the graph ran): no extra execution, one
    `TransferFromDevice` for all of them, and no `aten::_local_scalar_dense` fallback.
    """
    torch_xla = require_torch_xla()
    get_cpu_tensors = getattr(torch_xla._XLAC, "_xla_get_cpu_tensors", None)
    if get_cpu_tensors is None:  # other torch_xla versions: public, one transfer per tensor
        degraded("torch_xla._XLAC._xla_get_cpu_tensors", "each value is fetched by itself "
                 "(`tensor.cpu()`: one transfer per tensor, not one for all)")
        return [tensor.cpu() for tensor in tensors]
    return list(get_cpu_tensors(list(tensors)))


def global_device_count() -> int:
    """All devices the runtime sees (starts the runtime)."""
    require_torch_xla()
    import torch_xla.runtime as xr

    return int(xr.global_runtime_device_count())


def world_size() -> int:
    """Number of replicated processes (starts the runtime)."""
    require_torch_xla()
    import torch_xla.runtime as xr

    return int(xr.world_size())


def process_device_count() -> int:
    """Devices this process drives: 1 per chip on v4 and later, one thread each on v2/v3 and on
    the CPU (starts the runtime)."""
    require_torch_xla()
    import torch_xla.runtime as xr

    return int(xr.addressable_runtime_device_count())


def global_ordinal() -> int:
    """This replica's rank (starts the runtime)."""
    require_torch_xla()
    import torch_xla.runtime as xr

    return int(xr.global_ordinal())


def optimizer_step(optimizer) -> None:
    """`xm.optimizer_step`: all-reduce gradients across replicas, then step."""
    import torch_xla.core.xla_model as xm

    xm.optimizer_step(optimizer)


def memory_info(dev=None) -> dict[str, int] | None:
    """Device memory (`bytes_used`, `bytes_limit`, `peak_bytes_used`), or None where the
    runtime cannot tell (XLA on the CPU raises UNIMPLEMENTED)."""
    require_torch_xla()
    import torch_xla.core.xla_model as xm

    try:
        info = xm.get_memory_info(dev if dev is not None else device())
    except Exception:  # noqa: BLE001 - CPU: UNIMPLEMENTED; older versions: other errors
        return None
    keys = ("bytes_used", "bytes_limit", "peak_bytes_used")
    return {key: int(info[key]) for key in keys if key in info} or None


def wait_device_ops() -> None:
    """Block until every execution queued on the devices has finished (for timing)."""
    require_torch_xla()
    import torch_xla.core.xla_model as xm

    xm.wait_device_ops()


def get_rng_state() -> int:
    """The seed the device's next graph will use for random ops (host-side, no transfer)."""
    require_torch_xla()
    import torch_xla.core.xla_model as xm

    return int(xm.get_rng_state())


def set_rng_state(seed: int) -> None:
    """Set the device's random seed (dropout masks of the following steps depend on it)."""
    require_torch_xla()
    import torch_xla.core.xla_model as xm

    xm.set_rng_state(int(seed))


def broadcast_master_param(model) -> None:
    """Copy rank 0's parameters to every replica (`xm.broadcast_master_param`)."""
    require_torch_xla()
    import torch_xla.core.xla_model as xm

    xm.broadcast_master_param(model)


# -- torch_xla's metric and counter names --

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


# -- graphs compiled off the step --

def tensor_id(tensor) -> int:
    """torch_xla's id of a device tensor (what `graph_inputs` names inputs by)."""
    return int(require_torch_xla()._XLAC._xla_get_tensor_id(tensor))


def graph_inputs(outputs: list, known: list) -> tuple[list[int], list]:
    """The device-data inputs of the graph of `outputs` (traced, not run), in order, and the
    id of the tensor each came from: `(input ids, inputs)`. An input from a `known` tensor is
    that tensor; any other is a new tensor on its data. (A new tensor on a weight's data would
    take over its buffer's owner id, and the next step would no longer donate that buffer:
    another graph.)

    It first waits for the executions queued on the devices: the walk reads each input's
    buffer, and an input that an earlier graph outputs is a placeholder that graph's run
    fills on another thread (reading it meanwhile crashed the process with SIGSEGV)."""
    xlac = require_torch_xla()._XLAC
    wait_device_ops()
    ids, inputs = xlac._get_tensors_xla_device_data_node(outputs, known)
    return list(ids), list(inputs)


def compile_graph(outputs: list, donated: list = ()) -> bytes:
    """Compile the graph of `outputs` into torch_xla's cache without running it, and return
    its key (the donated inputs are part of it). The GIL is released while it compiles.

    Args:
        outputs: the traced tensors.
        donated: inputs (of `graph_inputs`) whose buffers every run of the graph gives to
            its outputs: a value the run replaces (a parameter, a moment) needs no second
            buffer. Nothing may read such an input after a run.
    """
    xlac = require_torch_xla()._XLAC
    if not donated:
        key = xlac._get_graph_hash(outputs)
        xlac._xla_warm_up_cache(outputs, [])
        return key
    for tensor in donated:
        xlac._set_buffer_donation(tensor, True)
    saved = xlac._xla_get_enable_alias_with_buffer_donor_config()
    xlac._xla_set_enable_alias_with_buffer_donor_config(True)
    try:
        key = xlac._get_graph_hash(outputs)
        xlac._xla_warm_up_cache(outputs, [])
        return key
    except BaseException:
        for tensor in donated:  # a sync must not give these buffers away
            xlac._set_buffer_donation(tensor, False)
        raise
    finally:
        xlac._xla_set_enable_alias_with_buffer_donor_config(saved)


#: The slot of the device's random seed, an input of every graph with a random op (dropout).
SEED = ("seed",)

#: What a slot names: a role its caller gives a value for at each run, `SEED`, or
#: `("tensor", t)`: a weight or a constant of the trace, passed as it is.
Slot = tuple


@dataclass(frozen=True)
class Declined:
    """Why a traced graph is not run again by its key: its steps stay traced.

    Attributes:
        reason: one line a person can act on ("the step ran aten::nonzero on the CPU ...").
    """

    reason: str


def fallback_counts() -> dict[str, int]:
    """How many times each op has run on the CPU (torch_xla's `aten::<op>` counters): an op
    with no XLA lowering reads its inputs back from the device in the middle of a trace."""
    require_torch_xla()
    import torch_xla.debug.metrics as met

    return {name: int(met.counter_value(name) or 0) for name in met.counter_names()
            if name.startswith(FALLBACK_PREFIX)}


def fallbacks_since(before: Mapping[str, int]) -> list[str]:
    """The ops that ran on the CPU since `before` (`fallback_counts()`), by name."""
    return sorted(name.removeprefix(FALLBACK_PREFIX) for name, count in fallback_counts().items()
                  if count > before.get(name, 0))


class CompiledGraph:
    """A traced graph compiled under its key and run again on new data, with no trace.

    A step repeated with new data (a training step, a decoding step, an evaluation batch)
    traces the same graph each time; tracing it costs the host milliseconds per layer. So
    its first trace is compiled (torch_xla's cached-graph API, as its Dynamo bridge uses it)
    and every run passes new tensors in the places the trace read: each input is named by a
    role (what the caller gives at each run: a batch column, the state a step carries), is
    the device's seed (read at each run: each sync moves it on), or is a tensor passed as it
    is (a weight: its current value is read at each run). The traced tensors are then
    dropped by letting go of them (`clear_pending` would void whatever else is traced).

    A constant of the trace that is neither a role nor a known tensor was made on the host
    while tracing: a Python number torch_xla keeps on the device (`x * 0.5`: the same data at
    every trace), or a value uploaded (a numpy mask, a host random draw: new data each trace).
    Their places are `traced_constants`: a caller proves them the same at a second trace
    (`constants_unlike`) before it runs the graph again.

    Args:
        key: the compiled graph's key.
        slots: each input in order: a role, `SEED`, or `("tensor", t)`.
        device: the device the graph runs on (its seed is read there).
        traced_constants: the places of the `("tensor", t)` slots whose tensor was made while
            tracing (not a known tensor).
        buffers: each input's device buffer (its handle): two traces that read the same
            buffer read the same value.
    """

    def __init__(self, key: bytes, slots: list[Slot], device: Any,
                 traced_constants: tuple[int, ...] = (), buffers: tuple[int, ...] = ()) -> None:
        self.key, self.slots, self.device = key, slots, device
        self.traced_constants = traced_constants
        self.buffers = buffers
        # What `inputs` fills in per run: the constants are in place once.
        self.constants = [slot[1] if slot[0] == "tensor" else None for slot in slots]
        self.role_places = [(i, slot[0], slot[1] if len(slot) > 1 else None)
                            for i, slot in enumerate(slots)
                            if slot[0] != "tensor" and slot != SEED]
        self.seed_places = [i for i, slot in enumerate(slots) if slot == SEED]

    @property
    def reads_seed(self) -> bool:
        """Whether the graph has a random op: it reads the device's seed, which only syncs
        move on (runs with no sync between them draw alike)."""
        return bool(self.seed_places)

    @classmethod
    def read(cls, outputs: list, roles: dict[int, Slot],
             known: list = ()) -> tuple[CompiledGraph, list] | None:
        """The graph of `outputs` (traced, not run), not yet compiled (`key` is empty).

        Args:
            outputs: the traced tensors, in the order a run returns them.
            roles: `tensor_id` of an input (taken before the trace: an update in place
                gives a tensor a new id) -> its role.
            known: tensors passed as they are (weights): their inputs are these tensors.

        Returns:
            The graph and the inputs it was traced on; None where the compiled program
            could not return each output once, in order (an output not traced, or one
            named twice).
        """
        if len({id(tensor) for tensor in outputs}) < len(outputs) or not all(pending(outputs)):
            return None
        seed = seed_input_id()
        ids, inputs = graph_inputs(outputs, list(known))
        slots = [roles.get(tensor_id) or (SEED if tensor_id == seed else ("tensor", tensor))
                 for tensor_id, tensor in zip(ids, inputs, strict=True)]
        weights = {id(tensor) for tensor in known}
        traced = tuple(i for i, slot in enumerate(slots)
                       if slot[0] == "tensor" and id(slot[1]) not in weights)
        buffers = tuple(require_torch_xla()._XLAC._get_tensors_handle(inputs))
        return cls(b"", slots, outputs[0].device, traced, buffers), inputs

    def constants_unlike(self, second: CompiledGraph,
                         same_places: bool = True) -> list[str] | None:
        """The traced constants of this graph that `second`, a later trace of the same work,
        took other values for, each as "(1,) float32"; [] when all are the same; None when
        `second` is another graph: another key, a role or weight in one of this graph's
        places, or (`same_places`) constants in other places than this graph's.

        A constant both traces read from the same buffer (a tensor made once before them) is
        the same without a look; the others are fetched (one transfer each side)."""
        import torch

        places = self.traced_constants
        if (second.key != self.key or any(second.slots[i][0] != "tensor" for i in places)
                or (same_places and second.traced_constants != places)):
            return None
        fresh = [i for i in places if self.buffers[i] != second.buffers[i]]
        if not fresh:
            return []
        values = to_cpu([self.slots[i][1] for i in fresh])
        other = to_cpu([second.slots[i][1] for i in fresh])
        return sorted({f"{tuple(a.shape)} {str(a.dtype).removeprefix('torch.')}"
                       for a, b in zip(values, other, strict=True)
                       if not (a.shape == b.shape and a.dtype == b.dtype
                               and torch.equal(a, b))})

    @classmethod
    def capture(cls, outputs: list, roles: dict[int, Slot], known: list = (),
                donate: tuple[str, ...] = (), keep: frozenset = frozenset()
                ) -> tuple[CompiledGraph, list] | Declined:
        """`read`, then compiled.

        Args:
            outputs, roles, known: as `read` takes them.
            donate: the kinds of role (a role's first item) whose buffers each run gives to
                its outputs: values the run replaces, which nothing reads after it.
            keep: roles of those kinds whose buffers are not given (read, not replaced).

        Returns:
            The graph and the inputs it was traced on; `Declined` (with its cause) where it
            cannot be run again (`read`) or does not compile: the caller then syncs the
            traced tensors.
        """
        try:
            read = cls.read(outputs, roles, known)
            if read is None:
                return Declined("an output of the step is not traced, or is named twice")
            graph, inputs = read
            graph.key = compile_graph(outputs, [tensor for slot, tensor
                                                in zip(graph.slots, inputs, strict=True)
                                                if slot[0] in donate and slot not in keep])
        except Exception as error:  # noqa: BLE001 - the traced tensors then run as they are
            first = next(iter(str(error).strip().splitlines()), "")
            return Declined(f"compiling its graph by key raised {type(error).__name__}"
                            + (f": {first}" if first else ""))
        return graph, inputs

    def inputs(self, values: Mapping[str, Any]) -> list:
        """Each slot's tensor for a run.

        Args:
            values: role name -> a tensor (for a role `(name,)`), or what is indexed by the
                role's key (for `(name, key)`: a list, or a dict).

        Returns:
            The inputs in order: the roles' values, the device's seed, the constants.
        """
        inputs = list(self.constants)
        for i, name, key in self.role_places:
            inputs[i] = values[name] if key is None else values[name][key]
        for i in self.seed_places:
            inputs[i] = current_seed(self.device)
        return inputs

    def run(self, inputs: list, wait: bool = True) -> list:
        """The outputs of the graph run on `inputs` (`inputs(...)`, or `read`'s own).

        Args:
            inputs: a tensor per slot.
            wait: first wait for the runs queued on the devices (one run in flight): a run
                returns before it ran, and a host no longer tracing would queue run after
                run, each holding outputs of its own (steps that replace what they read).
                False: runs queue (evaluation batches, whose outputs are all kept).
        """
        if wait:
            wait_device_ops()
        return run_compiled(self.key, inputs)


def clear_pending() -> None:
    """Drop every pending (traced, not run) tensor's graph: those tensors become
    placeholders that must not be read, and no later sync includes them."""
    torch_xla = require_torch_xla()
    torch_xla._XLAC._clear_pending_irs(str(torch_xla.device()))


def pending(tensors: list) -> list[bool]:
    """For each tensor, whether it is traced and not yet run (a sync would compute it)."""
    return list(require_torch_xla()._XLAC._check_tensor_need_materialization(tensors))


def seed_input_id() -> int:
    """The id `graph_inputs` gives the device's random seed, an input of every graph with a
    random op (dropout): a graph run again by its key takes `current_seed()` there."""
    return int(require_torch_xla()._XLAC._get_seed_info_id())


def current_seed(device) -> Any:
    """The device's random seed as a tensor: what a graph traced now would read (each sync
    moves it on, so each step's dropout differs)."""
    return require_torch_xla()._XLAC._get_base_seed_as_tensor(str(device))


def replace_data(tensor, source) -> None:
    """Make `tensor` hold `source`'s value without tracing an op (a parameter takes the
    output of a graph run by its key; whatever `tensor` had traced is dropped)."""
    require_torch_xla()._XLAC._replace_xla_tensor(tensor, source)


def run_compiled(key: bytes, inputs: list) -> list:
    """Run a graph `compile_graph` compiled, on new inputs (same shapes, same order)."""
    return list(require_torch_xla()._XLAC._run_cached_graph(key, inputs))


def graph_lookups() -> int:
    """How many graphs syncs have looked up in torch_xla's compile cache (found or not): a sync
    looks up its graph right after it took its pending tensors, before it compiles."""
    require_torch_xla()
    import torch_xla.debug.metrics as met

    return sum(int(met.counter_value(name) or 0) - _baseline["counters"].get(name, 0)
               for name in (UNCACHED_COMPILE, CACHED_COMPILE))


# -- counters and metrics as plain data --

# A warm session's next job counts its figures from where the last one left them
# (`rebase_metrics`), as a fresh process counts from zero. A baseline only reads torch_xla's
# figures; its own reset (`met.clear_all()`) would change them under everything else that
# reads them in the process (the compile trace, `graph_lookups`, the loss fetcher).
_baseline: dict[str, Any] = {"counters": {}, "metrics": {}}


def rebase_metrics() -> None:
    """From now on, every figure of this process is counted from its value now
    (`metrics_snapshot`, `metric_counts`, `compile_times`, `graph_lookups`)."""
    global _baseline
    _baseline = _raw_snapshot()


def _raw_snapshot() -> dict[str, Any]:
    """torch_xla's counters and metrics as they are: `{"counters": {name: int}, "metrics":
    {name: {"count", "total", "samples"}}}` (the last 50 samples, `(time ns, value)`)."""
    require_torch_xla()
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
    return {"counters": counters, "metrics": metrics}


def _since(name: str, count: int, total: float, samples: list) -> dict[str, Any]:
    """A metric's figures since `rebase_metrics`: its count and total less the baseline's,
    its samples those recorded after the baseline's last one."""
    base = _baseline["metrics"].get(name)
    if base is None:
        return {"count": count, "total": total, "samples": samples}
    last = max((t for t, _ in base["samples"]), default=float("-inf"))
    return {"count": count - base["count"], "total": total - base["total"],
            "samples": [(t, v) for t, v in samples if t > last]}


def metrics_snapshot() -> dict[str, Any]:
    """All torch_xla counters and metrics as plain data (starts the runtime), counted since
    the last `rebase_metrics` (or the process's start).

    Returns:
        `{"counters": {name: int}, "metrics": {name: {"count", "total", "samples"}},
        "fallback_ops": [aten op names]}`. Absent counters are simply missing (torch_xla
        returns None for them).
    """
    import torch_xla.debug.metrics as met

    raw = _raw_snapshot()
    counters = {name: value - _baseline["counters"].get(name, 0)
                for name, value in raw["counters"].items()}
    metrics = {name: _since(name, data["count"], data["total"], data["samples"])
               for name, data in raw["metrics"].items()}
    fallback_ops = [str(op) for op in met.executed_fallback_ops()]
    return {"counters": counters, "metrics": metrics, "fallback_ops": fallback_ops}


def metric_counts(names: tuple[str, ...]) -> dict[str, int]:
    """How many samples each torch_xla metric has recorded since the last `rebase_metrics`
    (0 when absent), e.g. `(COMPILE_TIME, *EXECUTE_TIMES, TRANSFER_FROM_DEVICE_TIME)`."""
    require_torch_xla()
    import torch_xla.debug.metrics as met

    counts = {}
    for name in names:
        data = met.metric_data(name)
        base = _baseline["metrics"].get(name, {}).get("count", 0)
        counts[name] = int(data[0]) - base if data is not None else 0
    return counts


def compile_times() -> tuple[int, list[float]]:
    """(compilations since the last `rebase_metrics`, the seconds of those torch_xla still
    holds samples of, oldest first): the `CompileTime` metric of this process. (0, []) before
    the runtime started."""
    if not runtime_is_initialized():
        return 0, []
    import torch_xla.debug.metrics as met

    data = met.metric_data(COMPILE_TIME)
    if data is None:
        return 0, []
    count, total, samples = data
    since = _since(COMPILE_TIME, int(count), float(total),
                   [(float(t), float(v)) for t, v in samples])
    return since["count"], [value * 1e-9 for _, value in since["samples"]]


def graphs_ran() -> bool:
    """Whether this process has compiled or executed an XLA graph (after which torch_xla no
    longer reads `PT_XLA_DEBUG_LEVEL`). Never starts the runtime."""
    if not runtime_is_initialized():
        return False
    counts = metric_counts((COMPILE_TIME, *EXECUTE_TIMES))
    return any(counts.values())
