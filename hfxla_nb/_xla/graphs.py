"""Graphs compiled off the step (torch_xla's Dynamo API: compile a traced graph under its own
key, run it later by that key with new inputs). `train/worker/evaluate.py` compiles evaluation
this way while training compiles; docs/architecture.md says why `sync()` cannot. Every call
starts the runtime: only inside a launched worker.
"""

from __future__ import annotations

from .loader import require_torch_xla
from .names import CACHED_COMPILE, UNCACHED_COMPILE


def tensor_id(tensor) -> int:
    """torch_xla's id of a device tensor (what `graph_inputs` names inputs by)."""
    return int(require_torch_xla()._XLAC._xla_get_tensor_id(tensor))


def graph_inputs(outputs: list, known: list) -> tuple[bytes, list[int], list]:
    """The graph of `outputs` (traced, not run): `(key, input ids, inputs)`, its device-data
    inputs in order, each with the id of the tensor it came from. An input from a `known`
    tensor is that tensor; any other is a new tensor on its data. (A new tensor on a weight's
    data would take over its buffer's owner id, and the next step would no longer donate
    that buffer: another graph.)"""
    xlac = require_torch_xla()._XLAC
    ids, inputs = xlac._get_tensors_xla_device_data_node(outputs, known)
    return xlac._get_graph_hash(outputs), list(ids), list(inputs)


def compile_graph(outputs: list) -> None:
    """Compile the graph of `outputs` into torch_xla's cache under `graph_inputs`' key,
    without running it; the GIL is released while it compiles."""
    require_torch_xla()._XLAC._xla_warm_up_cache(outputs, [])


def clear_pending() -> None:
    """Drop every pending (traced, not run) tensor's graph: those tensors become
    placeholders that must not be read, and no later sync includes them."""
    torch_xla = require_torch_xla()
    torch_xla._XLAC._clear_pending_irs(str(torch_xla.device()))


def run_compiled(key: bytes, inputs: list) -> list:
    """Run a graph `compile_graph` compiled, on new inputs (same shapes, same order)."""
    return list(require_torch_xla()._XLAC._run_cached_graph(key, inputs))


def graph_lookups() -> int:
    """How many graphs syncs have looked up in torch_xla's compile cache (found or not): a sync
    looks up its graph right after it took its pending tensors, before it compiles."""
    require_torch_xla()
    import torch_xla.debug.metrics as met

    return sum(int(met.counter_value(name) or 0) for name in (UNCACHED_COMPILE, CACHED_COMPILE))
