"""A launch's progress bars as data: what each `Progress` event does to its bar, and its
time and speed at a moment (`bar_clock`).

One place reads progress (`observe.launch_reader.LaunchReader` calls `advance` for every
`Progress` event): the panels' bars, their rates and ETAs, and each rank's `step_times` on its
record are all read from the same `BarTrack`, so they cannot disagree. The panels only format
what `bar_clock` computed (`ui.bar_view`).

A bar's clock: its elapsed time runs from the bar's start; a late value (a loss fetched for an
earlier step, `Progress.late`) never moves it. Its rate and ETA leave out the first
`BAR_WARMUP_STEPS` steps, which compile: the same steps `fine_tune`'s result leaves out of its
`samples_per_second`, so the bar's last rate and the result's agree.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..events import Progress
from ..states import BarState, RankState

# Points kept per bar for its step times.
RATE_WINDOW = 20

#: Steps a bar leaves out of its rate and ETA, counted from where it started: the first steps
#: compile, and a rate over them says nothing about the steps to come. The training loop's
#: `STEADY_AFTER_STEPS` (the warm-up of the result's `samples_per_second`) is this number.
BAR_WARMUP_STEPS = 3

# The rate unit's hysteresis: a bar in steps per second turns to seconds per step below
# SLOW_BELOW steps per second, and back only at FAST_FROM or more. A rate near 1 step per
# second, going a little up and down, then keeps one unit instead of flipping.
SLOW_BELOW = 0.8
FAST_FROM = 1.25


def seconds_per_step(rate: float, before: bool | None = None) -> bool:
    """The one unit rule: whether a rate of `rate` steps per second reads as seconds per
    step (`1.20 s/it`) rather than steps per second (`12.3 it/s`).

    Args:
        rate: steps per second (positive).
        before: the unit the bar showed so far (True: seconds per step), None for its first
            rate. A first rate below 1 step per second reads in seconds per step; after that
            the unit changes only past the hysteresis band (`SLOW_BELOW`, `FAST_FROM`).
    """
    if before is None:
        return rate < 1
    return rate < FAST_FROM if before else rate < SLOW_BELOW


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
        last: the time of its latest progress (never earlier than before: late values do
            not move it).
        first_step: the first step it reported (0: it counts from 0).
        origin: the step its current pass started from (its first step, or the first of a
            pass that counts from the start again); its warm-up is counted from there.
        grew: whether its step ever grew (its first step ended).
        steady: the `(step, time, samples)` its rates are measured from: its first update at
            or past `origin + BAR_WARMUP_STEPS`; None before.
        per_step: whether its rate reads as seconds per step (`seconds_per_step`), None
            before its first rate.
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
    origin: int | None = None
    grew: bool = False
    steady: tuple[int, float, int | None] | None = None
    per_step: bool | None = None
    points: deque = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))
    losses: list[float] = field(default_factory=list)
    step_times: list[tuple[int, float]] = field(default_factory=list)

    @property
    def waiting(self) -> bool:
        """Whether the bar was announced and has not started (`Progress.waiting`)."""
        return self.start is None and self.last is None

    @property
    def reached_total(self) -> bool:
        """Whether the bar got to the total it announced."""
        return self.total is not None and self.step >= self.total


def advance(bar: BarTrack, event: Progress) -> None:
    """Apply one `Progress` event of the bar.

    Values that are not progress only update the bar's values: an event marked `late` (the
    training loop's loss, fetched on a thread of its own after later steps were reported),
    and one with an earlier step sent no later than the bar's latest event (a step closure of
    `hx.report`, which keeps its step's time). Any other event with an earlier step is the
    bar counting from the start again (the next epoch): its clock, rate and warm-up start
    again.
    """
    at = event.time
    earlier = event.step < bar.step
    if bar.last is not None and (event.late or (earlier and at <= bar.last)):
        bar.values.update(event.values)
        _loss_point(bar, event.values)
        return
    if bar.origin is None:
        bar.origin = event.step
    if earlier:
        bar.points.clear()
        bar.start = at
        bar.origin = event.step
        bar.steady = None
    if bar.points and event.step > bar.points[-1][0] and at > bar.points[-1][1]:
        last_step, last_time, _ = bar.points[-1]
        bar.step_times.append((event.step, (at - last_time) / (event.step - last_step)))
    if not bar.points or event.step > bar.points[-1][0]:
        _rate_point(bar, (event.step, at, event.samples))
    bar.grew = bar.grew or event.step > bar.step
    bar.step = event.step
    bar.total = event.total if event.total is not None else bar.total
    bar.samples = event.samples if event.samples is not None else bar.samples
    bar.values.update(event.values)
    bar.last = at if bar.last is None else max(bar.last, at)
    _loss_point(bar, event.values)


def _rate_point(bar: BarTrack, point: tuple[int, float, int | None]) -> None:
    """Keep a point the step grew at; the first past the warm-up is where rates start."""
    bar.points.append(point)
    if bar.steady is None and point[0] >= (bar.origin or 0) + BAR_WARMUP_STEPS:
        bar.steady = point
    rates = steady_rates(bar)
    if rates is not None:  # the unit follows each new rate, within its hysteresis
        bar.per_step = seconds_per_step(rates[0], bar.per_step)


def _loss_point(bar: BarTrack, values: dict[str, float]) -> None:
    if "loss" in values:
        bar.losses.append(values["loss"])


def steady_rates(bar: BarTrack) -> tuple[float, float | None] | None:
    """Steps and samples per second over the bar's steady part: from its first update past
    the warm-up to its latest one (the mean, as the result's `samples_per_second` is); None
    until two such updates exist."""
    if bar.steady is None or not bar.points:
        return None
    (s0, t0, n0), (s1, t1, n1) = bar.steady, bar.points[-1]
    if s1 <= s0 or t1 <= t0:
        return None
    samples = (n1 - n0) / (t1 - t0) if n0 is not None and n1 is not None else None
    return (s1 - s0) / (t1 - t0), samples


def steady_step_time(step_times: list[tuple[int, float]], compiled: list[tuple[int, int]],
                     first_step: int = 0) -> float | None:
    """The median wall time per step over the steps that compiled nothing: what a finished
    bar says its step takes (its last step may be one that compiled: 625 ms where the run's
    steps took 256 ms).

    Args:
        step_times: the bar's `(step, seconds per step)`, each the mean since the previous
            one (`BarTrack.step_times`).
        compiled: `(after, upto)` step spans in which a compilation happened: steps `after + 1`
            to `upto` (`LiveMetrics.compiled_spans`, from the compile counts of the metrics
            snapshots). A step's compile is timed by the next update too (`report` comes
            before the step's sync), so each span counts one step more.
        first_step: the bar's first step: its first `BAR_WARMUP_STEPS` steps compile anyway.

    Returns:
        The median over the updates past the warm-up that cover no compiling step; over every
        update when none is left; None without updates.
    """
    if not step_times:
        return None
    steady, previous = [], first_step
    for step, seconds in step_times:
        low = previous if previous < step else step - 1  # a new epoch counts from its start
        previous = step
        if step <= first_step + BAR_WARMUP_STEPS:
            continue
        if any(low < upto + 1 and step > after for after, upto in compiled):
            continue
        steady.append(seconds)
    return _median(steady or [seconds for _, seconds in step_times])


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@dataclass(frozen=True)
class BarClock:
    """A bar's time and speed at one moment, as `bar_clock` reads them from its one clock.

    Attributes:
        elapsed: seconds from the bar's start to now (running) or to its latest update
            (ended); it never goes back while the bar runs.
        compiling: the bar's first step still runs (it counts from 0, nothing is done yet):
            on XLA, that step compiles.
        rate, samples_rate: steps and samples per second, or None.
        over: what the rates are averaged over: "steady" (the steps after the warm-up),
            "whole" (the whole bar, which ended before its warm-up was over), None without
            rates.
        eta: seconds left at the steady rate; only while the bar runs and has a total.
        per_step: whether `rate` reads as seconds per step (`seconds_per_step`).
    """

    elapsed: float
    compiling: bool = False
    rate: float | None = None
    samples_rate: float | None = None
    over: str | None = None
    eta: float | None = None
    per_step: bool = False


def bar_clock(bar: BarTrack, now: float, running: bool) -> BarClock:
    """`bar`'s time and speed at `now`.

    Args:
        bar: the reader's bar.
        now: the wall time the panel is drawn for.
        running: whether the bar still runs (`bar_state`); an ended bar's time stops at its
            latest update.
    """
    end = now if bar.last is None else (max(now, bar.last) if running else bar.last)
    elapsed = max(end - (bar.start if bar.start is not None else end), 0.0)
    compiling = running and bar.first_step == 0 and bar.step == 0 and not bar.grew
    rates = steady_rates(bar)
    over = "steady" if rates is not None else None
    if rates is None and not running and elapsed > 0 and bar.step:
        # Too short for a warm-up: the whole bar's average is all there is.
        rates = (bar.step / elapsed, bar.samples / elapsed if bar.samples else None)
        over = "whole"
    if rates is None:
        return BarClock(elapsed, compiling, per_step=bool(bar.per_step))
    rate, samples_rate = rates
    eta = None
    if running and bar.total is not None:
        eta = max(bar.total - bar.step, 0) / rate
    return BarClock(elapsed, compiling, rate, samples_rate, over, eta,
                    seconds_per_step(rate, bar.per_step))


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
