"""`LaunchReader`: the one reader of a launch's events, and what it keeps.

Every event of a launch is applied here, once: to its record (each rank's state, result,
error, bars), to its progress bars and to its metrics. The launcher's decisions (a failure, a
silent rank, the end) and every panel (`ui.state`) read what this reader holds, so the record,
the panels and `last_launch()` cannot disagree. It forks, reads and draws nothing, so tests
drive it with events alone.

- Progress bars as data (`BarTrack`): what each `Progress` event does to its bar, and its time
  and speed at a moment (`bar_clock`). The panels' bars, their rates and ETAs, and each rank's
  `step_times` are read from the same track. A bar's elapsed time runs from its start; a late
  value (a loss fetched for an earlier step) never moves it. Its rate and ETA leave out the
  first `BAR_WARMUP_STEPS` steps, which compile: the same steps `fine_tune`'s result leaves
  out of its `samples_per_second`, so the bar's last rate and the result's agree.
- Generations as they stream in (`Generated` events): each row's prompt and its text so far,
  for the panels to draw (`hx.generate(..., stream=True)`).
- `LiveMetrics`: the `MetricsSnapshot` events of a launch, kept per process and summarized.
- Each rank's final XLA figures as plain data (`RankRecord.metrics`), to put in a DataFrame or
  assert instead of reading them off a panel. They have `XlaSummary`'s names
  (`compile_seconds`, `execute_seconds`...): a rank's figures are its process's summary.
"""

from __future__ import annotations

import signal
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

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
from ..states import BarState, BaseLaunchRecord, BaseRankRecord, Outcome, RankState
from .alerts import Alert, analyze
from .metrics import WARMUP_STEPS, XlaCounts, XlaSummary, compile_count, summarize
from .tracing import TraceLog

# -- progress bars as data --

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
        starts: when an announced bar starts, in words (`Progress.starts`), or None.
        ended: why it ended before its total (`Progress.ended`), or None.
        origin: the step its current pass started from (its first step, or the first of a
            pass that counts from the start again); its warm-up is counted from there.
        grew: whether its step ever grew (its first step ended).
        steady: the `(step, time, samples)` its rates are measured from: its first update at
            or past `origin + BAR_WARMUP_STEPS`; None before.
        per_step: whether its rate reads as seconds per step (`seconds_per_step`), None
            before its first rate.
        points: the last `RATE_WINDOW` (step, time, samples) at which the step grew.
        losses: every "loss" value, in the order they arrived.
        evaluations: `(losses before it, eval_loss)` of each evaluation sent as a value of the
            bar (`fine_tune`'s `eval_strategy`): where it sits on the loss chart. Counted in
            losses, not steps: a bar that counts again from 1 each epoch keeps its place.
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
    starts: str | None = None
    ended: str | None = None
    origin: int | None = None
    grew: bool = False
    steady: tuple[int, float, int | None] | None = None
    per_step: bool | None = None
    points: deque = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))
    losses: list[float] = field(default_factory=list)
    evaluations: list[tuple[int, float]] = field(default_factory=list)
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
    bar.ended = event.ended or (None if earlier else bar.ended)
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
    if "eval_loss" in values:
        bar.evaluations.append((len(bar.losses), values["eval_loss"]))


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
    reached its total or said why it ended before it (`Progress.ended`); else "running"
    while the rank runs, "done" ("short" when it announced a total it did not reach) when the
    rank finished, "stopped" when the launch stopped the rank, "failed" otherwise."""
    if bar.reached_total or bar.ended is not None:
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


# -- generations as they stream in --

@dataclass
class StreamedRow:
    """One row of a generation: its prompt, the text generated so far, whether it ended."""

    prompt: str
    text: str = ""
    done: bool = False


class StreamedText:
    """The rows of each rank's latest generation, as its `Generated` events left them."""

    def __init__(self) -> None:
        self.by_rank: dict[int | None, list[StreamedRow]] = {}

    def add(self, event: Generated) -> None:
        """Apply one event: a generation's first event (it names the prompts) starts new
        rows; a later one adds each row's new text."""
        rows = self.by_rank.get(event.rank)
        if event.prompts or rows is None or len(rows) != len(event.texts):
            prompts = event.prompts or ("",) * len(event.texts)
            rows = self.by_rank[event.rank] = [StreamedRow(prompt) for prompt in prompts]
        for row, piece in zip(rows, event.texts, strict=False):
            row.text += piece
            row.done = event.done

    def rows(self) -> list[StreamedRow]:
        """The rows the panels show: the lowest rank's (every rank generates alike)."""
        if not self.by_rank:
            return []
        rank = min(self.by_rank, key=lambda r: (r is None, r or 0))
        return [StreamedRow(row.prompt, row.text, row.done) for row in self.by_rank[rank]]


# -- LiveMetrics: the metrics snapshots, per process --

def snapshot_ranks(event: Any) -> list[int]:
    """The ranks whose work a `MetricsSnapshot`'s counters hold: every rank thread of the
    sending process when `report` said so (`data["process"]["ranks"]`), else the sender."""
    process = (getattr(event, "data", None) or {}).get("process") or {}
    ranks = [rank for rank in process.get("ranks") or () if rank is not None]
    if ranks:
        return sorted(ranks)
    return [] if event.rank is None else [event.rank]


def _source(event: Any) -> tuple:
    """Which process a snapshot describes: its pid when known, else its rank."""
    process = (getattr(event, "data", None) or {}).get("process") or {}
    pid = getattr(event, "pid", None) or process.get("pid")
    return ("pid", pid) if pid is not None else ("rank", event.rank)


class LiveMetrics:
    """Keeps the `MetricsSnapshot` events of a launch and summarizes them per process.

    Workers send cumulative snapshots of their process's counters (counters start at zero in
    a fresh worker), so the latest one describes the whole run so far; the first one taken
    past the warm-up steps is kept to count the compiles that came after warm-up. The rank
    threads of one process share one set of counters, and any of them may send it: snapshots
    are grouped by process (`data["process"]["pid"]`, else by rank), and a reading that
    arrives after a newer one of the same process is ignored.
    """

    def __init__(self, warmup_steps: int = WARMUP_STEPS) -> None:
        self.warmup_steps = warmup_steps
        self._latest: dict[Any, Any] = {}
        self._warm: dict[Any, Any] = {}
        self._traces: dict[Any, TraceLog] = {}
        # Per process: (step, compiles so far) of each snapshot, and the spans of steps in
        # which the compile count grew (`compiled_spans`).
        self._compile_counts: dict[Any, tuple[int, int]] = {}
        self._compiled: dict[Any, list[tuple[int, int]]] = {}

    def add(self, event: Any) -> None:
        """Add a `MetricsSnapshot` event (anything with rank, step, data, memory), or a
        `Compiled` event (torch_xla's analysis of the process's compilations)."""
        key = _source(event)
        if isinstance(event, Compiled):
            trace = self._traces.setdefault(key, TraceLog())
            trace.add(event.records)
            trace.executions = tuple(event.executions)
            if event.device:
                trace.device_memory = event.device.get("memory")
                trace.device_name = event.device.get("name")
            return
        old = self._latest.get(key)
        new_time, old_time = getattr(event, "time", None), getattr(old, "time", None)
        if old is None or new_time is None or old_time is None or new_time >= old_time:
            self._latest[key] = event
        if key not in self._warm and event.step is not None and event.step > self.warmup_steps:
            self._warm[key] = event
        self._note_compiles(key, event)

    def _note_compiles(self, key: Any, event: Any) -> None:
        """Keep the span of steps since the previous snapshot when compiles were added."""
        step = event.step
        if step is None:
            return
        count = compile_count(event.data or {})
        before_step, before = self._compile_counts.get(key, (0, 0))
        if step < before_step:
            return  # a reading older than one already kept
        if count > before:
            self._compiled.setdefault(key, []).append((before_step, step))
        self._compile_counts[key] = (step, max(count, before))

    def compiled_spans(self, rank: Any = None) -> list[tuple[int, int]]:
        """`(after, upto)`: the spans of steps (`after + 1` to `upto`) in which the process
        that runs `rank` compiled, as its snapshots' compile counts show (steps of its main
        bar, the one `report` counts)."""
        key = self._find(rank)
        return list(self._compiled.get(key, [])) if key is not None else []

    def _sources(self) -> list:
        """Process keys, the one holding the lowest rank first."""
        def order(key):
            ranks = snapshot_ranks(self._latest[key])
            return (not ranks, ranks[0] if ranks else 0)

        return sorted(self._latest, key=order)

    def _find(self, rank: Any) -> Any:
        sources = self._sources()
        if not sources:
            return None
        for key in sources:
            if rank is not None and rank in snapshot_ranks(self._latest[key]):
                return key
        return sources[0]

    def ranks(self) -> list:
        """For each process that sent snapshots, its lowest rank; lowest first."""
        result = []
        for key in self._sources():
            ranks = snapshot_ranks(self._latest[key])
            result.append(ranks[0] if ranks else self._latest[key].rank)
        return result

    def process_ranks(self, rank: Any = None) -> list[int]:
        """The ranks whose work `summary(rank)` counts (several for rank threads of one
        process), lowest first."""
        key = self._find(rank)
        return [] if key is None else snapshot_ranks(self._latest[key])

    def summary(self, rank: Any = None) -> XlaSummary | None:
        """The summary of the process that runs `rank` (default: the one with the lowest rank)."""
        key = self._find(rank)
        if key is None:
            return None
        return self._summary(key)

    def _summary(self, key: Any) -> XlaSummary:
        event = self._latest[key]
        warm = self._warm.get(key)
        if warm is not None and (warm is event or warm.step is None or event.step is None
                                 or warm.step >= event.step):
            warm = None
        summary = summarize(
            event.data,
            steps=event.step or None,
            memory=getattr(event, "memory", None),
            warmup=warm.data if warm is not None else None,
            warmup_step=warm.step if warm is not None else None,
        )
        summary.trace = self._traces.get(key)
        return summary

    def alerts(self) -> list[Alert]:
        """Alerts from every process's latest snapshot, without repeats."""
        seen, alerts = set(), []
        for key in self._sources():
            summary = self._summary(key)
            for alert in analyze(summary, warmup_steps=self.warmup_steps):
                if alert.code not in seen:
                    seen.add(alert.code)
                    alerts.append(alert)
        return alerts


# -- each rank's final XLA figures --

@dataclass
class RankMetrics(XlaCounts):
    """What XLA did for one rank, as of the launch's last metrics snapshot: its process's
    `XlaCounts`, and the rank's own figures.

    Attributes:
        shared_with: the ranks whose work these counters hold (torch_xla counts per process;
            rank threads of one process, as in replicated mode on the CPU, share them).
        steps: the step the counters were read at (for `predict`, which reports no step,
            the batches its bar counts, as the panel says them).
        compiles, cached_compiles: graphs compiled, and compilations found in the cache.
        compile_seconds: time spent compiling.
        executions, execute_seconds: graph executions and their time.
        transfers_from_device, transfer_from_device_seconds, bytes_from_device: device-to-host
            copies (bytes None where torch_xla does not count them).
        transfers_to_device, transfer_to_device_seconds, bytes_to_device: host-to-device.
        item_calls: `.item()` calls (each one a device-to-host transfer inside the step).
        fallbacks: CPU fallback operations and their counts.
        step_times: `(step, seconds per step)` for each progress update of the rank's first
            bar: the mean over the steps since the previous update.
        alerts: the alerts of the final panel, as dicts (code, severity, title, explanation,
            fix).
        largest_graph_bytes: what the compiled graph that needs the most device memory
            needs (XLA's post-compilation analysis: inputs, outputs not aliased,
            temporaries, the program); None when the launch was not traced.
    """

    shared_with: list[int] = field(default_factory=list)
    step_times: list[tuple[int, float]] = field(default_factory=list)
    alerts: list[dict[str, str]] = field(default_factory=list)
    largest_graph_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every figure as a plain dict (lists and dicts copied)."""
        return asdict(self)


# The figures a rank's metrics copy from its process's summary.
_SHARED = tuple(f.name for f in fields(XlaCounts))


def rank_metrics(summary: XlaSummary, ranks: list[int], step_times: list[tuple[int, float]],
                 warmup_steps: int) -> RankMetrics:
    """One rank's figures: those of `summary` (its process's), with its step times and the
    final panel's alerts.

    Args:
        summary: the summary of the process that ran the rank.
        ranks: the ranks whose work the summary counts.
        step_times: the rank's `(step, seconds per step)` (see `RankMetrics.step_times`).
        warmup_steps: the steps the alerts count as warm-up.
    """
    figures = {name: getattr(summary, name) for name in _SHARED}
    figures["fallbacks"] = dict(summary.fallbacks)
    figures["steps"] = summary.counted()[0]  # what the panel counts: predict's batches
    largest = summary.trace.largest() if summary.trace is not None else None
    return RankMetrics(
        shared_with=list(ranks),
        step_times=list(step_times),
        alerts=[asdict(alert) for alert in analyze(summary, warmup_steps=warmup_steps)],
        largest_graph_bytes=largest.memory if largest is not None else None,
        **figures,
    )


def dataframe(rows: list[dict[str, Any]]) -> Any:
    """`rows` as a pandas DataFrame (pandas is imported here, only when asked for)."""
    try:
        import pandas
    except ImportError as error:  # pragma: no cover - pandas comes with datasets
        raise ImportError("to_dataframe() needs pandas: pip install pandas") from error
    return pandas.DataFrame(rows)


# -- LaunchReader: every event applied once --

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
                self.bars[key] = BarTrack(event.label, event.rank, total=event.total,
                                          starts=event.starts)
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
