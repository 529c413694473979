"""The states of a launch, of its ranks and of its progress bars, and the plain records that
carry them.

Defined once, below every layer that speaks them: the launch sets them (`observe.reader`,
`launch.supervision`) and the panels draw them (`ui.state`, `ui.text`, `ui.html`), so a panel
imports the very type the launcher fills in, instead of reading it by attribute names. Each
state is a `str` whose value is the word the panels, `repr()` and `LaunchRecord.to_dataframe()`
show: `record.outcome == "finished"` keeps working, and a misspelt state is an `AttributeError`
(or a `ValueError` when a record is built from a word), never a comparison that is silently
False.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class StateWord(str, Enum):
    """A state that reads as its word: `str()`, f-strings and `repr()` give the value
    (`'finished'`, not `<RankState.FINISHED: 'finished'>`), so records print in a notebook as
    they always did. (`enum.StrEnum` is Python 3.11+; the package supports 3.10.)"""

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)


class RankState(StateWord):
    """How far one rank of a launch got (`RankRecord.exit_state`, `LaunchView.ranks`)."""

    PENDING = "pending"  # not started yet; at the end: never started
    RUNNING = "running"  # started, not ended yet
    FINISHED = "finished"  # the function returned
    FAILED = "failed"  # the function raised, or the rank never reported a result
    KILLED = "killed"  # its process died by a signal or exited (os._exit) before returning
    TIMEOUT = "timeout"  # stopped by `timeout=`, or silent past `heartbeat_timeout=`
    INTERRUPTED = "interrupted"  # stopped by the kernel's stop button
    STOPPED = "stopped"  # stopped because another rank failed

    @property
    def active(self) -> bool:
        """Whether the launch has not ended this rank yet (pending or running)."""
        return self in (RankState.PENDING, RankState.RUNNING)


class Outcome(StateWord):
    """How a whole launch ended (`LaunchRecord.outcome`)."""

    RUNNING = "running"  # not ended yet
    FINISHED = "finished"  # every rank finished
    FAILED = "failed"  # a rank failed, was killed, froze, or the launcher itself failed
    TIMEOUT = "timeout"  # `timeout=` passed
    INTERRUPTED = "interrupted"  # the kernel was interrupted (the stop button)


class PanelState(StateWord):
    """The launch as a panel's status line says it (`LaunchView.state`)."""

    STARTING = "starting"  # no rank has started or reported yet
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"  # also a launch that timed out or was interrupted


class BarState(StateWord):
    """One progress bar (`BarView.state`)."""

    RUNNING = "running"
    DONE = "done"  # reached the total it announced, or ended well without one
    SHORT = "short"  # its rank finished before the bar reached its total
    FAILED = "failed"  # its rank did not finish
    STOPPED = "stopped"  # its rank was stopped (another rank failed, the stop button)


@dataclass
class BaseRankRecord:
    """How one rank of a launch went: the plain data the launcher fills in and the panels draw
    (`hfxla_nb.RankRecord` adds the rank's XLA figures).

    Attributes:
        rank: the rank index.
        pid: the process it ran in (ranks share a process on TPU v2/v3 and XLA:CPU).
        exit_state: a `RankState`: "pending" (not started; at the end: never started),
            "running" (started and not ended: while the launch runs), "finished", "failed"
            (raised, or never reported a result), "killed" (its process died by a signal or
            exited before returning), "timeout" (stopped by `timeout=` or silent past
            `heartbeat_timeout=`), "interrupted" (the stop button) or "stopped" (stopped
            because another rank failed). A word is turned into its `RankState`.
        result: the function's return value (finished ranks only).
        error: a one-line description of what went wrong, or None.
        traceback: the remote traceback, when the rank raised (the launcher's own frames left
            out).
        duration: seconds from the rank's start to its end.
        last_step: the last step the rank reported, if any.
        bars: every progress bar of the rank (`report` labels, tqdm descriptions) -> its
            last (step, total).
        reason: the same as `error` in a few words ("raised ValueError", "killed by
            SIGKILL"), for the panel (the `LaunchError` carries the whole of it).
        signal: the number of the signal that killed its process; None when none did.
        stack: where the rank was when it went quiet or was stopped unfinished (`timeout=`,
            `heartbeat_timeout=`, the stop button): its process's threads that run the user's
            code, most recent call first; "" when none was read (`launch.stacks`).

    Raises:
        ValueError: `exit_state` is not a `RankState` word.
    """

    rank: int
    pid: int | None = None
    exit_state: RankState = RankState.PENDING
    result: Any = None
    error: str | None = None
    traceback: str = ""
    duration: float = 0.0
    last_step: int | None = None
    bars: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    reason: str | None = None
    signal: int | None = None
    stack: str = ""
    last_seen: float = field(default=0.0, repr=False)  # monotonic time of its last event
    started_at: float = field(default=0.0, repr=False)  # monotonic time of its Started

    def __post_init__(self) -> None:
        self.exit_state = RankState(self.exit_state)


@dataclass
class BaseLaunchRecord:
    """One `notebook_launcher` call as plain data: what the panels draw at its end
    (`hfxla_nb.LaunchRecord` adds its figures as a table and its processes).

    Attributes:
        strategy: "replicated", "spmd" or "debug".
        world: number of ranks.
        ranks: one rank record per rank, in rank order.
        duration: wall-clock seconds of the whole launch.
        outcome: an `Outcome`: "running" until the launch ends, then "finished", "failed",
            "timeout" or "interrupted". A word is turned into its `Outcome`.
        process_group: the process group of every process the launch started (all gone when
            the launcher returns).
        attempt: which attempt this launch was (1, then 2... after `max_restarts=`
            relaunched the function following a failure).
        max_attempts: how many attempts the call allowed (`max_restarts + 1`).
        stopped_processes: what the launch left running outside its process group and had
            to stop, each as "sleep 600 (pid 1234)".
        notes: what the launch's checks wanted said, shown under the bars: words about the
            launch, not a Python warning at a line of the cell.
        collective_notes: notes that explain a failure of XLA collectives (XLA:CPU's
            replicated ranks are threads of one process, ...): moved to `notes` when the
            launch ends in such a failure (more than one rank failed, it hung, or an error
            names a collective), not when one rank failed on its own.

    Raises:
        ValueError: `outcome` is not an `Outcome` word.
    """

    strategy: str
    world: int
    ranks: list[BaseRankRecord]
    duration: float = 0.0
    outcome: Outcome = Outcome.RUNNING
    process_group: int | None = None
    attempt: int = 1
    max_attempts: int = 1
    stopped_processes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    collective_notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.outcome = Outcome(self.outcome)

    @property
    def attempt_text(self) -> str:
        """The words "attempt 2 of 4" when the call allowed restarts, else "" (for panels)."""
        return f"attempt {self.attempt} of {self.max_attempts}" if self.max_attempts > 1 else ""

    @property
    def ok(self) -> bool:
        """Whether every rank finished."""
        return self.outcome == Outcome.FINISHED

    @property
    def value(self) -> Any:
        """Rank 0's return value (what `notebook_launcher` returns)."""
        return self.ranks[0].result if self.ranks else None

    @property
    def results(self) -> list[Any]:
        """Every rank's return value, in rank order (None where a rank did not finish)."""
        return [rank.result for rank in self.ranks]
