"""A launch's progress bars as data: what each `Progress` event does to its bar.

One place reads progress (`observe.launch_reader.LaunchReader` calls `advance` for every
`Progress` event): the panels' bars, their rates and ETAs, and each rank's `step_times` on its
record are all read from the same `BarTrack`, so they cannot disagree.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..events import Progress
from ..states import BarState, RankState

# Points kept per bar for the current rate (a moving window, like tqdm's smoothing).
RATE_WINDOW = 20


@dataclass(eq=False)  # bars are told apart by identity
class BarTrack:
    """One progress bar of one rank (a `report` label, a tqdm description), as events left it.

    Attributes:
        label: the bar's label ("train", "eval", a tqdm description).
        rank: the rank that reports it.
        step, total, samples: as of its latest event (`total` and `samples` kept when a later
            event leaves them out).
        values: the latest value of each name ("loss", "lr"...).
        start: the wall time its clock starts at (see `LaunchReader`).
        last: the time of its latest event.
        first_step: the first step it reported (0: it counts from 0).
        points: the last `RATE_WINDOW` (step, time, samples) at which the step grew.
        losses: every "loss" value, in the order they arrived.
        step_times: `(step, seconds per step)` each time the step grew: the mean since the
            previous growth (counted again from a new epoch's first update).
    """

    label: str
    rank: int | None
    step: int = 0
    total: int | None = None
    samples: int | None = None
    values: dict[str, float] = field(default_factory=dict)
    start: float | None = None
    last: float | None = None
    first_step: int | None = None
    points: deque = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))
    losses: list[float] = field(default_factory=list)
    step_times: list[tuple[int, float]] = field(default_factory=list)

    @property
    def reached_total(self) -> bool:
        """Whether the bar got to the total it announced."""
        return self.total is not None and self.step >= self.total


def advance(bar: BarTrack, event: Progress) -> None:
    """Apply one `Progress` event of the bar.

    An event with an earlier step than the bar's is one of two things: values a step closure
    fetched for an earlier step, sent no later than the bar's latest event (its values are
    kept, the step is not), or the bar counting from the start again (the next epoch: its
    clock and rate start again).
    """
    at = event.time
    if event.step < bar.step:
        if bar.last is not None and at <= bar.last:
            bar.values.update(event.values)
            _loss_point(bar, event.values)
            return
        bar.points.clear()
        bar.start = at
    if bar.points and event.step > bar.points[-1][0] and at > bar.points[-1][1]:
        last_step, last_time, _ = bar.points[-1]
        bar.step_times.append((event.step, (at - last_time) / (event.step - last_step)))
    if not bar.points or event.step > bar.points[-1][0]:
        bar.points.append((event.step, at, event.samples))
    bar.step = event.step
    bar.total = event.total if event.total is not None else bar.total
    bar.samples = event.samples if event.samples is not None else bar.samples
    bar.values.update(event.values)
    bar.last = at
    _loss_point(bar, event.values)


def _loss_point(bar: BarTrack, values: dict[str, float]) -> None:
    if "loss" in values:
        bar.losses.append(values["loss"])


def bar_state(bar: BarTrack, rank: RankState) -> BarState:
    """The bar's state, from how far it got and how its rank is (or ended): "done" once it
    reached its total; else "running" while the rank runs, "done" ("short" when it announced
    a total it did not reach) when the rank finished, "stopped" when the launch stopped the
    rank, "failed" otherwise."""
    if bar.reached_total:
        return BarState.DONE
    if rank.active:
        return BarState.RUNNING
    if rank == RankState.FINISHED:
        return BarState.SHORT if bar.total is not None else BarState.DONE
    if rank in (RankState.STOPPED, RankState.INTERRUPTED):
        return BarState.STOPPED
    return BarState.FAILED


def bar_start(event: Progress, bars: list[BarTrack], rank: RankState,
              rank_start: float | None) -> float:
    """When a new bar's clock starts: at its own event when that says no step is done yet
    (step 0); else with a bar of the same loop that said so (a tqdm bar, made before the
    loop, over the steps `hx.report` counts: same rank and total, still running), so both
    count the same wall time; else after the rank's bars that already ended (an evaluation
    after training), else at the rank's start.

    Args:
        event: the bar's first event.
        bars: the other bars of the same rank.
        rank: the rank's state now.
        rank_start: when the rank started (its `Started` arrived), if known.
    """
    if event.step == 0:
        return event.time
    running = [bar for bar in bars if bar_state(bar, rank) == BarState.RUNNING]
    same_loop = [bar.start for bar in running
                 if bar.first_step == 0 and bar.total is not None and bar.total == event.total
                 and bar.start is not None and bar.start <= event.time]
    if same_loop:
        return max(same_loop)
    ends = [bar.last for bar in bars if all(bar is not other for other in running)
            and bar.last is not None and bar.last <= event.time]
    candidates = ends + ([rank_start] if rank_start is not None else [])
    return min(max(candidates), event.time) if candidates else event.time
