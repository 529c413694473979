"""The notebook side of a launch: fork the supervisor, relay its output, watch, stop, record.

Runs on the cell's main thread (ipykernel drops display updates from other threads). What the
events mean for the record is `observe.reader.LaunchReader`'s job; this module moves bytes and
signals, and keeps what the launch did.

- The records: `LaunchRecord` and `RankRecord`, what a launch did rank by rank. Their plain
  data and states are `hfxla_nb.states`' (the panels, a layer below, draw the same types);
  here they gain each rank's XLA figures and the launch's table.
- What a failed launch says (`failure_message`): the first failure and its traceback, the
  ranks stopped because of it (or, after `timeout=`, the ranks still running), XLA's
  out-of-memory text explained first. The cell's `LaunchError` carries it.
- What the two watchers of a launch share (`LaunchWatch`): `Supervision` on one host, and
  `launch.pods`' watch on the hosts of a Ray cluster. Which ranks' lines reach the cell, how
  often the panel is redrawn and how a launch ends are decided once for both.
- `Supervision`: the watch loop on one host.
"""

from __future__ import annotations

import os
import re
import select
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._words import duration, plural, ranks_were
from ..events import Channel, Event, Generated, LibraryWarning, Log, OutputPipes
from ..observe.alerts import explain_hbm_exhaustion
from ..observe.reader import LaunchReader, RankMetrics, dataframe
from ..observe.tracing import is_library
from ..runtime import compile_cache
from ..states import BaseLaunchRecord, BaseRankRecord, Outcome, RankState
from . import stacks
from .output import NativeRelay, print_folded
from .processes import stop_group

if TYPE_CHECKING:
    from ..ui import LaunchDisplay
    from .worker import JobPipes


# -- the records: what a launch did, rank by rank --

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
        signal: the number of the signal that killed its process; None when none did
            (`BaseRankRecord`'s).

    The other attributes (`rank`, `pid`, `result`, `error`, `reason`, `traceback`,
    `duration`, `last_step`, `bars`) are `BaseRankRecord`'s.
    """

    metrics: RankMetrics | None = None


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
        warnings: every warning located in a library's code (site-packages, the standard
            library) that the launch's ranks issued, in order, each a `LibraryWarning` event
            (the cell shows one line per kind, with its count).
        streamed: the `Generated` events of the ranks' `hx.generate` calls, in order: each
            row's new text every `check_every` tokens (the cell prints it as it comes).
        attempt: which attempt this launch was (1, then 2... after `max_restarts=`
            relaunched the function following a failure; `BaseLaunchRecord`'s).
        max_attempts: how many attempts the call allowed (`max_restarts + 1`).
        previous_attempts: the records of the earlier attempts of the same call, in order
            (`attempts` gives them with this one).
        stopped_processes: what the launch left running outside its process group and had
            to stop (a server, a process in a session of its own, a daemon), each as
            "sleep 600 (pid 1234)" (launch/processes.py; `BaseLaunchRecord`'s).
        hosts: a `cluster=` launch's hosts, in host order: each a dict of its address, Ray
            node, actor and supervisor pids and global ranks; empty on one host.
    """

    ranks: list[RankRecord]  # the same field: ranks with their metrics
    native_log: list[str] = field(default_factory=list)
    warnings: list[LibraryWarning] = field(default_factory=list)
    streamed: list[Generated] = field(default_factory=list)
    previous_attempts: list[LaunchRecord] = field(default_factory=list, repr=False)
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
        panels' one format, `_words.duration`)."""
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


# -- what the message says --

def failure_message(reader: LaunchReader) -> str:
    """The first failure, its traceback, and the ranks stopped because of it (or, after
    `timeout=`, the ranks that were still running).

    Args:
        reader: the reader of the launch that ended.
    """
    record = reader.record
    if record.outcome == Outcome.TIMEOUT:
        stalled = [
            f"rank {r.rank} "
            + (f"at step {r.last_step}" if r.last_step is not None else "before its first step")
            for r in record.ranks
            if r.exit_state == RankState.TIMEOUT
        ]
        return (
            f"the launch timed out after {reader.timeout:g}s and was stopped. Still running: "
            f"{', '.join(stalled) or 'none'}. Every worker process was terminated."
        ) + where_they_were([r for r in record.ranks if r.exit_state == RankState.TIMEOUT])
    failed = reader.failure or next((r for r in record.ranks if r.error), None)
    if failed is None:
        return f"the launch ended without a result ({record.outcome})."
    others = [r.rank for r in record.ranks if r.exit_state == RankState.STOPPED]
    stopped = f" {ranks_were(others, 'stopped')}" if others else ""
    error = failed.error or ""
    message = f"rank {failed.rank} failed: {error}{'' if error.endswith('.') else '.'}"
    message += stopped
    if failed.traceback:
        # Whole, as Python prints it: it ends with the exception line.
        message += f"\n\nRemote traceback (rank {failed.rank}):\n{failed.traceback.rstrip()}"
    else:  # silent past heartbeat_timeout: where it was
        message += where_they_were([failed])
    # XLA's allocator text is a wall of figures: said first in one line with its fixes
    # (the whole text stays below, and on the record).
    explanation = explain_hbm_exhaustion(f"{error}\n{failed.traceback or ''}",
                                         where=_user_line(failed.traceback or ""))
    return message if explanation is None else f"{explanation}\n\n{message}"


def where_they_were(ranks: list[BaseRankRecord]) -> str:
    """Each rank's stacks as read before it was stopped ("" for ranks with none), under a
    line that names it; ranks of one process share theirs, said once."""
    said: dict[str, int] = {}
    text = ""
    for rank in ranks:
        if not rank.stack:
            continue
        if rank.stack in said:
            text += f"\n\nRank {rank.rank} runs in the process of rank {said[rank.stack]}."
            continue
        said[rank.stack] = rank.rank
        text += (f"\n\nWhere rank {rank.rank} was when it was stopped (its threads that run "
                 f"your code, most recent call first):\n{rank.stack}")
    return text


def _user_line(traceback: str) -> str | None:
    """The innermost frame of a remote traceback that is the user's code ("file:line", or
    "Cell In[5], line 12" for a notebook cell), or None (`observe.tracing.is_library`
    decides what is not theirs)."""
    frames = re.findall(r'^\s*(?:File "([^"]+)", line (\d+)|(Cell In\[\d+\], line \d+))',
                        traceback, flags=re.MULTILINE)
    for path, line, cell in reversed(frames):
        if cell:
            return cell
        if not is_library(path):
            return f"{path}:{line}"
    return None


# -- what the watchers of one host and of a cluster share --

REFRESH_INTERVAL = 0.25  # seconds between two redraws of the panel while a launch runs
# Seconds a launch's processes have to exit once every rank finished. Past it the results are
# in, and the launch ends as finished with its processes stopped: a supervisor frozen after
# its ranks' last events, or stuck in its runtime's shutdown, must not hold the cell forever.
# (More than the supervisor's own stop of the function's leftover processes takes.)
EXIT_GRACE = 30.0
# How the ranks still running end, for each way a launch ends ("finished": none is left, but
# processes that outlived the supervisor are stopped all the same).
STOPPED_AS = {
    Outcome.FINISHED: RankState.STOPPED,
    Outcome.FAILED: RankState.STOPPED,
    Outcome.TIMEOUT: RankState.TIMEOUT,
    Outcome.INTERRUPTED: RankState.INTERRUPTED,
}


class LaunchWatch:
    """What a watcher of a launch holds (its record, the one reader of its events, the panel,
    which ranks' lines show, the `timeout`) and how each turn of its watch loop ends
    (`_turn_end`).

    Args:
        reader: the one reader of the launch's events (it holds the record; the panel draws
            it too).
        display: the launch's panel.
        shown_ranks: which ranks' lines reach the cell ("all", "none" or a set of ranks).
        timeout: seconds after which the launch is stopped as "timeout"; None: none.
    """

    def __init__(self, reader: LaunchReader, display: LaunchDisplay,
                 shown_ranks: set[int] | str, timeout: float | None) -> None:
        self.record: LaunchRecord = reader.record
        self.reader = reader
        self.display = display
        self.shown_ranks = shown_ranks
        self.timeout = timeout
        self._last_refresh = 0.0
        self._finished_at: float | None = None  # when every rank had finished

    def _say_library_warnings(self) -> None:
        """One muted line per kind of library warning the launch kept (`print_folded`),
        counting the ranks whose lines reach the cell: on one host and on a cluster alike."""
        print_folded(self.record.warnings,
                     lambda rank: shows(self.shown_ranks, [] if rank is None else [rank]))

    def _take_generated(self, event: Generated) -> None:
        """Keep a generation's new text on the record and print it in the cell as it comes
        (`Generated.shown`), where the panel does not draw it under its bars."""
        self.record.streamed.append(event)
        if self.display.draws_generations or not shows(
                self.shown_ranks, [] if event.rank is None else [event.rank]):
            return
        text = event.shown()
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()

    def _turn_end(self, began: float, exited: Callable[[], int | None]) -> Outcome | None:
        """After a turn of the watch loop applied what arrived: redraw the panel (at most every
        `REFRESH_INTERVAL`), then say how the launch ended, in this order, or None while it
        runs on:

        - a failure is known (a `Failed` event, a process killed or exited early, a rank
          silent past `heartbeat_timeout`): "failed";
        - `exited()` (asked only then) gives a status: every supervisor of the launch exited
          and the events they sent are applied: `LaunchReader.outcome_after_exit`;
        - every rank finished `EXIT_GRACE` seconds ago and the processes are still there:
          "finished" (they are stopped, and the record's notes say so);
        - `timeout` passed since `began`: "timeout".

        While it runs on, ranks quiet past `HEARTBEAT_WARNING` are named once on stderr.
        """
        now = time.monotonic()
        if now - self._last_refresh >= REFRESH_INTERVAL:
            self.display.refresh()
            self._last_refresh = now
        if self.reader.failure is not None:
            return Outcome.FAILED
        status = exited()
        if status is not None:
            return self.reader.outcome_after_exit(status)
        if self._exit_overdue(now):
            return Outcome.FINISHED
        if self.timeout is not None and now - began > self.timeout:
            return Outcome.TIMEOUT
        warned = set(self.reader.warned_silent)
        for warning in self.reader.check_heartbeats(now):
            print(warning, file=sys.stderr)
        quiet = [r for r in self.record.ranks
                 if r.rank in self.reader.warned_silent - warned and r.exit_state.active]
        if quiet:
            self.read_stacks(quiet)
        for rank in quiet:
            place = stacks.innermost_user_frame(rank.stack)
            if place is not None:
                print(f"hfxla_nb: rank {rank.rank} is at {place} (hx.last_launch().ranks"
                      f"[{rank.rank}].stack has its threads).", file=sys.stderr)
        return None

    def read_stacks(self, ranks: list[BaseRankRecord]) -> None:
        """Put each of `ranks`' stacks on its record, where this watcher can read them (one
        host's processes; a cluster's are on their hosts: none)."""

    def _exit_overdue(self, now: float) -> bool:
        """Whether every rank finished `EXIT_GRACE` seconds ago or more and the launch's
        processes are still there; said in the record's notes when so."""
        if not self.reader.all_finished():
            return False
        if self._finished_at is None:
            self._finished_at = now
        if now - self._finished_at < EXIT_GRACE:
            return False
        self.record.notes.append(
            f"every rank finished, but the launch's processes had not exited {EXIT_GRACE:.0f}s "
            "later (frozen, or stuck in the runtime's shutdown): they were stopped")
        return True


def shows(shown_ranks: set[int] | str, ranks: list[int]) -> bool:
    """Whether output of these ranks reaches the cell (`[]`: the launcher's own, shown unless
    `shown_ranks` is "none")."""
    if shown_ranks in ("none", "all"):
        return shown_ranks == "all"
    return not ranks or any(rank in shown_ranks for rank in ranks)


#: Words of a rank's error that name an XLA collective (or what waits on one).
COLLECTIVE_WORDS = ("all_reduce", "all-reduce", "allreduce", "all_gather", "reduce_scatter",
                    "all_to_all", "collective", "optimizer_step", "rendezvous", "barrier",
                    "mesh_reduce")


def involves_collectives(record: BaseLaunchRecord) -> bool:
    """Whether the launch ended in a way XLA collectives explain: it hung (`timeout=`, the
    stop button), more than one rank failed, or a failed rank's error names a collective. A
    launch that finished, or failed in one rank on its own, does not."""
    if record.outcome in (Outcome.TIMEOUT, Outcome.INTERRUPTED):
        return True
    if record.outcome != Outcome.FAILED:
        return False
    failed = [rank for rank in record.ranks
              if rank.exit_state in (RankState.FAILED, RankState.KILLED, RankState.TIMEOUT)]
    if len(failed) > 1:
        return True
    words = " ".join(f"{rank.error or ''} {rank.traceback or ''}" for rank in failed).lower()
    return any(word in words for word in COLLECTIVE_WORDS)


def end_launch(reader: LaunchReader, display: LaunchDisplay, outcome: Outcome, began: float,
               *, interrupted_line: str, stop: Callable[[], None] | None = None,
               drain: Callable[[], None] | None = None) -> None:
    """The one place a launch ends, however it ended, on one host or several.

    In this order: the ranks still running end in `STOPPED_AS[outcome]`; `stop()` stops what
    is left of the launch; the record's `outcome` is set; `drain()` applies the events sent
    while it was stopped and closes the relays; the record gets its duration (since `began`)
    and every rank's figures; the display draws the final panel (a drawing bug is printed,
    never raised: it must not hide the result); after the stop button, `interrupted_line` is
    printed on stderr.

    Args:
        reader: the launch's `LaunchReader` (its record is the one ended).
        display: the launch's panel.
        outcome: how the launch ended (not `Outcome.RUNNING`).
        began: the `time.monotonic()` at which the launch began.
        interrupted_line: what the user reads after the stop button (which processes were
            stopped, and that the kernel is ready).
        stop: stops every process of the launch; None where the caller stops them after this
            returns (a cluster's hosts).
        drain: applies the last events and closes the relays; None where there is none.
    """
    reader.mark_stopped(STOPPED_AS[outcome])
    if stop is not None:
        stop()
    record = reader.record
    record.outcome = outcome
    if drain is not None:
        drain()
    record.duration = time.monotonic() - began
    if record.collective_notes and involves_collectives(record):
        record.notes += record.collective_notes  # under the final panel's bars
    for rank in record.ranks:
        rank.metrics = reader.rank_metrics(rank.rank)
    reader.end()
    try:
        display.close(record)
    except Exception as error:  # noqa: BLE001 - a drawing bug must not hide the result
        print(f"hfxla_nb: could not draw the final panel: {error}", file=sys.stderr)
    if outcome == Outcome.INTERRUPTED:
        print(interrupted_line, file=sys.stderr)


# -- the watch loop on one host --

POLL_INTERVAL = 0.1


class Supervision(LaunchWatch):
    """One launch, from the kernel: `run()` returns when every process of it is gone."""

    def __init__(self, reader: LaunchReader, display: LaunchDisplay,
                 shown_ranks: set[int] | str, timeout: float | None,
                 poll_interval: float = POLL_INTERVAL,
                 line_prefix: Callable[[int], str] | None = None,
                 relay: NativeRelay | None = None) -> None:
        """`reader`: the one reader of the launch's events (it holds the record);
        `poll_interval`: the longest wait between two looks at the workers (accelerate's
        `monitor_interval`); `line_prefix`: rank -> the prefix of its printed lines
        (`log_line_prefix_template`), instead of `[rank N] ` when there are several ranks;
        `relay`: the native output of processes that outlive one launch (a warm session's),
        relayed for this one; None: a new one."""
        super().__init__(reader, display, shown_ranks, timeout)
        record = reader.record
        self.poll_interval = poll_interval
        self.line_prefix = line_prefix
        self.pid: int | None = None  # the supervisor, until reaped
        self.group: int | None = None  # its process group: every process of the launch
        self.exit_fd: int | None = None  # readable once the supervisor has exited
        said: dict[str, bool] = {}  # native messages already said once in this launch
        follow = dict(
            ranks_of=lambda pid: sorted(self.reader.pid_ranks.get(pid, ())),
            shown=self._shown,
            tagged=record.world > 1,
            rewrite=lambda line: compile_cache.native_line(line, said),
            kept=record.native_log,
        )
        if relay is None:
            relay = NativeRelay(**follow)
        else:
            relay.follow(**follow)
        self.native = relay

    def run(self, function: Callable[..., Any], args: tuple[Any, ...], pass_index: bool,
            env: dict[str, str | None]) -> None:
        """Fork the launch's supervisor, watch it until the launch ends, stop what is left.

        The launch ends in one of three ways; for each, the record's `outcome` is set in one
        place, `_end` (`end_launch`), and the ranks still running end in the state
        `STOPPED_AS` gives it:

        - `_watch` returns it: "finished" (the supervisor exited and every rank finished),
          "failed" (a rank failed, was killed or went silent, or the supervisor exited
          without every rank's result; ranks still running end "stopped") or "timeout"
          (`timeout` passed; ranks still running end "timeout").
        - `KeyboardInterrupt` (the kernel's stop button): "interrupted" (ranks still running
          end "interrupted"); a line tells the user the kernel is ready, and the interrupt
          is raised again.
        - any other exception (the fork failed, a display or relay bug): "failed" (ranks still
          running end "stopped"); the exception is raised again.

        Whichever it is, every process of the launch is stopped (SIGTERM to its process
        group, then SIGKILL) and reaped, the events still queued are applied, and then the
        record gets its duration and every rank's XLA figures and the display draws the final
        panel from it. `run` returns (or raises) when no process of the launch is left.

        Args:
            function: the user's function, run in the forked workers (never pickled).
            args: its arguments.
            pass_index: whether it is called as `function(index, *args)`.
            env: the variables the workers set before torch_xla starts (None: unset it).

        Raises:
            KeyboardInterrupt: the kernel was interrupted (after the launch was stopped).
        """
        channel = Channel()
        start = time.monotonic()
        outcome = Outcome.FAILED  # what an exception leaves
        try:
            self.fork(channel, env, function, args, pass_index)
            outcome = self._watch(channel, start)
        except KeyboardInterrupt:
            outcome = Outcome.INTERRUPTED
            raise
        finally:
            self._end(outcome, channel, start)

    def fork(self, channel: Channel, env: dict[str, str | None],
              function: Callable[..., Any] | None, args: tuple[Any, ...], pass_index: bool,
              jobs: JobPipes | None = None, closed: tuple[int, ...] = ()) -> None:
        """Fork the launch's supervisor (`worker.supervise`), relay its output; `jobs`: its
        ranks serve a warm session's jobs instead of running `function`; `closed`: file
        descriptors the supervisor must not hold (other sessions' job pipes)."""
        from .worker import supervise

        (out_read, out_write), (err_read, err_write) = os.pipe(), os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the supervisor; supervise() ends with os._exit
            os.close(out_read)
            os.close(err_read)
            for fd in closed:
                os.close(fd)
            supervise(self.record.strategy, channel, (out_write, err_write), env,
                      self.record.world, function, args, pass_index, jobs)
        self.pid = self.group = self.record.process_group = pid
        self.exit_fd = _exit_descriptor(pid)
        os.close(out_write)
        os.close(err_write)
        self.native.add(out_read, "stdout")
        self.native.add(err_read, "stderr")

    def failure_message(self) -> str:
        """What the cell's `LaunchError` says (this module's `failure_message`)."""
        return failure_message(self.reader)

    def _watch(self, channel: Channel, start: float) -> Outcome:
        """Relay events and output until the launch ends; return how it ended.

        Each turn waits up to `poll_interval` for an event, native output or the supervisor's
        exit, applies the events to the record and prints the logs, relays the output, then
        ends the turn (`LaunchWatch._turn_end`, as on a cluster): it redraws the panel at most
        every `REFRESH_INTERVAL` and looks for an end, in this order:

        - a failure is known (a `Failed` event, a `ProcessExited` by a signal or an exit code,
          a rank silent past `heartbeat_timeout`): "failed";
        - the supervisor exited: the events its workers sent before are applied; if no
          failure is known, ranks without a result become "failed" ("never reported a
          result"); "finished" when every rank finished, else "failed";
        - `timeout` passed: "timeout".

        Otherwise ranks quiet past `HEARTBEAT_WARNING` are named once on stderr.

        The state changes made here are the ranks' only (through `LaunchReader`): "pending"
        -> "running" on `Started`; -> "finished", "failed" or "killed" on `Finished`,
        `Failed`, `ProcessExited`; "running" or "pending" -> "timeout" past
        `heartbeat_timeout`; -> "failed" when the supervisor exited without their result.
        It neither sets the launch's outcome nor stops a process: `run` does, from the value
        returned. A `KeyboardInterrupt` in the wait goes up to `run` as it is.
        """
        while True:
            exit_fds = [] if self.exit_fd is None else [self.exit_fd]
            ready, _, _ = select.select([channel, *self.native.fds(), *exit_fds], [], [],
                                        self.poll_interval)
            for event in channel.receive():  # first: a process's Started names its output
                self._handle(event)
            for fd in ready:
                if fd is not channel and fd != self.exit_fd:
                    self.native.read(fd)
            outcome = self._turn_end(start, lambda: self._exited_and_drained(channel))
            if outcome is not None:
                return outcome

    def _exited_and_drained(self, channel: Channel) -> int | None:
        """The supervisor's exit status once it exited, with the events its workers sent
        before applied (they are in the channel now: a datagram is queued at the receiver
        when it is sent); None while it runs."""
        exited = self._supervisor_exited()
        if exited is not None:
            for event in channel.receive():
                self._handle(event)
        return exited

    def _handle(self, event: Event) -> None:
        self.reader.handle(event)
        if isinstance(event, Log):
            self._print_log(event)
        elif isinstance(event, LibraryWarning):
            self.record.warnings.append(event)  # said, folded, at the end of the launch
        elif isinstance(event, Generated):
            self._take_generated(event)
        elif isinstance(event, OutputPipes):
            self.native.add_process(event)
        else:
            self.display.handle(event)

    # -- output ------------------------------------------------------------------------------

    def _shown(self, ranks: list[int]) -> bool:
        """Whether output of these ranks reaches the cell ([]: the launcher's own)."""
        return shows(self.shown_ranks, ranks)

    def _print_log(self, event: Log) -> None:
        if not self._shown([] if event.rank is None else [event.rank]):
            return
        stream = sys.stderr if event.stream == "stderr" else sys.stdout
        text = event.text
        prefix = ""
        if event.rank is not None and self.line_prefix is not None:
            prefix = self.line_prefix(event.rank)
        elif self.record.world > 1 and event.rank is not None:
            prefix = f"[rank {event.rank}] "
        if prefix:
            text = "".join(prefix + line for line in text.splitlines(keepends=True))
        stream.write(text)
        stream.flush()

    # -- stopping ----------------------------------------------------------------------------

    def _supervisor_exited(self) -> int | None:
        if self.pid is None:
            return None
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return 0
        if pid == 0:
            return None
        self.pid = None
        return os.waitstatus_to_exitcode(status)

    def _stop(self) -> None:
        """Stop every process of the launch (SIGTERM to its group, then SIGKILL) and reap the
        supervisor."""
        if self.group is None:
            return
        # Also what left the group (a new session, a daemon): named on the record.
        self.reader.note_stopped(stop_group(self.group, reap=self._supervisor_exited))
        if self.pid is not None:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = None

    def read_stacks(self, ranks: list[BaseRankRecord]) -> None:
        """Put each of `ranks`' stacks on its record (`launch.stacks`): the threads of its
        process that run the user's code, cells named as in a traceback."""
        from .worker import cell_numbers

        cells, dumps = cell_numbers(), {}
        for rank in ranks:
            fd = self.native.stack_files.get(rank.pid)
            if fd is None:
                continue
            if rank.pid not in dumps:
                dumps[rank.pid] = stacks.dump(rank.pid, fd)
            if dumps[rank.pid]:
                rank.stack = stacks.user_threads(dumps[rank.pid], cells)

    def _end(self, outcome: Outcome, channel: Channel, start: float) -> None:
        """The one place a launch ends (`end_launch`, as on a cluster): stop what is
        left, set the record's outcome, apply the last events, draw the final panel. Ranks
        stopped unfinished (`timeout=`, the stop button, silent past `heartbeat_timeout`)
        first get their stacks read (`stacks_of_unfinished`)."""
        where = self.stacks_of_unfinished(outcome)
        end_launch(
            self.reader, self.display, outcome, start,
            stop=self._stop,  # grandchildren that outlived the supervisor too
            drain=lambda: self._drain(channel),
            interrupted_line=("hfxla_nb: interrupted; every worker process of this launch was "
                              "stopped. The kernel is ready for the next launch." + where),
        )

    def stacks_of_unfinished(self, outcome: Outcome) -> str:
        """Read the stacks of the ranks this end stops unfinished (`timeout=`, the stop button,
        silent past `heartbeat_timeout`) onto their records, before they are stopped; returns
        where they were, for the stop button's line."""
        unfinished = [r for r in self.record.ranks
                      if r.exit_state == RankState.TIMEOUT or (
                          r.exit_state.active
                          and outcome in (Outcome.TIMEOUT, Outcome.INTERRUPTED))]
        if not unfinished:
            return ""
        self.read_stacks(unfinished)
        return where_they_were(unfinished)

    def _drain(self, channel: Channel) -> None:
        """Apply the events sent while the launch was stopped, close the channel and the
        output relay."""
        if self.exit_fd is not None:
            os.close(self.exit_fd)
            self.exit_fd = None
        try:
            for event in channel.receive():  # what was sent while the launch was stopped
                self._handle(event)
            self._say_library_warnings()
            self.native.close()
        finally:
            channel.close()


def _exit_descriptor(pid: int) -> int | None:
    """A pidfd for `pid` (Linux 5.3+), so that `select` wakes up the moment it exits; None
    where there is none (the watch loop then sees the exit within `POLL_INTERVAL`)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
