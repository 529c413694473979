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
300 s or execution over 30 s. Rates are per step of each rank when the counters are those of a
process running several rank threads. Beyond torch_xla's rules, an input reported with more
than `MAX_QUIET_SHAPES` shapes is named even when every compilation fell in the warm-up.
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

# How many distinct shapes one input lists in a `ShapeTracker` (the rest are only counted)...
MAX_SHAPES_PER_INPUT = 16
# ... exactly up to this many more (past it, the count is a lower bound): bounded memory.
MAX_SHAPES_COUNTED = 4096
# More distinct shapes than this for one input gets an alert even when every compilation
# happened during warm-up. A few fixed bucket lengths are the recommended fix itself
# (`hfxla_nb.data` pads to at most 3 buckets), so up to 3 shapes stay quiet.
MAX_QUIET_SHAPES = 3

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

    Storage is bounded: the first `MAX_SHAPES_PER_INPUT` shapes of an input are listed; later
    ones are only counted (exactly up to `MAX_SHAPES_COUNTED` more) in one last entry
    `{"shape": ["..."], "first", "last", "count", "more": how many more distinct shapes,
    "exact": whether "more" is exact}`. Read the data with `input_shapes_of`.
    """

    def __init__(self) -> None:
        self._shapes: dict[str, dict[tuple, dict[str, Any]]] = {}
        self._unlisted: dict[str, set] = {}  # distinct shapes past the listed ones (bounded)
        self._overflow: dict[str, dict[str, Any]] = {}  # the steps that had unlisted shapes
        self._lock = threading.Lock()

    def record(self, step: int, shapes: dict[str, tuple]) -> bool:
        """Record this step's shapes; returns whether any input showed a shape not seen before."""
        new = False
        with self._lock:
            for name, shape in shapes.items():
                seen = self._shapes.setdefault(name, {})
                entry = seen.get(shape)
                if entry is None and len(seen) < MAX_SHAPES_PER_INPUT:
                    entry = seen[shape] = {"shape": list(shape), "first": step, "count": 0}
                    new = new or len(seen) > 1
                elif entry is None:  # too many to list: count the rest
                    entry = self._overflow.get(name)
                    if entry is None:
                        entry = self._overflow[name] = {
                            "shape": ["..."], "first": step, "count": 0, "more": 0, "exact": True,
                        }
                    unlisted = self._unlisted.setdefault(name, set())
                    if shape not in unlisted:
                        new = True
                        if len(unlisted) < MAX_SHAPES_COUNTED:
                            unlisted.add(shape)
                            entry["more"] = len(unlisted)
                        else:
                            entry["exact"] = False
                entry["count"] += 1
                entry["last"] = step
        return new

    def data(self) -> dict[str, list[dict[str, Any]]]:
        """A picklable copy of what was recorded."""
        with self._lock:
            result = {}
            for name, seen in self._shapes.items():
                entries = [dict(entry) for entry in seen.values()]
                if name in self._overflow:
                    entries.append(dict(self._overflow[name]))
                result[name] = entries
            return result


@dataclass(frozen=True)
class InputShapes:
    """The shapes one input had: the first ones seen (listed) and how many in all.

    Attributes:
        shapes: the listed shapes, in order of first appearance.
        first_steps: the step at which each listed shape first appeared.
        distinct: how many distinct shapes the input had (at least `len(shapes)`).
        exact: False when there were so many that `distinct` is only a lower bound.
    """

    shapes: list[tuple]
    first_steps: list[int | None]
    distinct: int
    exact: bool = True

    @property
    def more(self) -> int:
        """How many distinct shapes are not listed."""
        return max(self.distinct - len(self.shapes), 0)

    def count_text(self) -> str:
        """`23 different shapes`, or `more than 4112 different shapes`."""
        return f"{'' if self.exact else 'more than '}{self.distinct} different shapes"

    def listed_text(self, limit: int) -> str:
        """`(9, 8), (10, 8), (11, 8) and 20 more`: the first `limit` shapes, then how many
        were not shown."""
        if self.distinct == limit + 1:
            limit += 1  # "and 1 more" says less than the shape itself
        shown = self.shapes[:limit]
        text = ", ".join(_shape_text(shape) for shape in shown)
        rest = self.distinct - len(shown)
        if rest > 0:
            text += f" and {'' if self.exact else 'over '}{rest} more"
        return text


def input_shapes_of(data: dict[str, list[dict[str, Any]]] | None) -> dict[str, InputShapes]:
    """`ShapeTracker.data()` (or a snapshot's `input_shapes`) as `{name: InputShapes}`."""
    result = {}
    for name, entries in (data or {}).items():
        shapes, first_steps, distinct, exact = [], [], 0, True
        for entry in entries:
            if list(entry.get("shape", [])) == ["..."]:  # the shapes that were not listed
                distinct += int(entry.get("more", 1))
                exact = exact and "more" in entry and bool(entry.get("exact", True))
                continue
            shapes.append(tuple(entry["shape"]))
            first_steps.append(entry.get("first"))
            distinct += 1
        result[name] = InputShapes(shapes, first_steps, distinct, exact)
    return result


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
    """`{name: [shape, ...]}` (the listed shapes) for every input seen with more than one shape;
    `shape_changes` also gives how many shapes there were in all."""
    return {name: info.shapes for name, info in shape_changes(input_shapes).items()}


def shape_changes(input_shapes: dict[str, list[dict[str, Any]]] | None) -> dict[str, InputShapes]:
    """`{name: InputShapes}` for every input that was seen with more than one shape."""
    return {name: info for name, info in input_shapes_of(input_shapes).items()
            if info.distinct > 1}


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
    ranks: int = 1
    rank_steps: int | None = None

    @property
    def compile_share(self) -> float | None:
        """Compile time as a fraction of compile + execute time (None when both are 0)."""
        total = self.compile_time + self.execute_time
        return self.compile_time / total if total > 0 else None

    def per_step(self, count: float) -> float | None:
        """`count` per step (and per rank, when the counters are those of a process that ran
        `ranks` rank threads: `rank_steps` is the steps of all of them), or None when steps
        are unknown."""
        if self.ranks > 1 and self.rank_steps:
            return count / self.rank_steps
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

    A snapshot sent by `hfxla_nb.report` may carry `process`: `{"pid", "ranks": the ranks
    running as threads of the process whose counters these are, "rank_steps": their steps
    added up}`; rates per step are then per step of each rank.
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
    process = data.get("process") or {}
    summary.ranks = max(len(process.get("ranks") or ()), 1)
    if summary.ranks > 1 and process.get("rank_steps"):
        summary.rank_steps = int(process["rank_steps"])
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


def _shapes_listed(changed: dict[str, InputShapes], limit: int = 6) -> str:
    """`input 'x' had 23 different shapes: (9, 8), ..., (14, 8) and 17 more; input 'y' ...`."""
    return "; ".join(
        f"input '{name}' had {info.count_text()}: {info.listed_text(limit)}"
        for name, info in changed.items()
    )


def _shapes_cause(changed: dict[str, InputShapes]) -> str:
    return (
        "The likely cause: the input shapes changed ("
        + _shapes_listed(changed)
        + "). XLA compiles a new graph for every new shape."
    )


_SHAPES_FIX = (
    "Give every batch the same shape: pad to a fixed length (tokenizer(..., "
    "padding='max_length', max_length=N, truncation=True)) or to a few bucket lengths, and "
    "use drop_last=True so the last batch is not smaller."
)


def _compile_cause(summary: XlaSummary) -> tuple[str, str]:
    """The likely cause of recompilations and its fix, from shapes, transfers and fallbacks."""
    changed = shape_changes(summary.input_shapes)
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
    unit = "step" if summary.ranks <= 1 else f"step of each of the {summary.ranks} ranks"
    changed = shape_changes(summary.input_shapes)

    compile_rate = summary.per_step(summary.compiles)
    if steps and steps > warmup_steps and compile_rate > MAX_COMPILES_PER_STEP:
        cause, fix = _compile_cause(summary)
        alerts.append(Alert(
            "frequent-compiles", "warning",
            f"Recompiling: {summary.compiles} compiles in {steps} steps",
            f"XLA compiled {compile_rate:.2f} graphs per {unit} (more than "
            f"{MAX_COMPILES_PER_STEP} per step after {warmup_steps} warm-up steps), taking "
            f"{summary.compile_time:.1f} s. {cause}",
            fix,
        ))
    elif summary.compiles_after_warmup and summary.steps_after_warmup and changed:
        cause, fix = _compile_cause(summary)
        alerts.append(Alert(
            "recompiled", "info",
            f"{summary.compiles_after_warmup} compiles after warm-up",
            f"XLA compiled {summary.compiles_after_warmup} new graphs in the "
            f"{summary.steps_after_warmup} steps after warm-up. {cause}",
            fix,
        ))

    many = {name: info for name, info in changed.items() if info.distinct > MAX_QUIET_SHAPES}
    if many and not any(alert.code in ("frequent-compiles", "recompiled") for alert in alerts):
        # Every compile may have happened during warm-up (shapes that cycle), so the rate rules
        # stay silent, but each shape still cost a compilation and any new one costs another.
        names = ", ".join(f"'{name}'" for name in many)
        if len(many) == 1:
            title = f"Input {names} took {next(iter(many.values())).count_text()}"
        else:
            title = f"Inputs {names} took many different shapes"
        listed = _shapes_listed(many)
        compiled = ""
        if summary.compiles:
            during = (f", all in the first {warmup_steps} steps"
                      if summary.compiles_after_warmup == 0 else "")
            compiled = f" This run compiled {summary.compiles} graphs{during}."
        alerts.append(Alert(
            "shape-changes", "info", title,
            f"{listed[0].upper()}{listed[1:]}. XLA compiles a new graph for every new input "
            f"shape.{compiled} Later steps reuse those graphs, but each compilation can take "
            "minutes on a TPU, and every shape not seen yet (a longer text, a smaller last "
            "batch, an evaluation batch) compiles again.",
            _SHAPES_FIX,
        ))

    transfers = summary.transfers_from_device
    transfer_rate = summary.per_step(transfers)
    if steps and transfer_rate > MAX_TRANSFERS_PER_STEP:
        items = f", {summary.item_calls} of them .item() calls" if summary.item_calls else ""
        alerts.append(Alert(
            "frequent-transfers", "warning",
            f"Device-to-host transfers: {transfers} in {steps} steps",
            f"The program fetched values from the device {transfer_rate:.2f} times per {unit} "
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
# Live: the snapshots a launch sends, per process
# ---------------------------------------------------------------------------------------------


def snapshot_ranks(event: Any) -> list[int]:
    """The ranks whose work a `MetricsSnapshot`'s counters hold: every rank thread of the
    sending process when `report` said so (`data["process"]["ranks"]`), else the sender."""
    process = (getattr(event, "data", None) or {}).get("process") or {}
    ranks = [rank for rank in process.get("ranks") or () if rank is not None]
    if ranks:
        return sorted(ranks)
    return [] if event.rank is None else [event.rank]


def _source(event: Any) -> tuple:
    """Which process a snapshot describes: its pid when known, else its rank."""
    process = (getattr(event, "data", None) or {}).get("process") or {}
    pid = process.get("pid")
    return ("pid", pid) if pid is not None else ("rank", event.rank)


class LiveMetrics:
    """Keeps the `MetricsSnapshot` events of a launch and summarizes them per process.

    Workers send cumulative snapshots of their process's counters (counters start at zero in
    a fresh worker), so the latest one describes the whole run so far; the first one taken
    past the warm-up steps is kept to count the compiles that came after warm-up. The rank
    threads of one process share one set of counters, and any of them may send it: snapshots
    are grouped by process (`data["process"]["pid"]`, else by rank), and a reading that
    arrives after a newer one of the same process is ignored.
    """

    def __init__(self, warmup_steps: int = WARMUP_STEPS) -> None:
        self.warmup_steps = warmup_steps
        self._latest: dict[Any, Any] = {}
        self._warm: dict[Any, Any] = {}

    def add(self, event: Any) -> None:
        """Add a `MetricsSnapshot` event (anything with rank, step, data, memory)."""
        key = _source(event)
        old = self._latest.get(key)
        new_time, old_time = getattr(event, "time", None), getattr(old, "time", None)
        if old is None or new_time is None or old_time is None or new_time >= old_time:
            self._latest[key] = event
        if key not in self._warm and event.step is not None and event.step > self.warmup_steps:
            self._warm[key] = event

    def _sources(self) -> list:
        """Process keys, the one holding the lowest rank first."""
        def order(key):
            ranks = snapshot_ranks(self._latest[key])
            return (not ranks, ranks[0] if ranks else 0)

        return sorted(self._latest, key=order)

    def _find(self, rank: Any) -> Any:
        sources = self._sources()
        if not sources:
            return None
        for key in sources:
            if rank is not None and rank in snapshot_ranks(self._latest[key]):
                return key
        return sources[0]

    def ranks(self) -> list:
        """For each process that sent snapshots, its lowest rank; lowest first."""
        result = []
        for key in self._sources():
            ranks = snapshot_ranks(self._latest[key])
            result.append(ranks[0] if ranks else self._latest[key].rank)
        return result

    def process_ranks(self, rank: Any = None) -> list[int]:
        """The ranks whose work `summary(rank)` counts (several for rank threads of one
        process), lowest first."""
        key = self._find(rank)
        return [] if key is None else snapshot_ranks(self._latest[key])

    def summary(self, rank: Any = None) -> XlaSummary | None:
        """The summary of the process that runs `rank` (default: the one with the lowest rank)."""
        key = self._find(rank)
        if key is None:
            return None
        return self._summary(key)

    def _summary(self, key: Any) -> XlaSummary:
        event = self._latest[key]
        warm = self._warm.get(key)
        if warm is not None and (warm is event or warm.step is None or event.step is None
                                 or warm.step >= event.step):
            warm = None
        return summarize(
            event.data,
            steps=event.step or None,
            memory=getattr(event, "memory", None),
            warmup=warm.data if warm is not None else None,
            warmup_step=warm.step if warm is not None else None,
        )

    def alerts(self) -> list[Alert]:
        """Alerts from every process's latest snapshot, without repeats."""
        seen, alerts = set(), []
        for key in self._sources():
            summary = self._summary(key)
            for alert in analyze(summary, warmup_steps=self.warmup_steps):
                if alert.code not in seen:
                    seen.add(alert.code)
                    alerts.append(alert)
        return alerts
