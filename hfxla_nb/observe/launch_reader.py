"""`LaunchReader`: the one reader of a launch's events.

Every event of a launch is applied here, once: to its record (each rank's state, result,
error, bars), to its progress bars (`observe.bars`) and to its metrics (`LiveMetrics`). The
launcher's decisions (a failure, a silent rank, the end) and every panel (`ui.state`) read
what this reader holds, so the record, the panels and `last_launch()` cannot disagree. It
forks, reads and draws nothing, so tests drive it with events alone.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable

from ..events import (
    Compiled,
    Event,
    Failed,
    Finished,
    Generated,
    MetricsSnapshot,
    ProcessesStopped,
    ProcessExited,
    Progress,
    Started,
)
from ..states import BaseLaunchRecord, BaseRankRecord, Outcome, RankState
from .bars import BarTrack, advance, bar_start
from .generated import StreamedText
from .live import LiveMetrics
from .rank_metrics import RankMetrics, rank_metrics

HEARTBEAT_WARNING = 60.0  # seconds of silence before a rank is said to be quiet
# A rank that has not started may be waiting on a slow runtime start (a TPU's takes seconds):
# `heartbeat_timeout` stops it only after at least this long.
STARTUP_GRACE = 60.0


class LaunchReader:
    """Applies a launch's events to its record, its bars and its metrics.

    Args:
        record: the launch's record, filled in as events arrive.
        timeout: the launch's `timeout=` (for the `LaunchError`'s words), or None.
        heartbeat_timeout: seconds of silence after which a rank is stopped, or None.
        clock: the wall clock (`time.time`, the clock of the events' `time`), replaceable in
            tests.
        follower: called with each event once it is applied (`report_to=`'s tracker,
            `observe.tracking.Tracker.handle`), or None.

    Attributes:
        record: the record.
        bars: every progress bar, by (rank, label), in the order they first reported.
        metrics: the launch's metrics snapshots and compilation traces, per process.
        streamed: the text of its generations so far, row by row (`Generated` events).
        failure: the rank record of the first failure, once one is known.
        raised: (rank, exception type) of each `Failed` event, in order (rank None: the
            launch's supervisor itself).
        pid_ranks: which ranks each process runs.
        began: when the reader was made (wall clock); `ended`: when `end` was called.
        heard: each rank's latest event (wall clock).
        changes: how many events were applied (renderers skip identical redraws).
        rank_names: "host 1 rank 2" where "rank R" is not enough (a launch over hosts).
    """

    def __init__(self, record: BaseLaunchRecord, timeout: float | None = None,
                 heartbeat_timeout: float | None = None,
                 clock: Callable[[], float] = time.time,
                 follower: Callable[[Event], None] | None = None) -> None:
        self.record = record
        self.follower = follower
        self.timeout = timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.clock = clock
        self.began = clock()
        self.ended: float | None = None
        self.bars: dict[tuple[int | None, str], BarTrack] = {}
        self.metrics = LiveMetrics()
        self.streamed = StreamedText()
        self.failure: BaseRankRecord | None = None
        self.raised: list[tuple[int | None, str]] = []
        self.pid_ranks: dict[int, set[int]] = {}
        self.heard: dict[int, float] = {}
        self.rank_start: dict[int, float] = {}
        self.warned_silent: set[int] = set()
        self.stopped_as: RankState | None = None  # how ranks still running ended, once stopped
        self.changes = 0
        self.rank_names: dict[int, str] = {}
        self._stopped: dict[int, str] = {}  # stopped_processes by pid (see note_stopped)
        began = time.monotonic()
        for rank_record in record.ranks:  # a rank that never starts is silent from the start
            rank_record.last_seen = rank_record.last_seen or began

    def handle(self, event: Event) -> None:
        """Apply one event (a `Log` or `Heartbeat` only marks its rank as alive)."""
        self.changes += 1
        rank_record = self.rank(event.rank)
        if rank_record is not None:
            rank_record.last_seen = time.monotonic()
            self.heard[rank_record.rank] = self.clock()
        if isinstance(event, Started) and rank_record is not None:
            rank_record.pid = event.pid
            # A Started read after the stop (queued while the launch was being stopped) is
            # that of a rank that was stopped too.
            rank_record.exit_state = self.stopped_as or RankState.RUNNING
            rank_record.started_at = time.monotonic()
            self.rank_start.setdefault(rank_record.rank, self.clock())
            self.pid_ranks.setdefault(event.pid, set()).add(event.rank)
        elif isinstance(event, Progress) and rank_record is not None:
            self._progress(rank_record, event)
        elif isinstance(event, (MetricsSnapshot, Compiled)):
            self.metrics.add(event)
        elif isinstance(event, Finished) and rank_record is not None:
            rank_record.exit_state = RankState.FINISHED
            rank_record.result = event.result
            rank_record.duration = event.duration
        elif isinstance(event, Failed):
            self.raised.append((event.rank, event.exc_type))
            self._record_failure(rank_record, event)
        elif isinstance(event, ProcessExited):
            self._record_exit(event)
        elif isinstance(event, ProcessesStopped):
            self.note_stopped(event.processes)
        elif isinstance(event, Generated):
            self.streamed.add(event)
        if self.follower is not None:
            self.follower(event)

    def _progress(self, rank_record: BaseRankRecord, event: Progress) -> None:
        key = (event.rank, event.label)
        bar = self.bars.get(key)
        if event.waiting:  # drawn from now on, started by its next event
            if bar is None:
                self.bars[key] = BarTrack(event.label, event.rank, total=event.total)
            return
        if bar is None or bar.waiting:
            others = [other for other in self.rank_bars(event.rank) if other is not bar]
            bar = bar or BarTrack(event.label, event.rank)
            bar.first_step = event.step
            bar.start = bar_start(event, others, rank_record.exit_state,
                                  self.rank_start.get(rank_record.rank))
            self.bars[key] = bar
        advance(bar, event)
        # The record says what the bar says (a late fetch's earlier step moves neither).
        if event.label == "train" or rank_record.last_step is None:
            rank_record.last_step = bar.step
        rank_record.bars[event.label] = (bar.step, bar.total)

    def rank_bars(self, rank: int | None) -> list[BarTrack]:
        """The bars of `rank`, in the order they first reported (its main bar first)."""
        return [bar for (bar_rank, _), bar in self.bars.items() if bar_rank == rank]

    def note_stopped(self, processes: dict[int, str]) -> None:
        """Name processes the launch left running and had to stop (pid -> `describe`'s words:
        "sleep 600 (pid 1234)"). The supervisor and the notebook may both name one (each
        stops what it finds): it is named once, by its command line where one side read it
        before the process ended (an ended process shows only its name: "[sleep] (pid 1234)")."""
        for pid, words in processes.items():
            if pid not in self._stopped or self._stopped[pid].startswith("["):
                self._stopped[pid] = words
        self.record.stopped_processes[:] = [self._stopped[pid] for pid in sorted(self._stopped)]

    def rank_metrics(self, rank: int) -> RankMetrics | None:
        """The final figures of the process that ran `rank`, with the rank's step times (of
        its main bar), or None when it sent no snapshot (a function that never used XLA, or a
        rank that ended before its first one)."""
        ranks = self.metrics.process_ranks(rank)
        summary = self.metrics.summary(rank) if rank in ranks else None
        if summary is None:
            return None
        bars = self.rank_bars(rank)
        steps = bars[0].step_times if bars else []
        return rank_metrics(summary, ranks, steps, self.metrics.warmup_steps)

    def end(self) -> None:
        """The launch is over: the panels' clocks stop."""
        self.ended = self.clock()

    def _record_failure(self, rank_record: BaseRankRecord | None, event: Failed) -> None:
        if rank_record is None:  # the supervisor itself failed (e.g. xmp.spawn raised)
            if self.failure is not None:
                return  # the cause was already reported by a rank or a ProcessExited
            rank_record = next(
                (r for r in self.record.ranks if r.exit_state != RankState.FINISHED), None)
            if rank_record is None:
                return
            if "BrokenProcessPool" in event.exc_type:
                rank_record.exit_state = RankState.KILLED
                rank_record.reason = "ended abruptly"
                rank_record.error = (
                    "its process ended abruptly without reporting: a signal (SIGKILL from the "
                    "out-of-memory killer is the usual one: check host memory) or os._exit()"
                )
                self.failure = rank_record
                return
        rank_record.exit_state = RankState.FAILED
        rank_record.error = f"{event.exc_type}: {event.message}"
        rank_record.reason = f"raised {event.exc_type}"
        rank_record.traceback = event.traceback
        rank_record.duration = event.duration
        if self.failure is None:
            self.failure = rank_record

    def _record_exit(self, event: ProcessExited) -> None:
        ranks = self.pid_ranks.get(event.pid)
        if not ranks:
            ranks = {r.rank for r in self.record.ranks if r.exit_state.active}
        if event.signal is not None:
            reason = f"killed by {signal.Signals(event.signal).name}"
            hint = _signal_hint(event.signal)
        else:
            reason = f"exited with code {event.exitcode} before returning"
            hint = "(os._exit() or a native library ended the process)"
        for rank in sorted(ranks):
            rank_record = self.rank(rank)
            if rank_record is None or rank_record.exit_state in (RankState.FINISHED,
                                                                 RankState.FAILED):
                continue
            rank_record.exit_state = RankState.KILLED
            rank_record.signal = event.signal
            rank_record.error = f"process {event.pid} {reason} {hint}".strip()
            rank_record.reason = reason
            rank_record.duration = time.monotonic() - (rank_record.started_at or time.monotonic())
            if self.failure is None:
                self.failure = rank_record

    def mark_unfinished_as_failed(self, status: int) -> None:
        """The supervisor exited with `status`: ranks that never reported a result failed."""
        for rank_record in self.record.ranks:
            if rank_record.exit_state.active:
                rank_record.exit_state = RankState.FAILED
                rank_record.reason = "never reported a result"
                rank_record.error = (
                    f"the rank never reported a result (the launch's supervisor exited with "
                    f"status {status})"
                )
                if self.failure is None:
                    self.failure = rank_record

    def outcome_after_exit(self, status: int) -> Outcome:
        """Every supervisor of the launch exited (one with `status`) and the events they sent
        are applied: ranks without a result failed, unless a failure is known already;
        "finished" when every rank finished, else "failed".

        A supervisor that ran ranks itself (`strategy="spmd"`, and "replicated" where
        xmp.spawn would fork one process: XLA:CPU, a one-chip TPU host) has no process left
        to watch it: killed by a signal (the out-of-memory killer's SIGKILL) or gone by
        `os._exit(3)` before its ranks said anything, its exit status is those ranks'
        `ProcessExited` ("process 1234 killed by SIGKILL", the ranks "killed").
        """
        supervisor = self.record.process_group  # the supervisor's pid (it leads the group)
        ranks = self.pid_ranks.get(supervisor, set()) if supervisor is not None else set()
        running = any(r.exit_state.active for r in self.record.ranks if r.rank in ranks)
        if status and self.failure is None and running:
            self.handle(ProcessExited(rank=None, pid=supervisor, signal=-status) if status < 0
                        else ProcessExited(rank=None, pid=supervisor, exitcode=status))
        if self.failure is None and not self.all_finished():
            self.mark_unfinished_as_failed(status)
        return Outcome.FINISHED if self.all_finished() else Outcome.FAILED

    def check_heartbeats(self, now: float) -> list[str]:
        """Mark ranks silent past `heartbeat_timeout` as timed out (ranks not started yet: past
        `STARTUP_GRACE` at least); return one warning per rank quiet past `HEARTBEAT_WARNING`
        (once each), for the caller to print. `now` is `time.monotonic()`."""
        warnings = []
        for rank_record in self.record.ranks:
            if not rank_record.exit_state.active:
                continue
            started = rank_record.exit_state == RankState.RUNNING
            silent = now - rank_record.last_seen
            limit = self.heartbeat_timeout
            if limit is not None and not started:
                limit = max(limit, STARTUP_GRACE)
            if limit is not None and silent > limit:
                _time_out(rank_record, started, silent)
                self.failure = self.failure or rank_record
            elif silent > HEARTBEAT_WARNING and rank_record.rank not in self.warned_silent:
                self.warned_silent.add(rank_record.rank)
                if started:
                    why = "has sent nothing for {:.0f}s (a long compile, or a frozen process)."
                else:
                    why = ("has not started after {:.0f}s (a slow runtime start, or a process "
                           "that hung before the function ran; `heartbeat_timeout=` or "
                           "`timeout=` stops such a launch).")
                warnings.append(f"hfxla_nb: rank {rank_record.rank} " + why.format(silent))
        return warnings

    def mark_stopped(self, state: RankState) -> None:
        """Ranks still running (or never started) end in `state`; so does a rank whose
        `Started` is read later (it was queued while the launch was being stopped)."""
        self.stopped_as = self.stopped_as or state
        for rank_record in self.record.ranks:
            if rank_record.exit_state.active:
                rank_record.exit_state = state

    def mark_killed(self, ranks: Iterable[int], reason: str, error: str) -> None:
        """Ranks of `ranks` still running were killed with no event to say so (their host
        left a cluster): `reason` and `error` say how."""
        for rank in ranks:
            rank_record = self.rank(rank)
            if rank_record is None or not rank_record.exit_state.active:
                continue
            rank_record.exit_state = RankState.KILLED
            rank_record.reason = reason
            rank_record.error = error
            if self.failure is None:
                self.failure = rank_record

    def rank(self, rank: int | None) -> BaseRankRecord | None:
        """The record of `rank`; None for no rank (the supervisor's own events) or one out of
        range."""
        if rank is None or not 0 <= rank < len(self.record.ranks):
            return None
        return self.record.ranks[rank]

    def all_finished(self) -> bool:
        """Whether every rank finished."""
        return all(rank.exit_state == RankState.FINISHED for rank in self.record.ranks)


def _time_out(rank_record: BaseRankRecord, started: bool, silent: float) -> None:
    """A rank silent past `heartbeat_timeout` timed out: say why in its record."""
    rank_record.exit_state = RankState.TIMEOUT
    if started:
        rank_record.reason = "froze"
        rank_record.error = f"no heartbeat for {silent:.0f}s: the process is frozen"
    else:
        rank_record.reason = "never started"
        rank_record.error = (
            f"not started after {silent:.0f}s: its process hung before the function ran (in "
            "the runtime's start, or on a lock held when the kernel forked)")


def _signal_hint(number: int) -> str:
    if number == signal.SIGKILL:
        return (
            "- with no traceback this is most often the out-of-memory killer: check host "
            "memory (free -h, dmesg), and lower the batch size or model size"
        )
    if number == signal.SIGSEGV:
        return "- a crash in native code; the traceback printed above shows where"
    if number == signal.SIGABRT:
        return "- a native library aborted; its message is printed above"
    return ""
