"""One progress bar as the panels draw it (`BarView`), made from the launch reader's bar.

Rates, ETAs and elapsed times come from `observe.bars.bar_clock`, once, so renderers only
format.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..observe.bars import BarTrack, bar_clock, bar_state, steady_step_time
from ..states import BarState, RankState

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
    ranks: int = 1  # how many ranks this bar stands for
    show_rank: bool = True  # False in a one-rank launch: "[rank 0]" would say nothing
    first_step: int | None = None  # the first step reported (0: counted from 0)
    rank_name: str | None = None  # "host 1 rank 2" in a launch over several hosts
    compiling: bool = False  # its first step still runs (see `observe.bars.BarClock`)
    rate_over: str | None = None  # "steady" (after the warm-up) or "whole"; None: no rate
    per_step: bool = False  # its rate reads as seconds per step (`seconds_per_step`)
    waiting: bool = False  # announced, not started (the evaluation while training runs)
    # Once it ended: the median wall time per step over the steps that compiled nothing
    # (`observe.bars.steady_step_time`), what its chart says instead of the last step's.
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
    """`bar` as drawn at `now`: its time and rates as `observe.bars.bar_clock` reads them
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
    clock = bar_clock(bar, now, running=running)
    steady = None
    if not running and not bar.waiting:
        steady = steady_step_time(bar.step_times, compiled or [], bar.origin or 0)
    return BarView(
        label=bar.label, rank=bar.rank, step=bar.step, total=bar.total, elapsed=clock.elapsed,
        eta=clock.eta, rate=clock.rate, samples_rate=clock.samples_rate,
        values=dict(bar.values), losses=bar.losses[-HISTORY:],
        step_times=[seconds for _, seconds in bar.step_times[-HISTORY:]],
        state=state, show_rank=show_rank, first_step=bar.first_step, rank_name=rank_name,
        compiling=clock.compiling, rate_over=clock.over, per_step=clock.per_step,
        waiting=bar.waiting, steady_step_time=steady,
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
            steady_step_time=first.steady_step_time,  # the chart's, which is the first's
        ))
    return merged
