"""What a launch did, rank by rank: `LaunchRecord` and `RankRecord`.

The records' plain data and their states are `hfxla_nb.states`' (the panels, a layer below,
draw the same types); here they gain each rank's XLA figures and the launch's table. One
reader fills them in from the launch's events (`observe.launch_reader.LaunchReader`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._units import duration
from .._words import plural
from ..events import Generated, LibraryWarning
from ..observe.rank_metrics import RankMetrics, dataframe
from ..states import BaseLaunchRecord, BaseRankRecord


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

