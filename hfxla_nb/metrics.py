"""Snapshots and diffs of torch_xla's metrics, and the analyzer that turns them into alerts.

Everything here is plain data in, plain data out: `metrics.py` never draws (the panels in
`hfxla_nb.ui` do) and, apart from `snapshot()`, never touches torch_xla.

A snapshot is the dict `_xla.metrics_snapshot()` returns:

```python
{"counters": {"UncachedCompile": 2, "aten::nonzero": 1, ...},
 "metrics": {"CompileTime": {"count": 2, "total": 3.6e8, "samples": [(t_ns, ns), ...]}, ...},
 "fallback_ops": ["aten::nonzero", ...],
 "input_shapes": {...}}           # optional, added by `hfxla_nb.report(inputs=...)`
```

Names read from torch_xla 2.9 (XLA on the CPU and TPU): compile count and time from the metric
`CompileTime` (nanoseconds; counter `UncachedCompile` as a fallback, `CachedCompile` for cache
hits), executions from `ExecuteTime` / `ExecuteReplicatedTime` (SPMD), transfers from
`TransferFromDeviceTime` / `TransferToDeviceTime` with their bytes in `InboundData` /
`OutboundData`, CPU fallbacks from the `aten::*` counters (`aten::_local_scalar_dense` is
`.item()`), steps from the `MarkStep` counter.

The analyzer applies PyTorch/XLA's own thresholds (the ones `PT_XLA_DEBUG_LEVEL` reports):
more than 0.5 compiles per step once past 10 warm-up steps, more than 0.5 device-to-host
transfers per step, any CPU fallback other than `aten::_local_scalar_dense`, any compile over
300 s or execution over 30 s.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

# PyTorch/XLA's own thresholds (torch_xla/csrc/runtime/metrics_analysis.cc, PT_XLA_DEBUG).
WARMUP_STEPS = 10
MAX_COMPILES_PER_STEP = 0.5
MAX_TRANSFERS_PER_STEP = 0.5
MAX_COMPILE_SECONDS = 300.0
MAX_EXECUTE_SECONDS = 30.0
ITEM_OP = "aten::_local_scalar_dense"

# How many distinct shapes one input keeps in a `ShapeTracker` (the rest are only counted).
MAX_SHAPES_PER_INPUT = 16

_NS = 1e-9


def snapshot() -> dict[str, Any]:
    """Every torch_xla counter and metric of this process, as plain data.

    Reading the counters is host-side only (no device sync) and does not start the XLA runtime.
    """
    from . import _xla

    return _xla.metrics_snapshot()


def device_memory() -> dict[str, int] | None:
    """Device memory (`bytes_used`, `bytes_limit`, `peak_bytes_used`) when this process runs
    the XLA runtime on a TPU; None elsewhere (XLA on the CPU does not report it)."""
    from . import _xla

    if not _xla.runtime_is_initialized() or _xla.device_type() in (None, "CPU"):
        return None
    return _xla.memory_info()


def diff(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, Any]:
    """What happened between two snapshots, as a snapshot of its own.

    Counters and metric counts/totals are subtracted; metric samples keep only those taken
    after `before`; `fallback_ops` lists the `aten::` counters that grew. Keys other than
    counters, metrics and fallback ops (such as `input_shapes`) are taken from `after`.
    """
    if not before:
        return dict(after)
    result = {key: value for key, value in after.items() if key not in ("counters", "metrics")}
    old_counters = before.get("counters", {})
    counters = {}
    for name, value in after.get("counters", {}).items():
        delta = int(value) - int(old_counters.get(name, 0))
        if delta:
            counters[name] = delta
    old_metrics = before.get("metrics", {})
    metrics = {}
    for name, data in after.get("metrics", {}).items():
        old = old_metrics.get(name, {"count": 0, "total": 0.0, "samples": []})
        count = int(data.get("count", 0)) - int(old.get("count", 0))
        if count <= 0:
            continue
        last_seen = max((t for t, _ in old.get("samples", [])), default=float("-inf"))
        metrics[name] = {
            "count": count,
            "total": float(data.get("total", 0.0)) - float(old.get("total", 0.0)),
            "samples": [(t, v) for t, v in data.get("samples", []) if t > last_seen],
        }
    result["counters"] = counters
    result["metrics"] = metrics
    result["fallback_ops"] = sorted(name for name in counters if name.startswith("aten::"))
    return result


# ---------------------------------------------------------------------------------------------
# Input shapes: which input changed shape, and when
# ---------------------------------------------------------------------------------------------


class ShapeTracker:
    """Remembers the distinct shapes each named input had, cheaply (a dict lookup per input).

    `record(step, {"input_ids": (16, 64), ...})` per step; `data()` gives
    `{name: [{"shape": [16, 64], "first": step, "last": step, "count": n}, ...]}` in order of
    first appearance, which the analyzer uses to say which input's shape changed. Thread-safe.
    """

    def __init__(self) -> None:
        self._shapes: dict[str, dict[tuple, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def record(self, step: int, shapes: dict[str, tuple]) -> bool:
        """Record this step's shapes; returns whether any input showed a shape not seen before."""
        new = False
        with self._lock:
            for name, shape in shapes.items():
                seen = self._shapes.setdefault(name, {})
                entry = seen.get(shape)
                if entry is None:
                    if len(seen) >= MAX_SHAPES_PER_INPUT:
                        shape = ("...",)  # too many to list: count the rest together
                        entry = seen.get(shape)
                    if entry is None:
                        entry = seen[shape] = {"shape": list(shape), "first": step, "count": 0}
                        new = new or len(seen) > 1
                entry["count"] += 1
                entry["last"] = step
        return new

    def data(self) -> dict[str, list[dict[str, Any]]]:
        """A picklable copy of what was recorded."""
        with self._lock:
            return {name: [dict(entry) for entry in seen.values()]
                    for name, seen in self._shapes.items()}


def shapes_of(inputs: Any) -> dict[str, tuple]:
    """`{name: shape}` for the tensors (anything with `.shape`) in a dict or batch; no sync."""
    items = inputs.items() if hasattr(inputs, "items") else ()
    shapes = {}
    for name, value in items:
        shape = getattr(value, "shape", None)
        if shape is None:
            continue
        try:
            shapes[str(name)] = tuple(int(size) for size in shape)
        except (TypeError, ValueError):  # symbolic sizes: keep their text
            shapes[str(name)] = tuple(str(size) for size in shape)
    return shapes


def changed_inputs(input_shapes: dict[str, list[dict[str, Any]]] | None) -> dict[str, list]:
    """`{name: [shape, ...]}` for every input that was seen with more than one shape."""
    return {
        name: [tuple(entry["shape"]) for entry in entries]
        for name, entries in (input_shapes or {}).items()
        if len(entries) > 1
    }


# ---------------------------------------------------------------------------------------------
# Summary: the numbers a panel shows
# ---------------------------------------------------------------------------------------------


@dataclass
class XlaSummary:
    """What a stretch of XLA work compiled, executed, transferred and fell back on.

    Times are in seconds, sizes in bytes. `None` means "not measured" (for example device
    memory on the CPU, or bytes where torch_xla does not count them).
    """

    steps: int | None = None
    compiles: int = 0
    compile_time: float = 0.0
    max_compile_time: float = 0.0
    cached_compiles: int = 0
    executions: int = 0
    execute_time: float = 0.0
    max_execute_time: float = 0.0
    transfers_from_device: int = 0
    transfer_from_device_time: float = 0.0
    bytes_from_device: int | None = None
    transfers_to_device: int = 0
    transfer_to_device_time: float = 0.0
    bytes_to_device: int | None = None
    item_calls: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)
    memory: dict[str, int] | None = None
    input_shapes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    compiles_after_warmup: int | None = None
    steps_after_warmup: int | None = None

    @property
    def compile_share(self) -> float | None:
        """Compile time as a fraction of compile + execute time (None when both are 0)."""
        total = self.compile_time + self.execute_time
        return self.compile_time / total if total > 0 else None

    def per_step(self, count: float) -> float | None:
        """`count` divided by the number of steps, or None when steps are unknown."""
        return count / self.steps if self.steps else None


def _metric(data: dict[str, Any], *names: str) -> tuple[int, float, float]:
    """(count, total, largest sample) summed over the metrics `names` that exist."""
    count, total, largest = 0, 0.0, 0.0
    for name in names:
        metric = data.get("metrics", {}).get(name)
        if not metric:
            continue
        count += int(metric.get("count", 0))
        total += float(metric.get("total", 0.0))
        largest = max([largest] + [float(v) for _, v in metric.get("samples", [])])
    return count, total, largest


def summarize(
    data: dict[str, Any],
    *,
    steps: int | None = None,
    memory: dict[str, int] | None = None,
    warmup: dict[str, Any] | None = None,
    warmup_step: int | None = None,
) -> XlaSummary:
    """Summarize a snapshot (or a `diff` of two) into an `XlaSummary`.

    Args:
        data: a snapshot or a diff.
        steps: how many training steps it covers; defaults to the `MarkStep` counter.
        memory: device memory (`bytes_used`, `bytes_limit`, `peak_bytes_used`), if known.
        warmup: the snapshot taken after the warm-up steps, to count compiles after warm-up.
        warmup_step: the step at which `warmup` was taken.
    """
    counters = data.get("counters", {})
    if steps is None:
        steps = counters.get("MarkStep") or None
    compiles, compile_ns, max_compile_ns = _metric(data, "CompileTime")
    if not compiles:
        compiles = int(counters.get("UncachedCompile", 0))
    executions, execute_ns, max_execute_ns = _metric(data, "ExecuteTime", "ExecuteReplicatedTime")
    if not executions:
        executions = int(counters.get("ExecuteComputation", 0)) + int(
            counters.get("ExecuteReplicated", 0)
        )
    from_count, from_ns, _ = _metric(data, "TransferFromDeviceTime")
    to_count, to_ns, _ = _metric(data, "TransferToDeviceTime")
    inbound = data.get("metrics", {}).get("InboundData")
    outbound = data.get("metrics", {}).get("OutboundData")
    fallbacks = {
        name: int(value)
        for name, value in counters.items()
        if name.startswith("aten::") and name != ITEM_OP and value
    }
    for name in data.get("fallback_ops", []):
        if name != ITEM_OP and name not in fallbacks and name.startswith("aten::"):
            fallbacks[name] = 1
    summary = XlaSummary(
        steps=steps,
        compiles=compiles,
        compile_time=compile_ns * _NS,
        max_compile_time=max_compile_ns * _NS,
        cached_compiles=int(counters.get("CachedCompile", 0)),
        executions=executions,
        execute_time=execute_ns * _NS,
        max_execute_time=max_execute_ns * _NS,
        transfers_from_device=from_count,
        transfer_from_device_time=from_ns * _NS,
        bytes_from_device=int(inbound["total"]) if inbound else None,
        transfers_to_device=to_count,
        transfer_to_device_time=to_ns * _NS,
        bytes_to_device=int(outbound["total"]) if outbound else None,
        item_calls=int(counters.get(ITEM_OP, 0)),
        fallbacks=dict(sorted(fallbacks.items(), key=lambda item: -item[1])),
        memory=dict(memory) if memory else None,
        input_shapes=dict(data.get("input_shapes") or {}),
    )
    if warmup is not None and warmup_step is not None and steps is not None:
        before = summarize(warmup, steps=warmup_step)
        summary.compiles_after_warmup = max(summary.compiles - before.compiles, 0)
        summary.steps_after_warmup = max(steps - warmup_step, 0)
    return summary


# ---------------------------------------------------------------------------------------------
# The analyzer
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Alert:
    """One finding, in plain language.

    Attributes:
        code: a stable identifier ("frequent-compiles", "frequent-transfers", "cpu-fallback",
            "recompiled", "slow-compile", "slow-execution").
        severity: "error", "warning" or "info".
        title: one line.
        explanation: what happened and its likely cause.
        fix: what to change.
    """

    code: str
    severity: str
    title: str
    explanation: str
    fix: str


def _shape_text(shape: tuple) -> str:
    return "(" + ", ".join(str(size) for size in shape) + ")"


def _shapes_cause(changed: dict[str, list]) -> str:
    parts = []
    for name, shapes in changed.items():
        listed = ", ".join(_shape_text(shape) for shape in shapes[:6])
        more = f" and {len(shapes) - 6} more" if len(shapes) > 6 else ""
        parts.append(f"input '{name}' had {len(shapes)} different shapes: {listed}{more}")
    return (
        "The likely cause: the input shapes changed ("
        + "; ".join(parts)
        + "). XLA compiles a new graph for every new shape."
    )


_SHAPES_FIX = (
    "Give every batch the same shape: pad to a fixed length (tokenizer(..., "
    "padding='max_length', max_length=N, truncation=True)) or to a few bucket lengths, and "
    "use drop_last=True so the last batch is not smaller."
)


def _compile_cause(summary: XlaSummary) -> tuple[str, str]:
    """The likely cause of recompilations and its fix, from shapes, transfers and fallbacks."""
    changed = changed_inputs(summary.input_shapes)
    if changed:
        return _shapes_cause(changed), _SHAPES_FIX
    transfers = summary.per_step(summary.transfers_from_device)
    if transfers is not None and transfers > MAX_TRANSFERS_PER_STEP:
        return (
            "The likely cause: a value is fetched from the device inside the step "
            f"({summary.transfers_from_device} transfers in {summary.steps} steps), which cuts "
            "the graph in two, and the pieces differ from step to step.",
            "Do not call .item(), print a tensor or branch on a tensor's value inside the step; "
            "report values with hfxla_nb.report(loss=loss), which fetches them every few steps.",
        )
    if summary.fallbacks:
        ops = ", ".join(summary.fallbacks)
        return (
            f"The likely cause: operations that ran on the CPU ({ops}) split the graph.",
            "Replace the operations listed in the CPU-fallback alert.",
        )
    return (
        "No input shape change was reported. Pass the batch to hfxla_nb.report(inputs=batch) to "
        "see which input changes shape, or run with PT_XLA_DEBUG_LEVEL=2 to have PyTorch/XLA "
        "print the cause of each compilation.",
        "Keep shapes and Python control flow the same in every step.",
    )


def analyze(summary: XlaSummary, *, warmup_steps: int = WARMUP_STEPS) -> list[Alert]:
    """Alerts for a summary, at PyTorch/XLA's own thresholds, most severe first.

    Args:
        summary: from `summarize`.
        warmup_steps: steps allowed to compile freely before compiles per step count.
    """
    alerts: list[Alert] = []
    steps = summary.steps

    if steps and steps > warmup_steps and summary.compiles / steps > MAX_COMPILES_PER_STEP:
        cause, fix = _compile_cause(summary)
        alerts.append(Alert(
            "frequent-compiles", "warning",
            f"Recompiling: {summary.compiles} compiles in {steps} steps",
            f"XLA compiled {summary.compiles / steps:.2f} graphs per step (more than "
            f"{MAX_COMPILES_PER_STEP} per step after {warmup_steps} warm-up steps), taking "
            f"{summary.compile_time:.1f} s. {cause}",
            fix,
        ))
    elif summary.compiles_after_warmup and summary.steps_after_warmup:
        changed = changed_inputs(summary.input_shapes)
        if changed:
            cause, fix = _compile_cause(summary)
            alerts.append(Alert(
                "recompiled", "info",
                f"{summary.compiles_after_warmup} compiles after warm-up",
                f"XLA compiled {summary.compiles_after_warmup} new graphs in the "
                f"{summary.steps_after_warmup} steps after warm-up. {cause}",
                fix,
            ))

    transfers = summary.transfers_from_device
    if steps and transfers / steps > MAX_TRANSFERS_PER_STEP:
        items = f", {summary.item_calls} of them .item() calls" if summary.item_calls else ""
        alerts.append(Alert(
            "frequent-transfers", "warning",
            f"Device-to-host transfers: {transfers} in {steps} steps",
            f"The program fetched values from the device {transfers / steps:.2f} times per step "
            f"(more than {MAX_TRANSFERS_PER_STEP}){items}. Each fetch waits for the device to "
            "finish and stops the next step's tracing from overlapping with it. Typical "
            "causes: .item(), print(tensor), `if tensor:`, logging every step (Trainer with "
            "logging_steps=1), and transformers' attention-mask check on padded batches.",
            "Fetch values only every N steps: hfxla_nb.report(loss=loss, log_every=N) or "
            "xm.add_step_closure; log less often; keep decisions on the host.",
        ))

    if summary.fallbacks:
        ops = ", ".join(f"{op} ({count}x)" for op, count in summary.fallbacks.items())
        alerts.append(Alert(
            "cpu-fallback", "warning",
            f"Operations ran on the CPU: {', '.join(summary.fallbacks)}",
            f"PyTorch/XLA has no XLA lowering for {ops}: each call copies its inputs to the "
            "host, runs there and copies the result back, which splits the graph.",
            "Replace the operation with one XLA supports (for example masks and torch.where "
            "instead of nonzero/boolean indexing), or move it outside the training step.",
        ))

    if summary.max_compile_time > MAX_COMPILE_SECONDS:
        alerts.append(Alert(
            "slow-compile", "warning",
            f"A compilation took {summary.max_compile_time:.0f} s",
            f"One graph took longer than {MAX_COMPILE_SECONDS:.0f} s to compile; large graphs "
            "(long unrolled loops, huge models traced at once) compile slowly.",
            "Sync more often (torch_xla.sync() inside long loops), use scan for repeated "
            "layers, or turn on the persistent compile cache on TPU.",
        ))
    if summary.max_execute_time > MAX_EXECUTE_SECONDS:
        alerts.append(Alert(
            "slow-execution", "warning",
            f"An execution took {summary.max_execute_time:.0f} s",
            f"One graph ran for longer than {MAX_EXECUTE_SECONDS:.0f} s: the step may be doing "
            "far more work than intended (a graph that keeps growing because it is never cut).",
            "Call torch_xla.sync() (or use MpDeviceLoader) once per step.",
        ))
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(alerts, key=lambda alert: order.get(alert.severity, 3))


# ---------------------------------------------------------------------------------------------
# Live: the snapshots a launch sends, per rank
# ---------------------------------------------------------------------------------------------


class LiveMetrics:
    """Keeps the `MetricsSnapshot` events of a launch and summarizes them per sending rank.

    Workers send cumulative snapshots (counters start at zero in a fresh worker), so the
    latest one describes the whole run so far; the first one taken past the warm-up steps
    is kept to count the compiles that came after warm-up.
    """

    def __init__(self, warmup_steps: int = WARMUP_STEPS) -> None:
        self.warmup_steps = warmup_steps
        self._latest: dict[Any, Any] = {}
        self._warm: dict[Any, Any] = {}

    def add(self, event: Any) -> None:
        """Add a `MetricsSnapshot` event (anything with rank, step, data, memory)."""
        rank = event.rank
        self._latest[rank] = event
        if rank not in self._warm and event.step is not None and event.step > self.warmup_steps:
            self._warm[rank] = event

    def ranks(self) -> list:
        """The ranks that sent snapshots, lowest first."""
        return sorted(self._latest, key=lambda rank: (rank is None, rank or 0))

    def summary(self, rank: Any = None) -> XlaSummary | None:
        """The summary for `rank` (default: the lowest rank that sent a snapshot)."""
        ranks = self.ranks()
        if not ranks:
            return None
        event = self._latest[rank if rank in self._latest else ranks[0]]
        warm = self._warm.get(event.rank)
        steps = event.step or None
        return summarize(
            event.data,
            steps=steps,
            memory=getattr(event, "memory", None),
            warmup=warm.data if warm is not None and warm is not event else None,
            warmup_step=warm.step if warm is not None and warm is not event else None,
        )

    def alerts(self) -> list[Alert]:
        """Alerts from every rank's latest snapshot, without repeats."""
        seen, alerts = set(), []
        for rank in self.ranks():
            summary = self.summary(rank)
            for alert in analyze(summary, warmup_steps=self.warmup_steps) if summary else []:
                if alert.code not in seen:
                    seen.add(alert.code)
                    alerts.append(alert)
        return alerts
