"""What the launch panels show, computed from events: no drawing here.

`LaunchState` takes the events of a launch (and its final record) and produces a
`LaunchView`: plain data (bars, status, metrics summary, alerts) that every renderer draws the
same way. Rates, ETAs and elapsed times are computed here, once, so renderers only format.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from ..events import (
    Compiled,
    Event,
    Failed,
    Finished,
    Heartbeat,
    MetricsSnapshot,
    Progress,
    Started,
)
from ..observe.analyzer import Alert
from ..observe.live import LiveMetrics
from ..observe.metrics import XlaSummary
from ..states import BarState, BaseLaunchRecord, BaseRankRecord, Outcome, PanelState, RankState
from .units import duration

# Points kept per bar for the charts.
HISTORY = 200
# Progress events used for the current rate (a moving window, like tqdm's smoothing).
RATE_WINDOW = 20
# Ranks are drawn one bar each up to this world size; above it, one bar per label.
PER_RANK_MAX = 4
# A running rank not heard from for this long is shown as silent.
SILENT_AFTER = 30.0
# Ranks the launch stopped (another rank failed; the stop button): their bars say "stopped",
# not "failed".
STOPPED_RANKS = (RankState.STOPPED, RankState.INTERRUPTED)


@dataclass
class BarView:
    """One progress bar, ready to draw."""

    label: str
    rank: int | None
    step: int
    total: int | None
    elapsed: float
    eta: float | None
    rate: float | None
    samples_rate: float | None
    values: dict[str, float]
    losses: list[float]
    step_times: list[float]
    state: BarState
    ranks: int = 1  # how many ranks this bar stands for
    show_rank: bool = True  # False in a one-rank launch: "[rank 0]" would say nothing
    first_step: int | None = None  # the first step reported (0: counted from 0)
    rank_name: str | None = None  # "host 1 rank 2" in a launch over several hosts

    @property
    def name(self) -> str:
        """The bar's caption: its label, with the rank when bars are per rank of several."""
        if self.rank is None:
            return self.label if self.ranks == 1 else f"{self.label} ({self.ranks} ranks)"
        who = self.rank_name or f"rank {self.rank}"
        return f"{self.label} [{who}]" if self.show_rank else self.label

    @property
    def overall(self) -> bool:
        """Whether `rate` and `samples_rate` are averages over the whole bar (once it ended),
        rather than the current rates of the last few updates."""
        return self.state != BarState.RUNNING

    @property
    def fraction(self) -> float | None:
        """Done fraction in [0, 1], or None without a total."""
        if not self.total:
            return None
        return min(max(self.step / self.total, 0.0), 1.0)


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

    @property
    def done(self) -> bool:
        """Whether the launch ended (the panel is final)."""
        return self.state in (PanelState.FINISHED, PanelState.FAILED)


@dataclass
class _Bar:
    label: str
    rank: int | None
    step: int = 0
    total: int | None = None
    samples: int | None = None
    values: dict[str, float] = field(default_factory=dict)
    start: float | None = None
    last: float | None = None
    state: BarState = BarState.RUNNING
    first_step: int | None = None
    points: deque = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))
    losses: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    step_times: deque = field(default_factory=lambda: deque(maxlen=HISTORY))


class LaunchState:
    """Follows a launch's events and answers `view()`.

    Args:
        world: number of ranks.
        per_rank: one bar per rank and label (default: when `world <= 4`), else one bar per
            label for all ranks (the slowest rank's step).
        clock: the wall clock (`time.time`), replaceable in tests.
        attempt: "attempt 2 of 4" when the launch is one of several attempts of one call
            (`LaunchRecord.attempt_text`), else ""; the final record's, when it has one.
    """

    def __init__(self, world: int, per_rank: bool | None = None, clock=time.time,
                 attempt: str = "") -> None:
        self.attempt = attempt
        self.world = max(int(world), 1)
        self.per_rank = self.world <= PER_RANK_MAX if per_rank is None else per_rank
        self.clock = clock
        self.start = clock()
        self.end: float | None = None
        self.ranks: dict[int, RankState] = {rank: RankState.PENDING for rank in range(self.world)}
        self.rank_start: dict[int | None, float] = {}
        self.last_heard: dict[int, float] = {}
        self.bars: dict[tuple, _Bar] = {}
        self.errors: list[str] = []
        self.metrics = LiveMetrics()
        self.outcome: PanelState | None = None  # set by `close`
        self.failed_ranks: set[int | None] = set()  # ranks named by their Failed event
        self.changes = 0  # bumped on every event, so renderers can skip identical redraws
        # How ranks are named where "rank R" is not enough: "host 1 rank 2" in a launch over
        # several hosts (set by launch/pods/cluster_launch.py).
        self.rank_names: dict[int, str] = {}

    # -- events --------------------------------------------------------------------------------

    def handle(self, event: Event) -> None:
        """Take one event; events that change nothing drawn (`ProcessExited`: the record
        says it at the end) only mark their rank as heard from."""
        now = self.clock()
        rank = event.rank
        self.changes += 1
        if rank is not None:
            self.last_heard[rank] = now
        if isinstance(event, Started):
            self.ranks[rank] = RankState.RUNNING
            self.rank_start.setdefault(rank, now)
        elif isinstance(event, Progress):
            self._progress(event, now)
            if self.ranks.get(rank) == RankState.PENDING:
                self.ranks[rank] = RankState.RUNNING
        elif isinstance(event, (MetricsSnapshot, Compiled)):
            self.metrics.add(event)
        elif isinstance(event, Finished):
            if rank is not None:
                self.ranks[rank] = RankState.FINISHED
            self._end_bars(rank, BarState.DONE)
        elif isinstance(event, Failed):
            self.failed_ranks.add(rank)
            message = _failure_line(event, self.world, self.rank_names)
            if message not in self.errors:
                self.errors.append(message)
            if rank is not None:
                self.ranks[rank] = RankState.FAILED
            self._end_bars(rank, BarState.FAILED)
        elif isinstance(event, Heartbeat):
            pass

    def _progress(self, event: Progress, now: float) -> None:
        key = (event.rank, event.label)
        bar = self.bars.get(key)
        if bar is None:
            bar = self.bars[key] = _Bar(event.label, event.rank, first_step=event.step)
            bar.start = self._bar_start(event)
        at = event.time
        if event.step < bar.step:
            if bar.last is not None and at <= bar.last:
                # values fetched by a step closure for an earlier step: keep them
                bar.values.update(event.values)
                self._loss_point(bar, event.values)
                return
            # a newer event counting from the start again (the next epoch): restart the bar
            bar.points.clear()
            bar.start = at
            bar.state = BarState.RUNNING
        if bar.points and event.step > bar.points[-1][0] and at > bar.points[-1][1]:
            last_step, last_time, _ = bar.points[-1]
            bar.step_times.append((at - last_time) / (event.step - last_step))
        if not bar.points or event.step > bar.points[-1][0]:
            bar.points.append((event.step, at, event.samples))
        bar.step = event.step
        bar.total = event.total if event.total is not None else bar.total
        bar.samples = event.samples if event.samples is not None else bar.samples
        bar.values.update(event.values)
        bar.last = at
        self._loss_point(bar, event.values)
        if bar.total is not None and bar.step >= bar.total and bar.state == BarState.RUNNING:
            bar.state = BarState.DONE

    def _bar_start(self, event: Progress) -> float:
        """When a new bar's clock starts: at its own event when that says no step is done yet
        (step 0); else with a bar of the same loop that said so (a tqdm bar, made before the
        loop, over the steps `hx.report` counts: same rank and total, still running), so both
        count the same wall time; else after the rank's bars that already ended (an
        evaluation after training), else at the rank's start."""
        if event.step == 0:
            return event.time
        same_loop = [bar.start for (rank, _), bar in self.bars.items()
                     if rank == event.rank and bar.state == BarState.RUNNING
                     and bar.first_step == 0 and bar.total is not None
                     and bar.total == event.total and bar.start is not None
                     and bar.start <= event.time]
        if same_loop:
            return max(same_loop)
        ends = [bar.last for (rank, _), bar in self.bars.items()
                if rank == event.rank and bar.state != BarState.RUNNING and bar.last is not None
                and bar.last <= event.time]
        start = self.rank_start.get(event.rank)
        candidates = ends + ([start] if start is not None else [])
        return min(max(candidates), event.time) if candidates else event.time

    @staticmethod
    def _loss_point(bar: _Bar, values: dict[str, float]) -> None:
        if "loss" in values:
            bar.losses.append(values["loss"])

    def _end_bars(self, rank: int | None, state: BarState) -> None:
        """Bars of `rank` (every rank when None) that still run become `state`; a bar that
        ended well ("done") but short of the total it announced becomes "short": the check
        mark is only for a bar that reached its total."""
        for (bar_rank, _), bar in self.bars.items():
            if (rank is None or bar_rank == rank) and bar.state == BarState.RUNNING:
                short = state == BarState.DONE and bar.total is not None and bar.step < bar.total
                bar.state = BarState.SHORT if short else state

    def close(self, record: BaseLaunchRecord | None) -> None:
        """Take the launch's final record: its duration, every rank's exit state and error,
        its outcome. Without one (a display closed by hand), the end is judged from the
        events: finished when every rank finished and none failed."""
        self.end = self.clock()
        if record is None:
            ok = not self.errors and all(state == RankState.FINISHED
                                         for state in self.ranks.values())
        else:
            if record.duration > 0:
                self.end = self.start + record.duration
            self.attempt = record.attempt_text or self.attempt
            for rank_record in record.ranks:
                self._close_rank(rank_record)
            ok = record.ok
        self.outcome = PanelState.FINISHED if ok else PanelState.FAILED
        if ok:
            self._end_bars(None, BarState.DONE)
        elif record is not None and not self.errors:
            if record.outcome == Outcome.TIMEOUT:
                self.errors.append("timed out")
            elif record.outcome == Outcome.INTERRUPTED:
                self.errors.append("interrupted")

    def _close_rank(self, rank_record: BaseRankRecord) -> None:
        """A rank's final state from the record; its error, when no event said it already."""
        rank, state = rank_record.rank, rank_record.exit_state
        self.ranks[rank] = state
        if state == RankState.FINISHED:
            return
        if state in STOPPED_RANKS:  # not what went wrong: the status names the failure
            self._end_bars(rank, BarState.STOPPED)
            return
        message = self._record_error(rank_record)
        if message and rank not in self.failed_ranks:
            if not any(message in known or known in message for known in self.errors):
                self.errors.append(message)
        self._end_bars(rank, BarState.FAILED)

    def _record_error(self, rank_record: BaseRankRecord) -> str | None:
        """A rank's failure as the record tells it: its short reason ("killed by SIGKILL")
        when it has one (the `LaunchError` gives the details), else its error."""
        rank, reason, error = rank_record.rank, rank_record.reason, rank_record.error
        if reason:
            return f"rank {rank} {reason}" if self.world > 1 else reason
        if error:
            return f"rank {rank}: {error}" if self.world > 1 else error
        return None

    # -- view ----------------------------------------------------------------------------------

    def view(self) -> LaunchView:
        """The current state as plain data."""
        now = self.end if self.end is not None else self.clock()
        state = self._panel_state()
        bars = [self._bar_view(bar, now) for bar in self.bars.values()]
        if not self.per_rank:
            bars = _aggregate(bars)
        bars.sort(key=lambda b: (b.rank is None, b.rank or 0, b.label != "train", b.label))
        notes = [note for bar in bars if (note := short_bar_note(bar))]
        if self.end is None:
            for rank, status in sorted(self.ranks.items()):
                heard = self.last_heard.get(rank)
                if (status == RankState.RUNNING and heard is not None
                        and now - heard > SILENT_AFTER):
                    notes.append(f"rank {rank} silent for {duration(now - heard)}")
        metrics_ranks = self.metrics.process_ranks()
        metrics = self.metrics.summary()
        return LaunchView(
            world=self.world,
            state=state,
            elapsed=max(now - self.start, 0.0),
            ranks=dict(self.ranks),
            bars=bars,
            errors=list(self.errors),
            notes=notes,
            metrics=metrics,
            metrics_rank=metrics_ranks[0] if metrics_ranks else None,
            alerts=self.metrics.alerts(),
            metrics_ranks=metrics_ranks,
            metrics_step=metrics.steps if metrics is not None else None,
            attempt=self.attempt,
        )

    def _panel_state(self) -> PanelState:
        """The status line's state: the outcome once closed; before, "running" from the first
        rank that started or reported (also after a rank failed: the others are still being
        stopped), else "starting"."""
        if self.outcome is not None:
            return self.outcome
        if any(state != RankState.PENDING for state in self.ranks.values()) or self.bars:
            return PanelState.RUNNING
        return PanelState.STARTING

    def _bar_view(self, bar: _Bar, now: float) -> BarView:
        running = bar.state == BarState.RUNNING
        end = now if running else (bar.last or now)
        elapsed = max(end - (bar.start if bar.start is not None else end), 0.0)
        rate = samples_rate = None
        if not running:  # ended: the averages over the whole bar
            if elapsed > 0:
                rate = bar.step / elapsed if bar.step else None
                samples_rate = bar.samples / elapsed if bar.samples else None
        elif len(bar.points) >= 2:  # running: the rate of the last few updates
            (s0, t0, n0), (s1, t1, n1) = bar.points[0], bar.points[-1]
            if t1 > t0:
                rate = (s1 - s0) / (t1 - t0)
                if n0 is not None and n1 is not None:
                    samples_rate = (n1 - n0) / (t1 - t0)
        eta = None
        if running and rate and bar.total is not None:
            eta = max(bar.total - bar.step, 0) / rate
        return BarView(
            label=bar.label,
            rank=bar.rank,
            step=bar.step,
            total=bar.total,
            elapsed=elapsed,
            eta=eta,
            rate=rate,
            samples_rate=samples_rate,
            values=dict(bar.values),
            losses=list(bar.losses),
            step_times=list(bar.step_times),
            state=bar.state,
            show_rank=self.world > 1,
            first_step=bar.first_step,
            rank_name=self.rank_names.get(bar.rank) if bar.rank is not None else None,
        )


def _failure_line(event: Failed, world: int, names: dict[int, str] | None = None) -> str:
    """`rank 1 raised ValueError` (`host 1 rank 2 raised ...` over several hosts): who failed
    and how, for the panel. The message itself is shown once, by the `LaunchError` the cell
    raises (with the remote traceback)."""
    if event.rank is None:
        who = "the launcher"
    else:
        who = (names or {}).get(event.rank, f"rank {event.rank}") if world > 1 else "the function"
    return f"{who} raised {event.exc_type}" if event.exc_type else f"{who} failed"


def short_bar_note(bar: BarView) -> str | None:
    """Why a bar of a finished launch stopped before its total, when it did."""
    if bar.state != BarState.SHORT or not bar.total:
        return None
    if bar.first_step == 0 and bar.step == bar.total - 1:
        return (f"{bar.name} stopped at {bar.step}/{bar.total}: its steps count from 0. "
                "Report the steps done, step=i + 1 (or enumerate(loader, start=1)).")
    return (f"{bar.name} stopped at {bar.step}/{bar.total}: the function returned before "
            "the total it reported.")


def _aggregate(bars: list[BarView]) -> list[BarView]:
    """One bar per label: the slowest rank's step, the summed sample rate."""
    by_label: dict[str, list[BarView]] = {}
    for bar in bars:
        by_label.setdefault(bar.label, []).append(bar)
    merged = []
    for label, group in by_label.items():
        group.sort(key=lambda b: (b.rank is None, b.rank or 0))
        slowest = min(group, key=lambda b: b.step)
        first = group[0]
        rates = [b.rate for b in group if b.rate is not None]
        samples = [b.samples_rate for b in group if b.samples_rate is not None]
        states = {b.state for b in group}
        state = next((s for s in (BarState.FAILED, BarState.RUNNING, BarState.STOPPED,
                                  BarState.SHORT)
                      if s in states), BarState.DONE)
        merged.append(BarView(
            label=label,
            rank=None,
            step=slowest.step,
            total=max((b.total for b in group if b.total is not None), default=None),
            elapsed=max(b.elapsed for b in group),
            eta=max((b.eta for b in group if b.eta is not None), default=None),
            rate=min(rates) if rates else None,
            samples_rate=sum(samples) if samples else None,
            values=first.values,
            losses=first.losses,
            step_times=first.step_times,
            state=state,
            ranks=len(group),
            first_step=min((b.first_step for b in group if b.first_step is not None),
                           default=None),
        ))
    return merged
