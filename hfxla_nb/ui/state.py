"""What the launch panels show: a view of the launch's one reader, no drawing here.

The events of a launch are applied once, by `observe.launch_reader.LaunchReader`, to the
launch's record, its bars and its metrics. `LaunchState` computes from those a `LaunchView`:
plain data (bars, status, metrics summary, alerts) that every renderer draws the same way. So
the panel shows what the record says, and the two cannot disagree.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .._units import duration
from ..events import Event
from ..observe.analyzer import Alert
from ..observe.generated import StreamedRow
from ..observe.launch_reader import LaunchReader
from ..observe.metrics import XlaSummary
from ..states import BaseLaunchRecord, BaseRankRecord, Outcome, PanelState, RankState
from .bar_view import BarView, aggregate, bar_view, short_bar_note

__all__ = ["BarView", "LaunchState", "LaunchView", "short_bar_note"]

# Ranks are drawn one bar each up to this world size; above it, one bar per label.
PER_RANK_MAX = 4
# A running rank not heard from for this long is shown as silent.
SILENT_AFTER = 30.0
# Ranks the launch stopped (another rank failed; the stop button): not what went wrong, the
# status line names the failure.
STOPPED_RANKS = (RankState.STOPPED, RankState.INTERRUPTED)


@dataclass
class LaunchView:
    """Everything a launch panel shows at one moment."""

    world: int
    state: PanelState
    elapsed: float
    ranks: dict[int, RankState]
    bars: list[BarView]
    errors: list[str]
    notes: list[str]
    metrics: XlaSummary | None = None
    metrics_rank: int | None = None  # the lowest rank whose work `metrics` counts
    alerts: list[Alert] = field(default_factory=list)
    # Every rank whose work `metrics` counts: torch_xla's counters belong to a process, and
    # the rank threads of one process (replicated mode on the CPU, TPU v2/v3) share them.
    metrics_ranks: list[int] = field(default_factory=list)
    metrics_step: int | None = None  # the step as of which `metrics` were read
    attempt: str = ""  # "attempt 2 of 4" when the call allowed restarts (`max_restarts=`)
    # The rows of the latest `hx.generate(..., stream=True)`: each prompt and its text so far.
    generations: list[StreamedRow] = field(default_factory=list)

    @property
    def done(self) -> bool:
        """Whether the launch ended (the panel is final)."""
        return self.state in (PanelState.FINISHED, PanelState.FAILED)


class LaunchState:
    """The panel's view of one launch: `view()` computes a `LaunchView` from its reader.

    Args:
        world: number of ranks.
        per_rank: one bar per rank and label (default: when `world <= 4`), else one bar per
            label for all ranks (the slowest rank's step).
        clock: the wall clock (`time.time`), replaceable in tests (for a reader made here).
        attempt: "attempt 2 of 4" when the launch is one of several attempts of one call
            (`LaunchRecord.attempt_text`), else ""; the final record's, when it has one.
        reader: the launch's reader (the launcher's: the panel draws the launch's record);
            None: a reader of its own, fed by `handle` (a panel used alone, in tests).
    """

    def __init__(self, world: int, per_rank: bool | None = None,
                 clock: Callable[[], float] = time.time, attempt: str = "",
                 reader: LaunchReader | None = None) -> None:
        self.world = max(int(world), 1)
        self.per_rank = self.world <= PER_RANK_MAX if per_rank is None else per_rank
        self.attempt = attempt
        self.owns_reader = reader is None
        if reader is None:
            ranks = [BaseRankRecord(rank) for rank in range(self.world)]
            reader = LaunchReader(BaseLaunchRecord("", self.world, ranks), clock=clock)
        self.reader = reader
        self.outcome: PanelState | None = None  # set by `close`

    @property
    def changes(self) -> int:
        """How many events the reader applied (renderers skip identical redraws)."""
        return self.reader.changes

    def handle(self, event: Event) -> None:
        """Take one event: applied by the panel's own reader; the launcher's reader (given at
        construction) has applied it already."""
        if self.owns_reader:
            self.reader.handle(event)

    def close(self, record: BaseLaunchRecord | None) -> None:
        """The launch ended; `record` is its final record (the reader's own, in a launch).
        Given another one (a panel that read the events itself), the panel shows that
        record's states. Without one (a display closed by hand), the end is judged from the
        events: finished when every rank finished and none failed."""
        reader = self.reader
        if record is not None and record is not reader.record:
            reader.record = record
        if reader.ended is None:
            reader.end()
        if record is None:
            ok = not reader.raised and reader.all_finished()
        else:
            self.attempt = record.attempt_text or self.attempt
            ok = record.ok
        self.outcome = PanelState.FINISHED if ok else PanelState.FAILED

    # -- view ----------------------------------------------------------------------------------

    def view(self) -> LaunchView:
        """The current state as plain data."""
        reader = self.reader
        now = self._end() if self.outcome is not None else reader.clock()
        ranks = self._rank_states()
        bars = [bar_view(bar, now, ranks.get(bar.rank, RankState.RUNNING), self.world > 1,
                         reader.rank_names.get(bar.rank) if bar.rank is not None else None,
                         reader.metrics.compiled_spans(bar.rank))
                for bar in reader.bars.values()]
        if not self.per_rank:
            bars = aggregate(bars)
        bars.sort(key=lambda b: (b.rank is None, b.rank or 0, b.label != "train", b.label))
        notes = list(reader.record.notes)
        notes += [note for bar in bars if (note := short_bar_note(bar))]
        if self.outcome is None:
            notes += self._silent_notes(ranks, now)
        metrics_ranks = reader.metrics.process_ranks()
        metrics = reader.metrics.summary()
        return LaunchView(
            world=self.world,
            state=self._panel_state(ranks),
            elapsed=max(now - reader.began, 0.0),
            ranks=ranks,
            bars=bars,
            errors=self._errors(),
            notes=notes,
            metrics=metrics,
            metrics_rank=metrics_ranks[0] if metrics_ranks else None,
            alerts=reader.metrics.alerts(),
            metrics_ranks=metrics_ranks,
            metrics_step=metrics.counted()[0] if metrics is not None else None,
            attempt=self.attempt,
            generations=reader.streamed.rows(),
        )

    def _end(self) -> float:
        """When the launch ended, on the wall clock: its start plus the record's duration
        when the record has one."""
        record, reader = self.reader.record, self.reader
        if record.duration > 0:
            return reader.began + record.duration
        return reader.ended if reader.ended is not None else reader.clock()

    def _rank_states(self) -> dict[int, RankState]:
        """Each rank's state as the record says it; a rank not started that already reported
        progress is running."""
        reporting = {bar.rank for bar in self.reader.bars.values()}
        states = {}
        for rank_record in self.reader.record.ranks:
            state = rank_record.exit_state
            if state == RankState.PENDING and rank_record.rank in reporting:
                state = RankState.RUNNING
            states[rank_record.rank] = state
        return states

    def _silent_notes(self, ranks: dict[int, RankState], now: float) -> list[str]:
        notes = []
        for rank, status in sorted(ranks.items()):
            heard = self.reader.heard.get(rank)
            if status == RankState.RUNNING and heard is not None and now - heard > SILENT_AFTER:
                notes.append(f"rank {rank} silent for {duration(now - heard)}")
        return notes

    def _panel_state(self, ranks: dict[int, RankState]) -> PanelState:
        """The status line's state: the outcome once closed; before, "running" from the first
        rank that started or reported (also after a rank failed: the others are still being
        stopped), else "starting"."""
        if self.outcome is not None:
            return self.outcome
        if any(state != RankState.PENDING for state in ranks.values()):
            return PanelState.RUNNING
        return PanelState.STARTING

    def _errors(self) -> list[str]:
        """What went wrong, for the status line: who raised what (the `Failed` events), then,
        once the launch ended, each rank that failed another way as its record says, or how
        the launch ended ("timed out", "interrupted") when nothing else is known."""
        errors: list[str] = []
        for rank, exc_type in self.reader.raised:
            line = _failure_line(rank, exc_type, self.world, self.reader.rank_names)
            if line not in errors:
                errors.append(line)
        if self.outcome is None:
            return errors
        named = {rank for rank, _ in self.reader.raised}
        record = self.reader.record
        for rank_record in record.ranks:
            if rank_record.exit_state == RankState.FINISHED or rank_record.rank in named:
                continue
            if rank_record.exit_state in STOPPED_RANKS:
                continue
            message = self._record_error(rank_record)
            if message and not any(message in known or known in message for known in errors):
                errors.append(message)
        if not errors and self.outcome == PanelState.FAILED:
            if record.outcome == Outcome.TIMEOUT:
                errors.append("timed out")
            elif record.outcome == Outcome.INTERRUPTED:
                errors.append("interrupted")
        return errors

    def _record_error(self, rank_record: BaseRankRecord) -> str | None:
        """A rank's failure as the record tells it: its short reason ("killed by SIGKILL")
        when it has one (the `LaunchError` gives the details), else its error."""
        rank, reason, error = rank_record.rank, rank_record.reason, rank_record.error
        if reason:
            return f"rank {rank} {reason}" if self.world > 1 else reason
        if error:
            return f"rank {rank}: {error}" if self.world > 1 else error
        return None


def _failure_line(rank: int | None, exc_type: str, world: int,
                  names: dict[int, str] | None = None) -> str:
    """`rank 1 raised ValueError` (`host 1 rank 2 raised ...` over several hosts): who failed
    and how, for the panel. The message itself is shown once, by the `LaunchError` the cell
    raises (with the remote traceback)."""
    if rank is None:
        who = "the launcher"
    else:
        who = (names or {}).get(rank, f"rank {rank}") if world > 1 else "the function"
    return f"{who} raised {exc_type}" if exc_type else f"{who} failed"
