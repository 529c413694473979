"""What `report` keeps per worker process, and the metrics snapshots it sends from it.

torch_xla's counters belong to a process, whichever rank thread reads them: a snapshot names
the process's ranks and their steps (`data["process"]`), so rates can be per step of each rank.
Snapshots go out every `SNAPSHOT_INTERVAL` seconds while steps go on, just past the warm-up
steps, at the final step and when a rank ends (`reporting.rank_ended`).
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any

from .. import _xla, events
from ..events import MetricsSnapshot
from ..runtime import compile_cache
from . import reshards
from .metrics import WARMUP_STEPS
from .shapes import ShapeTracker

# Seconds between two MetricsSnapshot events of one process (the panel says "as of step N";
# a few a second keep it close to the bar, and reading the counters is host-side only).
SNAPSHOT_INTERVAL = 0.5


class ProcessState:
    """Per process and channel: the ranks it runs, their steps, when snapshots were sent, and
    the input shapes seen."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.lock = threading.Lock()
        self.last_snapshot: float | None = None
        self.warm_sent = False
        self.shapes = ShapeTracker()
        self.memory_available: bool | None = None
        self.memory: dict[str, int] | None = None
        self.max_step = 0
        self.ranks: set = set()  # ranks started in this process (rank_started)
        self.running: set = set()  # ... and not ended yet
        self.main_label: dict[Any, str] = {}  # rank -> the label it reported first
        self.steps: dict[Any, int] = {}  # rank -> largest step of its main label
        # The compilations when a main bar reached its total ({"step", "compiles",
        # "compile_ns"}): what compiles later (saving, evaluation) is not the step's.
        self.last_step: dict[str, int] | None = None
        # A bar of hfxla_nb's own that counts this process's work when no step is reported
        # ({"label", "step"}: `predict`'s batches), so the metrics count what the bar counts.
        self.bar: dict[str, Any] | None = None

    def all_ranks(self) -> list:
        """The ranks of this process (started, or seen reporting), lowest first."""
        ranks = self.ranks | {rank for rank in self.steps if rank is not None}
        return sorted(ranks)

    def step(self) -> int:
        """The process's step: that of its slowest reporting rank (their main bars)."""
        return min(self.steps.values()) if self.steps else self.max_step

    def rank_steps(self) -> int:
        """Steps of every rank of the process added up (a rank that does not report is
        counted at the slowest reporting rank's step)."""
        if not self.steps:
            return 0
        slowest = min(self.steps.values())
        ranks = self.ranks | set(self.steps)
        return sum(self.steps.get(rank, slowest) for rank in ranks)


def mark_last_step(process: ProcessState, step: int) -> None:
    """A main bar reached its total: note the compilations so far (a step closure, run after
    the next graph: the last step's own when `report` comes before its sync; in a loop that
    reports after the sync, the first graph after the last step is counted as the step's)."""
    try:
        metric = _xla.metrics_snapshot().get("metrics", {}).get(_xla.COMPILE_TIME) or {}
        with process.lock:
            process.last_step = {"step": step, "compiles": int(metric.get("count", 0)),
                                 "compile_ns": int(metric.get("total", 0))}
    except Exception as error:  # noqa: BLE001 - never break the user's sync
        warnings.warn(f"hfxla_nb.report could not read metrics: {error!r}", RuntimeWarning,
                      stacklevel=2)


def maybe_snapshot(process: ProcessState, send, final: bool, now: float) -> None:
    """Queue a metrics snapshot of this process, every few seconds (from whichever rank thread
    reports when one is due)."""
    if not _xla.runtime_is_initialized():
        return  # no XLA work in this process yet: nothing to measure
    with process.lock:
        warm = not process.warm_sent and process.step() > WARMUP_STEPS
        due = process.last_snapshot is None or now - process.last_snapshot >= SNAPSHOT_INTERVAL
        if not (final or warm or due):
            return
        process.last_snapshot = now
        process.warm_sent = process.warm_sent or warm
    # After the step's graph ran, so the counters include this step's compile and transfers.
    _xla.add_step_closure(send_snapshot, (process, send))


def send_snapshot(process: ProcessState, send) -> None:
    """Send the process's counters now (a step closure, or the end of a rank)."""
    try:
        with process.lock:  # progress first: the counters read next include at least that
            step = process.step()
            progress = process.rank_steps()
            ranks = process.all_ranks()
            last_step = dict(process.last_step) if process.last_step else None
            bar = dict(process.bar) if process.bar else None
        data = _xla.metrics_snapshot()
        data["input_shapes"] = process.shapes.data()
        data["reshards"] = reshards.data()
        data["process"] = {"pid": os.getpid(), "ranks": ranks, "rank_steps": progress}
        if last_step is not None:
            data["process"]["last_step"] = last_step
        if bar is not None:
            data["process"]["bar"] = bar
        data["compile_cache"] = compile_cache.worker_status()
        rank = ranks[0] if ranks else events.worker_rank()
        send(MetricsSnapshot(rank, step, data, memory(process)))
    except Exception as error:  # noqa: BLE001 - never break the user's sync
        warnings.warn(f"hfxla_nb.report could not read metrics: {error!r}", RuntimeWarning,
                      stacklevel=2)


def memory(process: ProcessState) -> dict[str, int] | None:
    """Device memory on TPU; on the CPU it is not available (asked once per process)."""
    if process.memory_available is False:
        return None
    info = None
    if _xla.device_type() not in (None, "CPU"):
        info = _xla.memory_info()
    process.memory_available = info is not None
    process.memory = info
    return info
