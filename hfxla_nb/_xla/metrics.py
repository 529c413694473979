"""torch_xla's counters and metrics (`torch_xla.debug.metrics`) as plain data. `metrics_snapshot`
and `metric_counts` start the runtime (only inside a launched worker); `compile_times` and
`graphs_ran` never do.
"""

from __future__ import annotations

from typing import Any

from .loader import require_torch_xla, runtime_is_initialized
from .names import COMPILE_TIME, EXECUTE_TIMES


def metrics_snapshot() -> dict[str, Any]:
    """All torch_xla counters and metrics as plain data (starts the runtime).

    Returns:
        `{"counters": {name: int}, "metrics": {name: {"count", "total", "samples"}},
        "fallback_ops": [aten op names]}`. Absent counters are simply missing (torch_xla
        returns None for them).
    """
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
    fallback_ops = [str(op) for op in met.executed_fallback_ops()]
    return {"counters": counters, "metrics": metrics, "fallback_ops": fallback_ops}


def metric_counts(names: tuple[str, ...]) -> dict[str, int]:
    """How many samples each torch_xla metric has recorded (0 when absent), e.g.
    `(COMPILE_TIME, *EXECUTE_TIMES, TRANSFER_FROM_DEVICE_TIME)`."""
    require_torch_xla()
    import torch_xla.debug.metrics as met

    counts = {}
    for name in names:
        data = met.metric_data(name)
        counts[name] = int(data[0]) if data is not None else 0
    return counts


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
