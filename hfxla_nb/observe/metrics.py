"""Snapshots and diffs of torch_xla's counters, and the summary of a run, with its input shapes
and its reshards.

Plain data in, plain data out; only `snapshot()` and `device_memory()` reach torch_xla (through
`_xla`). A snapshot is the dict `_xla.metrics_snapshot()` returns:

```python
{"counters": {"UncachedCompile": 2, "aten::nonzero": 1, ...},
 "metrics": {"CompileTime": {"count": 2, "total": 3.6e8, "samples": [(t_ns, ns), ...]}, ...},
 "fallback_ops": ["aten::nonzero", ...],
 "input_shapes": {...}}           # optional, added by `hfxla_nb.report(inputs=...)`
```

What is read (the names are torch_xla's, written once in `_xla`): compile count and time from
the metric `CompileTime` (counter `UncachedCompile` as a fallback, `CachedCompile` for cache
hits), executions from `ExecuteTime` / `ExecuteReplicatedTime` (SPMD), transfers from
`TransferFromDeviceTime` / `TransferToDeviceTime` with their bytes in `InboundData` /
`OutboundData`, CPU fallbacks from the `aten::*` counters, steps from `MarkStep`.

Input shapes say which input of a step changed shape, and when (`hx.report(inputs=...)`): a
`ShapeTracker` in the worker remembers each input's distinct shapes, the snapshot carries them,
and `shape_changes` reads back the inputs whose shape changed.

Reshards: `xs.mark_sharding(x, mesh, spec)` on a tensor that an operation of the step already
used makes torch_xla copy `x` to the host and back, sharded, every step it runs. torch_xla's
analysis has no block for it (no graph runs), so the transfer alert could only guess. In an
SPMD worker, `watch` wraps `xs.mark_sharding`; each call that copied is counted under its user
frame, and the counts travel with the snapshots (their "reshards").
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .. import _xla
from .._xla import FALLBACK_PREFIX, ITEM_OP
from .tracing import Frame, locate

# -- reshards: sharding annotations that copied a tensor to the host --

_lock = threading.Lock()
_counts: dict[tuple[str, str, int, int | None], int] = {}  # (function, file, line, cell) -> n
_pid: int | None = None


def watch(cells: Mapping[str, int] | None = None) -> None:
    """From now on, count in this process each `xs.mark_sharding` that copied its tensor to the
    host, under the user's line that called it (`cells` names notebook cells)."""
    global _pid
    names = cells if cells is not None else {}  # a warm session adds later cells to it
    with _lock:
        if _pid == os.getpid():
            return
        _pid = os.getpid()
        _counts.clear()

    def copied(transfers: int) -> None:
        stack = traceback.extract_stack()[:-2]  # without this function and the wrapper
        frames = [Frame(entry.name, entry.filename, entry.lineno or 0,
                        names.get(entry.filename)) for entry in reversed(stack)]
        where, via = locate(frames)
        frame = where or via
        if frame is None:
            return
        key = (frame.function, frame.file, frame.line, frame.cell)
        with _lock:
            _counts[key] = _counts.get(key, 0) + transfers

    _xla.watch_mark_sharding(copied)


def new_job() -> None:
    """A warm session's next job starts in this process: its reshards are counted from none."""
    with _lock:
        _counts.clear()


def data() -> list[dict[str, Any]]:
    """The counts so far (plain data, for a snapshot): one dict per line, most first."""
    with _lock:
        if _pid != os.getpid():
            return []
        items = sorted(_counts.items(), key=lambda item: -item[1])
    return [{"function": function, "file": file, "line": line, "cell": cell, "count": count}
            for (function, file, line, cell), count in items]


def sites(snapshot_reshards: list[dict[str, Any]] | None) -> list[tuple[Frame, int]]:
    """A snapshot's "reshards" back as (frame, copies), most first; malformed entries skipped."""
    found = []
    for entry in snapshot_reshards or []:
        try:
            frame = Frame(str(entry["function"]), str(entry["file"]), int(entry["line"]),
                          None if entry.get("cell") is None else int(entry["cell"]))
            found.append((frame, int(entry["count"])))
        except (KeyError, TypeError, ValueError):
            continue
    return sorted(found, key=lambda pair: -pair[1])


# -- snapshots, diffs and the summary of a run --

# PyTorch/XLA's own debug analysis (PT_XLA_DEBUG_LEVEL) judges rates only after 10 steps.
WARMUP_STEPS = 10

_NS = 1e-9


def snapshot() -> dict[str, Any]:
    """Every torch_xla counter and metric of this process, as plain data.

    Reading the counters is host-side only (no device sync) and does not start the XLA runtime.
    """
    return _xla.metrics_snapshot()


def device_memory() -> dict[str, int] | None:
    """Device memory (`bytes_used`, `bytes_limit`, `peak_bytes_used`) when this process runs
    the XLA runtime on a TPU; None elsewhere (XLA on the CPU does not report it)."""
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
    result["fallback_ops"] = sorted(name for name in counters if name.startswith(FALLBACK_PREFIX))
    return result


# ---------------------------------------------------------------------------------------------
# Summary: the numbers a panel shows
# ---------------------------------------------------------------------------------------------


@dataclass
class XlaCounts:
    """The figures of a stretch of XLA work that a panel's summary and a launch's per-rank
    record share (`XlaSummary`, `observe.reader.RankMetrics`): one set of names.

    Times are in seconds, sizes in bytes; None means "not measured" (bytes where torch_xla
    does not count them).
    """

    steps: int | None = None
    compiles: int = 0
    cached_compiles: int = 0
    compile_seconds: float = 0.0
    executions: int = 0
    execute_seconds: float = 0.0
    transfers_from_device: int = 0
    transfer_from_device_seconds: float = 0.0
    bytes_from_device: int | None = None
    transfers_to_device: int = 0
    transfer_to_device_seconds: float = 0.0
    bytes_to_device: int | None = None
    item_calls: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)


@dataclass
class XlaSummary(XlaCounts):
    """What a stretch of XLA work compiled, executed, transferred and fell back on: the
    `XlaCounts`, and what a panel needs besides.

    `None` means "not measured" (for example device memory on the CPU).
    """

    max_compile_seconds: float = 0.0
    max_execute_seconds: float = 0.0
    memory: dict[str, int] | None = None
    input_shapes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    compiles_after_warmup: int | None = None
    steps_after_warmup: int | None = None
    # The compilations made by the end of the warm-up (the index of the last one, as the
    # trace counts them): a graph first compiled after it is a recompilation.
    warmup_compiles: int | None = None
    ranks: int = 1
    rank_steps: int | None = None
    # torch_xla's analysis of each compilation (`tracing.TraceLog`), when traced.
    trace: Any = None
    # Where the code calls `.item()` ("cell 4, line 10"), read from its source: named when
    # the trace does not (a value read after its graph ran runs no graph of its own).
    item_lines: list[str] = field(default_factory=list)
    # `xs.mark_sharding` calls that copied their tensor to the host (a tensor sharded after it
    # was used), per user line, most first (counted by `watch` above; SPMD launches only).
    reshards: list[tuple[Frame, int]] = field(default_factory=list)
    # Whether the code iterates a DataLoader (None: not known); fixes that need one depend on it.
    dataloader: bool | None = None
    # Compilations after the last step (saving, evaluation: once the main bar reached its
    # total), and their seconds; None when no bar reached a total. Never rated per step.
    compiles_after_steps: int | None = None
    compile_seconds_after_steps: float = 0.0
    # Whether `steps` is torch_xla's count of syncs (no step was reported, as in `predict`):
    # then no graph is owed per step, and none can be said not to have run.
    steps_from_syncs: bool = False
    # The bar that counts the work when no step was reported (`predict`'s batches): its label
    # and count. The panel counts its figures in it, as the bar does: "in 1 batch" beside
    # `predict 1/1`, not the 3 syncs (`counted`). The rates the analyzer judges stay per sync.
    bar_count: tuple[str, int] | None = None

    def steps_only(self) -> XlaSummary:
        """The summary without the compilations after the last step (what the per-step rules
        judge), itself when there were none."""
        if not self.compiles_after_steps:
            return self
        trace = self.trace
        until = self.compiles - self.compiles_after_steps
        return replace(self, compiles=until,
                       compile_seconds=max(
                           self.compile_seconds - self.compile_seconds_after_steps, 0.0),
                       trace=trace.until(until) if trace is not None else None,
                       compiles_after_steps=None, compile_seconds_after_steps=0.0)
    # The persistent compile cache: "hits", "misses", "unreadable" (entries XLA:CPU cannot
    # load) and, from the worker, its "folder", "entries", "bytes" and "limit".
    cache: dict[str, Any] | None = None

    @property
    def compile_share(self) -> float | None:
        """Compile time as a fraction of compile + execute time (None when both are 0)."""
        total = self.compile_seconds + self.execute_seconds
        return self.compile_seconds / total if total > 0 else None

    def counted(self) -> tuple[int | None, str]:
        """What the panel counts its figures in: `(1, "batch")` for work a bar counts in
        batches (`bar_count`, `predict`), else `(steps, "step")`."""
        if self.bar_count is not None:
            return self.bar_count[1], "batch"
        return self.steps, "step"

    def per_step(self, count: float) -> float | None:
        """`count` per step (and per rank, when the counters are those of a process that ran
        `ranks` rank threads: `rank_steps` is the steps of all of them), or None when steps
        are unknown."""
        if self.ranks > 1 and self.rank_steps:
            return count / self.rank_steps
        return count / self.steps if self.steps else None


def xla_exceeds_wall(summary: XlaSummary | None, wall_seconds: float) -> bool:
    """Whether XLA's execution time per step (`per_step(execute_seconds)`) is larger than
    `wall_seconds`, a step's wall time: the two cover different stretches (every graph since
    the start, against the latest steps), which a panel then says."""
    if summary is None or not summary.executions:
        return False
    per_step = summary.per_step(summary.execute_seconds)
    return per_step is not None and per_step > wall_seconds


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


def compile_count(data: dict[str, Any]) -> int:
    """How many graphs a snapshot says were compiled (as `summarize` counts them)."""
    count, _, _ = _metric(data, _xla.COMPILE_TIME)
    return count or int(data.get("counters", {}).get(_xla.UNCACHED_COMPILE, 0))


def _cache(counters: dict[str, Any], folder: dict[str, Any] | None) -> dict[str, Any] | None:
    """The compile cache's counters and folder, or None when no cache was used."""
    counts = {key: int(counters.get(name, 0))
              for key, name in _xla.PERSISTENT_CACHE_COUNTERS.items()}
    if not folder and not any(counts.values()):
        return None
    return {**counts, **(folder or {})}


def _fallbacks(counters: dict[str, Any], ops: list[str]) -> dict[str, int]:
    """CPU fallback operations and their counts (an op named without a count: 1), the
    `.item()` op left out (it is counted as `item_calls`)."""
    fallbacks = {
        name: int(value)
        for name, value in counters.items()
        if name.startswith(FALLBACK_PREFIX) and name != ITEM_OP and value
    }
    for name in ops:
        if name != ITEM_OP and name not in fallbacks and name.startswith(FALLBACK_PREFIX):
            fallbacks[name] = 1
    return fallbacks


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
    from_syncs = steps is None
    if steps is None:
        steps = counters.get(_xla.MARK_STEP) or None
    compiles, compile_ns, max_compile_ns = _metric(data, _xla.COMPILE_TIME)
    if not compiles:
        compiles = int(counters.get(_xla.UNCACHED_COMPILE, 0))
    executions, execute_ns, max_execute_ns = _metric(data, *_xla.EXECUTE_TIMES)
    if not executions:
        executions = sum(int(counters.get(name, 0)) for name in _xla.EXECUTE_COUNTERS)
    from_count, from_ns, _ = _metric(data, _xla.TRANSFER_FROM_DEVICE_TIME)
    to_count, to_ns, _ = _metric(data, _xla.TRANSFER_TO_DEVICE_TIME)
    inbound = data.get("metrics", {}).get(_xla.BYTES_FROM_DEVICE)
    outbound = data.get("metrics", {}).get(_xla.BYTES_TO_DEVICE)
    fallbacks = _fallbacks(counters, data.get("fallback_ops", []))
    summary = XlaSummary(
        steps=steps,
        compiles=compiles,
        compile_seconds=compile_ns * _NS,
        max_compile_seconds=max_compile_ns * _NS,
        cached_compiles=int(counters.get(_xla.CACHED_COMPILE, 0)),
        executions=executions,
        execute_seconds=execute_ns * _NS,
        max_execute_seconds=max_execute_ns * _NS,
        transfers_from_device=from_count,
        transfer_from_device_seconds=from_ns * _NS,
        bytes_from_device=int(inbound["total"]) if inbound else None,
        transfers_to_device=to_count,
        transfer_to_device_seconds=to_ns * _NS,
        bytes_to_device=int(outbound["total"]) if outbound else None,
        item_calls=int(counters.get(ITEM_OP, 0)),
        fallbacks=dict(sorted(fallbacks.items(), key=lambda item: -item[1])),
        memory=dict(memory) if memory else None,
        input_shapes=dict(data.get("input_shapes") or {}),
    )
    summary.cache = _cache(counters, data.get("compile_cache"))
    summary.reshards = sites(data.get("reshards"))
    summary.steps_from_syncs = from_syncs and steps is not None
    process = data.get("process") or {}
    summary.ranks = max(len(process.get("ranks") or ()), 1)
    if summary.ranks > 1 and process.get("rank_steps"):
        summary.rank_steps = int(process["rank_steps"])
    bar = process.get("bar")
    if summary.steps_from_syncs and bar and bar.get("step"):
        summary.bar_count = (str(bar.get("label", "")), int(bar["step"]))
    last_step = process.get("last_step")
    if last_step and "compiles" in last_step:
        summary.compiles_after_steps = max(compiles - int(last_step["compiles"]), 0)
        summary.compile_seconds_after_steps = max(
            compile_ns - int(last_step.get("compile_ns", 0)), 0) * _NS
    if warmup is not None and warmup_step is not None and steps is not None:
        before = summarize(warmup, steps=warmup_step)
        summary.compiles_after_warmup = max(summary.compiles - before.compiles, 0)
        summary.warmup_compiles = before.compiles
        summary.steps_after_warmup = max(steps - warmup_step, 0)
    return summary


# -- input shapes: which input changed shape, and when --

# How many distinct shapes one input lists in a `ShapeTracker` (the rest are only counted)...
MAX_SHAPES_PER_INPUT = 16
# ... exactly up to this many more (past it, the count is a lower bound): bounded memory.
MAX_SHAPES_COUNTED = 4096
# More distinct shapes than this for one input gets an alert even when every compilation
# happened during warm-up. A few fixed bucket lengths are the recommended fix itself
# (`train.batching` pads to at most 3 buckets), so up to 3 shapes stay quiet.
MAX_QUIET_SHAPES = 3


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


def shape_text(shape: tuple) -> str:
    """"(16, 64)" for a shape."""
    return "(" + ", ".join(str(size) for size in shape) + ")"


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
        text = ", ".join(shape_text(shape) for shape in shown)
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


def shape_changes(input_shapes: dict[str, list[dict[str, Any]]] | None) -> dict[str, InputShapes]:
    """`{name: InputShapes}` for every input that was seen with more than one shape."""
    return {name: info for name, info in input_shapes_of(input_shapes).items()
            if info.distinct > 1}
