"""The final XLA figures of each rank of a launch, as plain data (`RankRecord.metrics`).

`MetricsCollector` takes the launch's `MetricsSnapshot` and `Progress` events, as the panels do,
and gives each rank a `RankMetrics`: the counters of the process that ran it (compiles,
executions, transfers, their times), its step times and the alerts of the final panel. Numbers
a notebook can put in a DataFrame or assert, instead of reading them off a panel.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..events import Compiled, MetricsSnapshot, Progress
from ..observe.analyzer import analyze
from ..observe.live import LiveMetrics


@dataclass
class RankMetrics:
    """What XLA did for one rank, as of the launch's last metrics snapshot.

    Attributes:
        shared_with: the ranks whose work these counters hold (torch_xla counts per process;
            rank threads of one process, as in replicated mode on the CPU, share them).
        steps: the step the counters were read at.
        compiles, cached_compiles: graphs compiled, and compilations found in the cache.
        compile_seconds: time spent compiling.
        executions, execute_seconds: graph executions and their time.
        transfers_from_device, transfer_from_device_seconds, bytes_from_device: device-to-host
            copies (bytes None where torch_xla does not count them).
        transfers_to_device, transfer_to_device_seconds, bytes_to_device: host-to-device.
        item_calls: `.item()` calls (each one a device-to-host transfer inside the step).
        fallbacks: CPU fallback operations and their counts.
        step_times: `(step, seconds per step)` for each progress update of the rank's first
            bar: the mean over the steps since the previous update.
        alerts: the alerts of the final panel, as dicts (code, severity, title, explanation,
            fix).
        largest_graph_bytes: what the compiled graph that needs the most device memory
            needs (XLA's post-compilation analysis: inputs, outputs not aliased,
            temporaries, the program); None when the launch was not traced.
    """

    shared_with: list[int] = field(default_factory=list)
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
    step_times: list[tuple[int, float]] = field(default_factory=list)
    alerts: list[dict[str, str]] = field(default_factory=list)
    largest_graph_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every figure as a plain dict (lists and dicts copied)."""
        return asdict(self)


class MetricsCollector:
    """Follows a launch's snapshots and progress; `rank_metrics(rank)` at the end."""

    def __init__(self) -> None:
        self.live = LiveMetrics()
        self._main_label: dict[int, str] = {}
        self._last: dict[int, tuple[int, float]] = {}  # rank -> (step, time) of its bar
        self._step_times: dict[int, list[tuple[int, float]]] = {}

    def handle(self, event: Any) -> None:
        """Take a `MetricsSnapshot`, `Compiled` (the largest graph's memory) or `Progress`
        event; others are ignored."""
        if isinstance(event, (MetricsSnapshot, Compiled)):
            self.live.add(event)
        elif isinstance(event, Progress) and event.rank is not None:
            self._progress(event)

    def _progress(self, event: Progress) -> None:
        if self._main_label.setdefault(event.rank, event.label) != event.label:
            return
        last = self._last.get(event.rank)
        if last is not None and event.step < last[0] and event.time > last[1]:
            last = None  # the bar counts from the start again (a new epoch)
        if last is None or (event.step > last[0] and event.time > last[1]):
            if last is not None:
                seconds = (event.time - last[1]) / (event.step - last[0])
                self._step_times.setdefault(event.rank, []).append((event.step, seconds))
            self._last[event.rank] = (event.step, event.time)

    def rank_metrics(self, rank: int) -> RankMetrics | None:
        """The figures of the process that ran `rank`, or None when it sent no snapshot (a
        function that never used XLA, or a rank that ended before its first one)."""
        ranks = self.live.process_ranks(rank)
        if rank not in ranks:
            return None
        summary = self.live.summary(rank)
        if summary is None:
            return None
        alerts = analyze(summary, warmup_steps=self.live.warmup_steps)
        largest = summary.trace.largest() if summary.trace is not None else None
        return RankMetrics(
            shared_with=list(ranks),
            steps=summary.steps,
            compiles=summary.compiles,
            cached_compiles=summary.cached_compiles,
            compile_seconds=summary.compile_time,
            executions=summary.executions,
            execute_seconds=summary.execute_time,
            transfers_from_device=summary.transfers_from_device,
            transfer_from_device_seconds=summary.transfer_from_device_time,
            bytes_from_device=summary.bytes_from_device,
            transfers_to_device=summary.transfers_to_device,
            transfer_to_device_seconds=summary.transfer_to_device_time,
            bytes_to_device=summary.bytes_to_device,
            item_calls=summary.item_calls,
            fallbacks=dict(summary.fallbacks),
            step_times=list(self._step_times.get(rank, [])),
            alerts=[asdict(alert) for alert in alerts],
            largest_graph_bytes=largest.memory if largest is not None else None,
        )


def dataframe(rows: list[dict[str, Any]]) -> Any:
    """`rows` as a pandas DataFrame (pandas is imported here, only when asked for)."""
    try:
        import pandas
    except ImportError as error:  # pragma: no cover - pandas comes with datasets
        raise ImportError("to_dataframe() needs pandas: pip install pandas") from error
    return pandas.DataFrame(rows)
