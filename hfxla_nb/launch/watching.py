"""What the two watchers of a launch share: on one host `supervision.Supervision`, on the hosts
of a Ray cluster `pods.cluster_launch._Watch`. Which ranks' lines reach the cell, how often the
panel is redrawn, and how a launch ends are decided here once for both.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..events import Generated
from ..observe.launch_reader import LaunchReader
from ..states import BaseLaunchRecord, Outcome, RankState
from .library_warnings import print_folded
from .record import LaunchRecord

if TYPE_CHECKING:
    from ..ui import LaunchDisplay

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
        for warning in self.reader.check_heartbeats(now):
            print(warning, file=sys.stderr)
        return None


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
