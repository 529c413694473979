"""What the launch panels show, and what every panel shares: data and styles, no drawing here.

The events of a launch are applied once, by `observe.reader.LaunchReader`, to the launch's
record, its bars and its metrics. `LaunchState` computes from those a `LaunchView`: plain data
(bars, status, metrics summary, alerts) that every renderer draws the same way. So the panel
shows what the record says, and the two cannot disagree. A bar as the panels draw it
(`BarView`) takes its rates, ETAs and elapsed times from `observe.reader.bar_clock`, once, so
renderers only format.

What every panel shares, below the panels that use it:

- Units for people: durations, clock times, rates, sizes and values, each as a short string.
- XLA sharding specs in words: `{devices=[4,1]0,1,2,3}` reads "sharded 4 ways on dim 0".
  torch_xla names a tensor's SPMD layout with XLA's `HloSharding` text: the tile assignment's
  shape, one entry per tensor dimension (how many pieces that dimension is cut into), then the
  devices, listed (`0,1,2,3`) or as an iota (`<=[4]`, `<=[2,2]T(1,0)`). With
  `last_tile_dim_replicate`, or `last_tile_dims={replicated}`, the last entries are not tensor
  dimensions but how many devices hold each piece. The data keeps the spec as XLA wrote it.
- The panels' one look: the box, the heading, the tables, the colours, and the alignment of
  their text forms, so every panel reads as one family. Styles are inline: a panel is drawn
  inside a widget while the launch runs and as a notebook's rendered HTML once it ended, where
  JupyterLab styles tables; every table, row and cell states its own style, so both places lay
  it out the same. Colours are JupyterLab's theme variables (`--jp-*`), each with a mid-tone
  fallback for pages without them (Colab, VS Code, nbconvert). A colour is written twice, the
  plain fallback first: a sanitizer that drops `var()` (an untrusted notebook) keeps it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from html import escape

from .._words import data_size, duration, series
from ..events import Event
from ..observe.alerts import Alert
from ..observe.metrics import XlaSummary
from ..observe.reader import (
    BarTrack,
    LaunchReader,
    StreamedRow,
    bar_clock,
    bar_state,
    seconds_per_step,
    steady_step_time,
)
from ..states import BarState, BaseLaunchRecord, BaseRankRecord, Outcome, PanelState, RankState

# -- one progress bar as the panels draw it --

# Points kept per bar for the charts.
HISTORY = 200


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
    # `(losses before it, eval_loss)` of each evaluation during training (`BarTrack`), counted
    # within `losses`.
    evaluations: list[tuple[int, float]] = field(default_factory=list)
    ranks: int = 1  # how many ranks this bar stands for
    show_rank: bool = True  # False in a one-rank launch: "[rank 0]" would say nothing
    first_step: int | None = None  # the first step reported (0: counted from 0)
    rank_name: str | None = None  # "host 1 rank 2" in a launch over several hosts
    compiling: bool = False  # its first step still runs (see `observe.reader.BarClock`)
    rate_over: str | None = None  # "steady" (after the warm-up) or "whole"; None: no rate
    per_step: bool = False  # its rate reads as seconds per step (`seconds_per_step`)
    waiting: bool = False  # announced, not started (the evaluation while training runs)
    starts: str | None = None  # when a waiting bar starts, in words (`Progress.starts`)
    ended: str | None = None  # why it ended before its total (`Progress.ended`)
    # Once it ended: the median wall time per step over the steps that compiled nothing
    # (`observe.reader.steady_step_time`), what its chart says instead of the last step's.
    steady_step_time: float | None = None

    @property
    def name(self) -> str:
        """The bar's caption: its label, with the rank when bars are per rank of several."""
        if self.rank is None:
            return self.label if self.ranks == 1 else f"{self.label} ({self.ranks} ranks)"
        who = self.rank_name or f"rank {self.rank}"
        return f"{self.label} [{who}]" if self.show_rank else self.label

    @property
    def fraction(self) -> float | None:
        """Done fraction in [0, 1], or None without a total."""
        if not self.total:
            return None
        return min(max(self.step / self.total, 0.0), 1.0)


def bar_view(bar: BarTrack, now: float, rank: RankState, show_rank: bool,
             rank_name: str | None, compiled: list[tuple[int, int]] | None = None) -> BarView:
    """`bar` as drawn at `now`: its time and rates as `observe.reader.bar_clock` reads them
    (the mean over its steps after the warm-up; the whole bar's for one too short for it).

    Args:
        bar: the reader's bar.
        now: the wall time the panel is drawn for (the launch's end once it ended).
        rank: the state of the bar's rank.
        show_rank: whether its caption names the rank (a launch of several ranks).
        rank_name: "host 1 rank 2" where "rank R" is not enough, else None.
        compiled: the spans of steps in which its process compiled
            (`LiveMetrics.compiled_spans`), left out of an ended bar's wall time per step.
    """
    state = bar_state(bar, rank)
    running = state == BarState.RUNNING
    dropped = max(len(bar.losses) - HISTORY, 0)  # losses older than the chart's history
    clock = bar_clock(bar, now, running=running)
    steady = None
    if not running and not bar.waiting:
        steady = steady_step_time(bar.step_times, compiled or [], bar.origin or 0)
    return BarView(
        label=bar.label, rank=bar.rank, step=bar.step, total=bar.total, elapsed=clock.elapsed,
        eta=clock.eta, rate=clock.rate, samples_rate=clock.samples_rate,
        values=dict(bar.values), losses=bar.losses[-HISTORY:],
        evaluations=[(before - dropped, loss) for before, loss in bar.evaluations
                     if before > dropped],
        step_times=[seconds for _, seconds in bar.step_times[-HISTORY:]],
        state=state, show_rank=show_rank, first_step=bar.first_step, rank_name=rank_name,
        compiling=clock.compiling, rate_over=clock.over, per_step=clock.per_step,
        waiting=bar.waiting, starts=bar.starts, ended=bar.ended, steady_step_time=steady,
    )


def short_bar_note(bar: BarView) -> str | None:
    """Why a bar of a finished launch stopped before its total, when it did."""
    if bar.state != BarState.SHORT or not bar.total:
        return None
    if bar.first_step == 0 and bar.step == bar.total - 1:
        return (f"{bar.name} stopped at {bar.step}/{bar.total}: its steps count from 0. "
                "Report the steps done, step=i + 1 (or enumerate(loader, start=1)).")
    return (f"{bar.name} stopped at {bar.step}/{bar.total}: the function returned before "
            "the total it reported.")


def aggregate(bars: list[BarView]) -> list[BarView]:
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
            evaluations=first.evaluations,
            step_times=first.step_times,
            state=state,
            ranks=len(group),
            first_step=min((b.first_step for b in group if b.first_step is not None),
                           default=None),
            compiling=slowest.compiling,  # the merged bar's step is the slowest rank's
            rate_over=next((b.rate_over for b in group if b.rate_over is not None), None),
            # The lowest rank's unit, whichever rank is slowest: one bar, one unit for the run.
            per_step=next((b.per_step for b in group if b.rate is not None), first.per_step),
            waiting=all(b.waiting for b in group),
            starts=first.starts,
            ended=first.ended,
            steady_step_time=first.steady_step_time,  # the chart's, which is the first's
        ))
    return merged


def evaluations_on_their_row(bars: list[BarView]) -> list[BarView]:
    """The latest evaluation's metrics (`eval_*`, sent as values of the training bar) drawn on
    the evaluation bar's row where there is one: at the end of the training bar's long line,
    after its rates and loss, they were cut off at 1024 px. Each rank's bars apart."""
    rows = {(bar.rank, bar.label): bar for bar in bars}
    moved: dict[tuple[int | None, str], dict[str, float]] = {}
    for bar in bars:
        found = {name: value for name, value in bar.values.items() if name.startswith("eval_")}
        if bar.label == "train" and found and (bar.rank, "eval") in rows:
            moved[bar.rank, "train"] = {name: value for name, value in bar.values.items()
                                        if name not in found}
            moved[bar.rank, "eval"] = {**rows[bar.rank, "eval"].values, **found}
    return [replace(bar, values=moved[bar.rank, bar.label]) if (bar.rank, bar.label) in moved
            else bar for bar in bars]


# -- LaunchState: the launch's view --

__all__ = ["BarView", "LaunchState", "LaunchView", "short_bar_note", "duration", "number", "score",
           "size", "rate", "clock"]

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
        bars = evaluations_on_their_row(bars)
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


# -- units for people --

def number(value: float) -> str:
    """A value to show, in at most 6 characters (a sign aside): up to 4 significant digits
    (`0.4213`, `12.35`, `0.0014`), or 2 in short scientific form for very small or large
    values (`1.7e-4`, `2.5e6`)."""
    if value == 0:
        return "0"
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    if 1e-3 <= abs(value) < 1e5:
        for digits in (4, 3, 2):
            text = f"{value:.{digits}g}"
            if "e" not in text and len(text.lstrip("-")) <= 6:
                return text
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exponent)}"


def score(value: float) -> str:
    """A score or metric in a table (predictions' scores, the evaluation's metrics): the one
    rounding rule of hfxla_nb's tables, 4 decimals (`0.9877`, `0.5000`, `12.3457`), one for
    1000 and more (`1,234.5`), so a column of them lines up."""
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.1f}"


def size(count: int | None) -> str:
    """Bytes in B, KiB, MiB, GiB; 'n/a' for None (`_words.data_size`, as the alerts say it)."""
    return data_size(count)


def rate(value: float | None, unit: str, per_step: bool | None = None) -> str:
    """`12.3 it/s`, `1,030 samples/s` (whole, with a thousands comma, from 1000 on), or
    `1.20 s/it` for slow steps.

    Args:
        value: per second.
        unit: what is counted ("it": steps, which may read per step; "samples").
        per_step: for steps, the unit the bar chose (`BarView.per_step`); None: the same rule
            (`observe.reader.seconds_per_step`) for this value alone. The choice is never made
            here, so a bar keeps one unit for its whole run.
    """
    if value is None or value <= 0:
        return f"? {unit}/s"
    if unit == "it" and (seconds_per_step(value) if per_step is None else per_step):
        return f"{1 / value:.2f} s/{unit}"
    if value >= 999.5:  # 3 significant digits would read `1.03e+03`
        return f"{value:,.0f} {unit}/s"
    return f"{value:.3g} {unit}/s"


def clock(seconds: float | None) -> str:
    """A bar's time, short: `850 ms`, `12.0 s`, then `1:05` (min:s) and `1:02:05`."""
    if seconds is None or seconds < 59.95:
        return duration(seconds)
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}:{secs:02d}"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


# -- XLA sharding specs in words --

_TILED = re.compile(r"^\{devices=\[(?P<shape>\d+(?:,\d+)*)\](?P<devices>\S+)(?P<rest>.*)\}$")
_MAXIMAL = re.compile(r"^\{maximal device=(?P<device>\d+)\}$")
_SUBGROUPS = re.compile(r"last_tile_dims=\{(?P<kinds>[^}]*)\}")
_METADATA = re.compile(r"metadata=\{.*\}")


def sharding_words(spec: str, axis: str | None = None) -> str:
    """A sharding spec as people say it.

    Args:
        spec: XLA's text of a sharding (`{replicated}`, `{devices=[4,1]0,1,2,3}`, ...).
        axis: the mesh axis a single cut dimension lies on, when the mesh is known to have one
            axis of more than one device (hfxla_nb's `(devices, 1)` meshes: "fsdp", "data");
            None: the dimension is named instead.

    Returns:
        `replicated`, `sharded 4 ways on dim 0` (`on fsdp` with `axis`; `on fsdp (dim 1)` for
        another dimension), `sharded 2x2 (dims 0 and 1)`, `sharded 2 ways on dim 0, each
        shard on 2 devices`, `on device 0 only`; a spec of another form (manual, a tuple of
        shardings) as it is.

    Example:
        `sharding_words("{devices=[4,1]0,1,2,3}", axis="fsdp")` is `sharded 4 ways on fsdp`.
    """
    text = spec.strip()
    if text == "{replicated}":
        return "replicated"
    maximal = _MAXIMAL.match(text)
    if maximal:
        return f"on device {maximal['device']} only"
    tiled = _TILED.match(text)
    cuts = _cuts(tiled) if tiled else None
    if cuts is None:
        return spec
    shape, copies = cuts
    split = [(dim, ways) for dim, ways in enumerate(shape) if ways > 1]
    if not split:
        return "replicated"
    if len(split) == 1:
        dim, ways = split[0]
        # On a named axis, the first dimension goes unsaid: it is the one FSDPv2 cuts.
        where = f"dim {dim}" if not axis else axis if dim == 0 else f"{axis} (dim {dim})"
        words = f"sharded {ways} ways on {where}"
    else:
        words = (f"sharded {'x'.join(str(ways) for _, ways in split)} "
                 f"(dims {series([dim for dim, _ in split])})")
    return words + (f", each shard on {copies} devices" if copies > 1 else "")


def _cuts(tiled: re.Match) -> tuple[list[int], int] | None:
    """(pieces per tensor dimension, devices holding each piece) of a tiled spec; None for a
    form not read here (manual subgroups, unknown words after the devices)."""
    shape = [int(ways) for ways in tiled["shape"].split(",")]
    rest = _METADATA.sub("", tiled["rest"]).strip()
    copies = 1
    if rest == "last_tile_dim_replicate":
        copies = shape.pop()
    elif rest:
        subgroups = _SUBGROUPS.fullmatch(rest)
        kinds = [kind.strip() for kind in subgroups["kinds"].split(",")] if subgroups else []
        if not kinds or set(kinds) != {"replicated"} or len(kinds) > len(shape):
            return None
        copies = math.prod(shape[-len(kinds):])
        shape = shape[:-len(kinds)]
    return shape, copies


# -- the panels' one look --

# -- colours -------------------------------------------------------------------------------------

# Mid-tone colours, readable on light and dark backgrounds: the fallbacks of the theme's own.
BLUE, GREY, GREEN, AMBER, RED = "#1f77b4", "#7f7f7f", "#2ca02c", "#e6a700", "#d62728"
PURPLE = "#9467bd"  # the step-time chart's line: JupyterLab has no colour of that meaning
TEAL = "#17becf"  # the evaluation loss's dots on the loss chart: no JupyterLab meaning either
# JupyterLab's theme colour of each meaning (its light and dark themes define them).
THEME = {
    BLUE: "--jp-brand-color1",
    GREEN: "--jp-success-color1",
    RED: "--jp-error-color1",
    AMBER: "--jp-warn-color1",
    GREY: "--jp-ui-font-color2",
}
# A fill under white text (the runtime panel's badges): the darker tone of each meaning.
STRONG = {
    BLUE: ("--jp-brand-color0", "#1565c0"),
    GREEN: ("--jp-success-color0", "#2e7d32"),
    RED: ("--jp-error-color0", "#c62828"),
    AMBER: ("--jp-warn-color0", "#e65100"),
}
# Every colour a panel may write: the fallbacks of the theme's colours, and the SVG lines.
PALETTE = frozenset({BLUE, GREY, GREEN, AMBER, RED, PURPLE,
                     *(fallback for _, fallback in STRONG.values())})
# Borders and grey fills: translucent grey shows on any background.
BORDER_GREY = "rgba(128,128,128,.5)"
TRACK_GREY = "rgba(128,128,128,0.25)"


def themed(prop: str, color: str, variable: str | None = None, value: str = "{}") -> str:
    """A CSS declaration in a colour, twice: the plain colour, then the theme's variable with
    the colour as its fallback.

    Args:
        prop: the CSS property (`color`, `background`, `border-left-color`, `border`).
        color: the fallback colour (a `PALETTE` colour, or a grey such as `BORDER_GREY`).
        variable: the theme variable; None: `THEME`'s for `color` (the plain colour alone when
            it has none).
        value: the declaration's value, `{}` standing for the colour (`1px solid {}`).

    Example:
        `themed("color", RED)` is `color:#d62728;color:var(--jp-error-color1,#d62728);`.
    """
    variable = variable or THEME.get(color)
    plain = f"{prop}:{value.format(color)};"
    if not variable:
        return plain
    return plain + f"{prop}:{value.format(f'var({variable},{color})')};"


def strong_fill(color: str) -> str:
    """A background in the darker tone of `color`'s meaning (`STRONG`), for white text."""
    variable, fallback = STRONG[color]
    return themed("background", fallback, variable)


def text_color(color: str) -> str:
    """CSS for text in `color`: JupyterLab's theme colour of the same meaning when the page has
    one (readable on its light and dark themes), else `color` itself."""
    return themed("color", color)


# Secondary text: JupyterLab's secondary text colour, a mid grey where it has none.
MUTED = text_color(GREY)
# Small secondary text under a table or beside a chart (footers, scales).
SMALL = "font-size:11px;line-height:1.2;" + MUTED
# The empty part of a progress bar.
TRACK = f"var(--jp-layout-color3,{TRACK_GREY})"

# -- the box -------------------------------------------------------------------------------------

# The panels' text: JupyterLab's interface font (a sans-serif elsewhere), at one size.
FONT = "font-family:var(--jp-ui-font-family,sans-serif);font-size:13px;"
# A part of a panel (a line, the bars, a chart): the font and the line height, no box.
TEXT = FONT + "line-height:1.4;"
# The panel's border, the same on every panel (the plain grey first: see the module's doc).
BORDER = f"1px solid var(--jp-border-color2, {BORDER_GREY})"
PADDING = "6px 10px"
# The outer element of every panel: border, radius, padding, font and text colour.
BOX = (TEXT + "color:var(--jp-content-font-color1,currentColor);"
       + f"border:1px solid {BORDER_GREY};border:{BORDER};"
       + f"border-radius:4px;padding:{PADDING};margin:0;")
# A panel's heading: one element, one size and weight, in every panel.
HEADING = "font-weight:600;font-size:13px;"


def panel(body: str, cls: str) -> str:
    """A whole panel: `body` in the one box.

    Args:
        body: the panel's HTML.
        cls: its class (`hfxla-launch`, `hfxla-nb-runtime`, ...): what tests and pages find
            it by.
    """
    return f'<div class="{cls}" style="{BOX}">{body}</div>'


def heading(text: str) -> str:
    """A panel's heading (`text` is HTML: escape words before)."""
    return f'<b style="{HEADING}">{text}</b>'


def badge(text: str, color: str) -> str:
    """A status badge beside a heading: `text` (words) in white on the darker tone of
    `color`'s meaning, readable on light and dark themes."""
    return (f'<span style="{strong_fill(color)}color:#fff;border-radius:3px;'
            f'padding:1px 6px;font-size:0.85em;font-weight:600">{escape(text)}</span>')


# -- tables --------------------------------------------------------------------------------------

TABLE = ("border-collapse:collapse;border:none;margin:2px 0;table-layout:auto;"
         "font-size:13px;color:inherit;")
TR = "background:transparent;border:none;"
_CELL = ("vertical-align:top;line-height:1.4;border:none;max-width:none;"
         "background:transparent;padding:1px 12px 1px 0;")
# A cell of text: it may wrap.
TD = _CELL + "text-align:left;white-space:normal;"
# A row's label ("compile cache", "device → host"): never wraps, so its column keeps its width.
LABEL = _CELL + "text-align:left;white-space:nowrap;font-weight:600;"
# A name inside a value (a metric's, an entity type's): never wraps, in the text's weight.
NAME = _CELL + "text-align:left;white-space:nowrap;"
# A number: right-aligned, every digit the same width, so a column of them lines up.
NUMBER = _CELL + "text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums;"
# A column's header: a label, aligned as its column is.
HEAD = LABEL
HEAD_NUMBER = NUMBER + "font-weight:600;"


def cell(content: str, style: str = TD, tag: str = "td", title: str | None = None) -> str:
    """One cell: `content` (HTML) in `tag` with `style`; `title` (words) as its tooltip."""
    tip = f' title="{escape(title)}"' if title else ""
    return f'<{tag} style="{style}"{tip}>{content}</{tag}>'


def row(cells: Iterable[str]) -> str:
    """A table row of `cells` (made by `cell`)."""
    return f'<tr style="{TR}">{"".join(cells)}</tr>'


def table(rows: Iterable[str], head: str = "") -> str:
    """A table of `rows` (made by `row`), `head` (a row) as its header."""
    header = f"<thead>{head}</thead>" if head else ""
    return f'<table style="{TABLE}">{header}<tbody>{"".join(rows)}</tbody></table>'


def label_row(label: str, value: str, title: str | None = None, tag: str = "th") -> str:
    """A row of a label (words, in a `tag` cell) and its value (HTML), `title` as the value's
    tooltip."""
    return row([cell(escape(label), LABEL, tag), cell(value, title=title)])


# -- text forms ----------------------------------------------------------------------------------


def aligned_lines(grid: list[list[str]], right: list[bool]) -> list[str]:
    """A text table's lines: each column padded to its widest cell, left-aligned or (where
    `right` says so: numbers) right-aligned, two spaces between columns, no trailing space.

    Args:
        grid: the rows of cells, a header row first where there is one.
        right: for each column, whether it aligns right.
    """
    widths = [max(len(line[i]) for line in grid) for i in range(len(right))]
    return ["  ".join(text.rjust(width) if align else text.ljust(width)
                      for text, width, align in zip(line, widths, right, strict=True)).rstrip()
            for line in grid]
