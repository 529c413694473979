"""`LiveMetrics`: the `MetricsSnapshot` events of a launch, kept per process and summarized."""

from __future__ import annotations

from typing import Any

from ..events import Compiled
from .analyzer import Alert, analyze
from .metrics import WARMUP_STEPS, XlaSummary, compile_count, summarize
from .trace_log import TraceLog


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
    pid = getattr(event, "pid", None) or process.get("pid")
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
        self._traces: dict[Any, TraceLog] = {}
        # Per process: (step, compiles so far) of each snapshot, and the spans of steps in
        # which the compile count grew (`compiled_spans`).
        self._compile_counts: dict[Any, tuple[int, int]] = {}
        self._compiled: dict[Any, list[tuple[int, int]]] = {}

    def add(self, event: Any) -> None:
        """Add a `MetricsSnapshot` event (anything with rank, step, data, memory), or a
        `Compiled` event (torch_xla's analysis of the process's compilations)."""
        key = _source(event)
        if isinstance(event, Compiled):
            trace = self._traces.setdefault(key, TraceLog())
            trace.add(event.records)
            trace.executions = tuple(event.executions)
            if event.device:
                trace.device_memory = event.device.get("memory")
                trace.device_name = event.device.get("name")
            return
        old = self._latest.get(key)
        new_time, old_time = getattr(event, "time", None), getattr(old, "time", None)
        if old is None or new_time is None or old_time is None or new_time >= old_time:
            self._latest[key] = event
        if key not in self._warm and event.step is not None and event.step > self.warmup_steps:
            self._warm[key] = event
        self._note_compiles(key, event)

    def _note_compiles(self, key: Any, event: Any) -> None:
        """Keep the span of steps since the previous snapshot when compiles were added."""
        step = event.step
        if step is None:
            return
        count = compile_count(event.data or {})
        before_step, before = self._compile_counts.get(key, (0, 0))
        if step < before_step:
            return  # a reading older than one already kept
        if count > before:
            self._compiled.setdefault(key, []).append((before_step, step))
        self._compile_counts[key] = (step, max(count, before))

    def compiled_spans(self, rank: Any = None) -> list[tuple[int, int]]:
        """`(after, upto)`: the spans of steps (`after + 1` to `upto`) in which the process
        that runs `rank` compiled, as its snapshots' compile counts show (steps of its main
        bar, the one `report` counts)."""
        key = self._find(rank)
        return list(self._compiled.get(key, [])) if key is not None else []

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
        summary = summarize(
            event.data,
            steps=event.step or None,
            memory=getattr(event, "memory", None),
            warmup=warm.data if warm is not None else None,
            warmup_step=warm.step if warm is not None else None,
        )
        summary.trace = self._traces.get(key)
        return summary

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
