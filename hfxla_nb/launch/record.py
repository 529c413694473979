"""What a launch did, rank by rank: the records, and the keeper that turns events into them.

The records' plain data and their states are `hfxla_nb.states`' (the panels, a layer below,
draw the same types); here they gain each rank's XLA figures and the launch's table.

`RecordKeeper` is the events-to-record state machine of the notebook side of a launch; it
forks, reads and draws nothing (`supervision.py` does), so tests drive it with events alone.
"""

from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from .._units import duration
from .._words import plural
from ..events import (
    Compiled,
    Event,
    Failed,
    Finished,
    Heartbeat,
    MetricsSnapshot,
    ProcessesStopped,
    ProcessExited,
    Progress,
    Started,
)
from ..observe.hbm import explain_hbm_exhaustion
from ..observe.user_frames import is_library
from ..states import BaseLaunchRecord, BaseRankRecord, Outcome, RankState
from .rank_metrics import MetricsCollector, RankMetrics, dataframe

HEARTBEAT_WARNING = 60.0  # seconds of silence before a rank is said to be quiet
# A rank that has not started may be waiting on a slow runtime start (a TPU's takes seconds):
# `heartbeat_timeout` stops it only after at least this long.
STARTUP_GRACE = 60.0


@dataclass
class RankRecord(BaseRankRecord):
    """How one rank of a launch went (`BaseRankRecord`'s attributes, and its XLA figures).

    Attributes:
        exit_state: a `RankState`: "pending" (not started; at the end: never started),
            "running" (started and not ended: while the launch runs), "finished", "failed"
            (raised, or never reported a result), "killed" (its process died by a signal or
            exited before returning), "timeout" (stopped by `timeout=` or silent past
            `heartbeat_timeout=`), "interrupted" (the stop button) or "stopped" (stopped
            because another rank failed).
        metrics: what XLA did for the rank (compiles, executions, transfers, their times,
            step times, alerts) as of the launch's last snapshot; None when it sent none (a
            function that never used XLA).
        signal: the number of the signal that killed its process; None when none did.

    The other attributes (`rank`, `pid`, `result`, `error`, `reason`, `traceback`,
    `duration`, `last_step`, `bars`) are `BaseRankRecord`'s.
    """

    metrics: RankMetrics | None = None
    signal: int | None = None


@dataclass
class LaunchRecord(BaseLaunchRecord):
    """Everything about one `notebook_launcher` call (see `last_launch()`).

    Attributes:
        strategy: "replicated", "spmd" or "debug".
        world: number of ranks.
        ranks: one `RankRecord` per rank, in rank order.
        duration: wall-clock seconds of the whole launch.
        outcome: an `Outcome`: "running" until the launch ends, then "finished", "failed",
            "timeout" or "interrupted".
        process_group: the process group of every process the launch started (all gone when
            the launcher returns; `leftover_processes()` lists any that are not).
        native_log: every XLA C++ log line the launch's processes wrote, verbatim (the cell
            shows each repeated one once, with its count).
        attempt: which attempt this launch was (1, then 2... after `max_restarts=`
            relaunched the function following a failure; `BaseLaunchRecord`'s).
        max_attempts: how many attempts the call allowed (`max_restarts + 1`).
        previous_attempts: the records of the earlier attempts of the same call, in order
            (`attempts` gives them with this one).
        stopped_processes: what the launch left running outside its process group and had
            to stop (a server, a process in a session of its own, a daemon), each as
            "sleep 600 (pid 1234)" (launch/processes.py).
        hosts: a `cluster=` launch's hosts, in host order: each a dict of its address, Ray
            node, actor and supervisor pids and global ranks; empty on one host.
    """

    ranks: list[RankRecord]  # the same field: ranks with their metrics
    native_log: list[str] = field(default_factory=list)
    previous_attempts: list[LaunchRecord] = field(default_factory=list, repr=False)
    stopped_processes: list[str] = field(default_factory=list)
    hosts: list[dict] = field(default_factory=list)

    @property
    def attempts(self) -> list[LaunchRecord]:
        """Every attempt of this `notebook_launcher` call so far, this one last."""
        return [*self.previous_attempts, self]

    def to_dataframe(self) -> Any:
        """One row per rank: exit state, duration, last step and every figure of its
        `metrics` (`pandas.DataFrame`; pandas is imported only here)."""
        return dataframe([_rank_row(rank) for rank in self.ranks])

    def __str__(self) -> str:
        """`spmd launch, 2 ranks: finished in 3.2 s`, then one line per rank (durations in the
        panels' one format, `_units.duration`)."""
        attempt = f" ({self.attempt_text})" if self.attempt_text else ""
        lines = [
            f"{self.strategy} launch, {plural(self.world, 'rank')}: {self.outcome} in "
            f"{duration(self.duration)}{attempt}"
        ]
        for rank in self.ranks:
            detail = f" ({rank.error})" if rank.error else ""
            lines.append(
                f"  rank {rank.rank}: {rank.exit_state}, {duration(rank.duration)}{detail}"
            )
        return "\n".join(lines)

    def leftover_processes(self) -> list[int]:
        """The pids of the launch's processes still running now (from /proc; zombies do not
        count): `[]` once the launcher has returned, whatever the outcome, and for a launch
        refused before anything was forked (it has no `process_group`)."""
        from .processes import group_processes

        return [] if self.process_group is None else group_processes(self.process_group)


def _launch_error_class() -> type:
    """`LaunchError`, made on first use: it is also torch's `ChildFailedError`, and importing
    torch costs seconds in a kernel that has not imported it yet (`import hfxla_nb` and the
    launcher's own import stay free of torch; a kernel that imported torch pays ~10 ms)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    class LaunchError(RuntimeError, ChildFailedError):
        """A launched function failed. `record` holds every rank's state; the message carries
        the failing rank, its exception and its remote traceback.

        It is also torch's `ChildFailedError` (what `accelerate.notebook_launcher` raises
        through torchelastic), so `except ChildFailedError` and `pytest.raises(
        ChildFailedError, match=...)` written for accelerate catch it: `failures` maps each
        failed rank to a `ProcessFailure` whose `message` is that rank's error.
        """

        def __init__(self, message: str, record: LaunchRecord | None = None) -> None:
            # Not ChildFailedError.__init__: it would write its own banner as the message.
            RuntimeError.__init__(self, message)
            self.record = record
            self.name = "hfxla_nb.notebook_launcher"
            self.failures = _process_failures(record, message)

    LaunchError.__module__ = __name__
    LaunchError.__qualname__ = "LaunchError"
    return LaunchError


def _process_failures(record: LaunchRecord | None, message: str) -> dict[int, Any]:
    """torchelastic's view of a failed launch: failed rank -> `ProcessFailure` (never empty:
    a launch that timed out with no failed rank is named by its rank 0)."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    failed = {RankState.FAILED, RankState.KILLED, RankState.TIMEOUT}
    ranks = [] if record is None else [r for r in record.ranks if r.exit_state in failed]
    failures = {}
    for rank in ranks or [None]:
        # torchelastic's convention: a process killed by a signal exited with -signal.
        exitcode = -rank.signal if rank is not None and rank.signal is not None else 1
        failure = ProcessFailure(local_rank=0 if rank is None else rank.rank,
                                 pid=-1 if rank is None or rank.pid is None else rank.pid,
                                 exitcode=exitcode, error_file="<N/A>")
        failure.message = (rank.error if rank is not None else None) or message.splitlines()[0]
        failures[failure.local_rank] = failure
    return failures


def __getattr__(name: str) -> Any:
    if name == "LaunchError":
        globals()["LaunchError"] = error_class = _launch_error_class()
        return error_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class RecordKeeper:
    """Applies a launch's events to its `LaunchRecord` and knows which rank failed first."""

    def __init__(self, record: LaunchRecord, timeout: float | None = None,
                 heartbeat_timeout: float | None = None) -> None:
        self.record = record
        self.timeout = timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.failure: RankRecord | None = None
        self.pid_ranks: dict[int, set[int]] = {}
        self._stopped: dict[int, str] = {}  # stopped_processes by pid (see note_stopped)
        self.warned_silent: set[int] = set()
        self.metrics = MetricsCollector()
        self.stopped_as: RankState | None = None  # how ranks still running ended, once stopped
        began = time.monotonic()
        for rank_record in record.ranks:  # a rank that never starts is silent from the start
            rank_record.last_seen = rank_record.last_seen or began

    def handle(self, event: Event) -> None:
        """Update the record for one event (`Log` events only mark the rank as alive)."""
        now = time.monotonic()
        rank_record = self.rank(event.rank)
        if rank_record is not None:
            rank_record.last_seen = now
        if isinstance(event, Started) and rank_record is not None:
            rank_record.pid = event.pid
            # A Started read after the stop (queued while the launch was being stopped) is
            # that of a rank that was stopped too.
            rank_record.exit_state = self.stopped_as or RankState.RUNNING
            rank_record.started_at = now
            self.pid_ranks.setdefault(event.pid, set()).add(event.rank)
        elif isinstance(event, Progress) and rank_record is not None:
            if event.label == "train" or rank_record.last_step is None:
                rank_record.last_step = event.step
            rank_record.bars[event.label] = (event.step, event.total)
        elif isinstance(event, Finished) and rank_record is not None:
            rank_record.exit_state = RankState.FINISHED
            rank_record.result = event.result
            rank_record.duration = event.duration
        elif isinstance(event, Failed):
            self._record_failure(rank_record, event)
        elif isinstance(event, ProcessExited):
            self._record_exit(event)
        elif isinstance(event, ProcessesStopped):
            self.note_stopped(event.processes)
        elif isinstance(event, Heartbeat):
            pass
        if isinstance(event, (Progress, MetricsSnapshot, Compiled)):
            self.metrics.handle(event)

    def note_stopped(self, processes: dict[int, str]) -> None:
        """Name processes the launch left running and had to stop (pid -> `describe`'s words:
        "sleep 600 (pid 1234)"). The supervisor and the notebook may both name one (each
        stops what it finds): it is named once, by its command line where one side read it
        before the process ended (an ended process shows only its name: "[sleep] (pid 1234)")."""
        for pid, words in processes.items():
            if pid not in self._stopped or self._stopped[pid].startswith("["):
                self._stopped[pid] = words
        self.record.stopped_processes[:] = [self._stopped[pid] for pid in sorted(self._stopped)]

    def finish(self) -> None:
        """The launch is over: give every rank its final figures."""
        for rank_record in self.record.ranks:
            rank_record.metrics = self.metrics.rank_metrics(rank_record.rank)

    def _record_failure(self, rank_record: RankRecord | None, event: Failed) -> None:
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
            name = signal.Signals(event.signal).name
            reason = f"killed by {name}"
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
        (once each), for the caller to print."""
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
                rank_record.exit_state = RankState.TIMEOUT
                if started:
                    rank_record.reason = "froze"
                    rank_record.error = f"no heartbeat for {silent:.0f}s: the process is frozen"
                else:
                    rank_record.reason = "never started"
                    rank_record.error = (
                        f"not started after {silent:.0f}s: its process hung before the "
                        "function ran (in the runtime's start, or on a lock held when the "
                        "kernel forked)")
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

    def rank(self, rank: int | None) -> RankRecord | None:
        """The record of `rank`; None for no rank (the supervisor's own events) or one out of
        range."""
        if rank is None or not 0 <= rank < len(self.record.ranks):
            return None
        return self.record.ranks[rank]

    def all_finished(self) -> bool:
        """Whether every rank finished."""
        return all(rank.exit_state == RankState.FINISHED for rank in self.record.ranks)

    # -- the error the cell raises -------------------------------------------------------------

    def failure_message(self) -> str:
        """What the cell's `LaunchError` says: the first failure, its traceback, and the ranks
        stopped because of it (or, after `timeout=`, the ranks that were still running)."""
        record = self.record
        if record.outcome == Outcome.TIMEOUT:
            stalled = [
                f"rank {r.rank} "
                + (f"at step {r.last_step}" if r.last_step is not None else "before its first step")
                for r in record.ranks
                if r.exit_state == RankState.TIMEOUT
            ]
            return (
                f"the launch timed out after {self.timeout:g}s and was stopped. Still running: "
                f"{', '.join(stalled) or 'none'}. Every worker process was terminated."
            )
        failed = self.failure or next((r for r in record.ranks if r.error), None)
        if failed is None:
            return f"the launch ended without a result ({record.outcome})."
        others = [r.rank for r in record.ranks if r.exit_state == RankState.STOPPED]
        stopped = f" Ranks {others} were stopped." if others else ""
        error = failed.error or ""
        message = f"rank {failed.rank} failed: {error}{'' if error.endswith('.') else '.'}"
        message += stopped
        if failed.traceback:
            # Whole, as Python prints it: it ends with the exception line.
            message += f"\n\nRemote traceback (rank {failed.rank}):\n{failed.traceback.rstrip()}"
        # XLA's allocator text is a wall of figures: said first in one line with its fixes
        # (the whole text stays below, and on the record).
        explanation = explain_hbm_exhaustion(f"{error}\n{failed.traceback or ''}",
                                             where=_user_line(failed.traceback or ""))
        return message if explanation is None else f"{explanation}\n\n{message}"


def _user_line(traceback: str) -> str | None:
    """The innermost frame of a remote traceback that is the user's code ("file:line", or
    "Cell In[5], line 12" for a notebook cell), or None (`observe.user_frames.is_library`
    decides what is not theirs)."""
    frames = re.findall(r'^\s*(?:File "([^"]+)", line (\d+)|(Cell In\[\d+\], line \d+))',
                        traceback, flags=re.MULTILINE)
    for path, line, cell in reversed(frames):
        if cell:
            return cell
        if not is_library(path):
            return f"{path}:{line}"
    return None


def _rank_row(rank: RankRecord) -> dict[str, Any]:
    """A rank's record as one row of plain values (its metrics flattened in)."""
    # The state as its plain word: the table reads and compares like any column of text.
    row: dict[str, Any] = {"rank": rank.rank, "exit_state": str(rank.exit_state),
                           "duration": rank.duration, "last_step": rank.last_step,
                           "error": rank.error}
    if rank.metrics is not None:
        figures = rank.metrics.to_dict()
        figures["alerts"] = [alert["code"] for alert in figures["alerts"]]
        row.update(figures)
    return row


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
