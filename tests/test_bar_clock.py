"""A live bar's clock and rate: one clock per bar, never rewound by a late value; rates and
ETA over the steps after the warm-up, as `fine_tune`'s result counts them; the compiling first
step said as such; one unit for the whole run.

The event sequences are the ones that showed each defect: a
`fine_tune` run whose logging points' losses arrive from the fetcher's thread after the loop
reported later steps, a first step that compiles for 19 s, then steady steps.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from hfxla_nb.events import Event, Finished, Progress, Started
from hfxla_nb.observe import reader
from hfxla_nb.train.worker import loop
from hfxla_nb.ui import html, text
from hfxla_nb.ui import state as units
from hfxla_nb.ui.state import BarView, LaunchState
from tests.helpers import T0, Clock

ROWS = 32  # samples per step
STEPS = 60



def fine_tune_events(step_seconds: tuple[float, ...] = (0.33, 0.41), compile_seconds=19.0,
                     warm_up=(2.0, 0.8), log_every=5, steps=STEPS
                     ) -> tuple[list[tuple[float, Event]], dict[int, float]]:
    """What a `fine_tune` run sends, as `(arrival time, event)` in the order events arrive,
    and when each step ended.

    As `train/worker/loop.py` sends them: a step-0 event when the loop starts; a report when
    a step ends, at most every `BAR_INTERVAL` seconds, and at the last step; each logging
    point's loss fetched on the fetcher's thread once the next step ran, so it arrives after
    reports of later steps, with a later time (marked `late`).
    """
    sent: list[tuple[float, Event]] = [(T0 - 10.0, Started(0, 1, 100))]  # the model loads
    sent.append((T0, Progress(0, 0, steps, {}, 0, "train", time=T0)))
    at, last_report, ended = T0, float("-inf"), {}
    for done in range(1, steps + 1):
        if done == 1:
            at += compile_seconds
        elif done <= len(warm_up) + 1:
            at += warm_up[done - 2]
        else:
            at += step_seconds[done % len(step_seconds)]
        ended[done] = at
        if done == steps or at - last_report >= loop.BAR_INTERVAL:
            last_report = at
            sent.append((at, Progress(0, done, steps, {}, done * ROWS, "train", time=at)))
        if done % log_every == 0 or done == steps:
            fetched = at + step_seconds[0] + 0.2  # after the next step's execution
            sent.append((fetched, Progress(0, done, steps, {"loss": 1 / done}, done * ROWS,
                                           "train", time=fetched, late=True)))
    sent.sort(key=lambda pair: pair[0])  # stable: what is sent first arrives first
    return sent, ended


def replay(sent: list[tuple[float, Event]]) -> tuple[LaunchState, list[BarView]]:
    """The panel fed `sent`, drawn at each arrival and halfway to the next one (the panel
    also redraws on a timer); its bar at each draw."""
    clock = Clock()
    state = LaunchState(1, clock=clock)
    drawn = []
    for i, (at, event) in enumerate(sent):
        clock.now = at
        state.handle(event)
        moments = [at]
        if i + 1 < len(sent):
            moments.append((at + sent[i + 1][0]) / 2)
        for moment in moments:
            clock.now = moment
            drawn.extend(state.view().bars)
    return state, drawn


def steady_samples_per_second(ended: dict[int, float]) -> float:
    """The result's `samples_per_second`, computed as `TrainingLoop._steady_figures` does:
    the steps after `STEADY_AFTER_STEPS`, over the time from then to the training's end."""
    start, last = loop.STEADY_AFTER_STEPS, max(ended)
    return (last - start) * ROWS / (ended[last] - ended[start])


def finished(state: LaunchState) -> BarView:
    state.handle(Finished(0, None))
    state.close(None)
    (bar,) = state.view().bars
    return bar


# -- the clock never runs backwards -----------------------------------------------------------


def test_late_losses_from_the_fetcher_never_rewind_the_clock():
    sent, ended = fine_tune_events()
    # The sequence is the one that reset the clock: a loss for an earlier step, sent later.
    reported = {}
    late_after_later_steps = 0
    for _, event in sent:
        if isinstance(event, Progress) and event.late:
            later = [step for step in reported if step > event.step]
            late_after_later_steps += any(reported[step] < event.time for step in later)
        elif isinstance(event, Progress):
            reported[event.step] = event.time
    assert late_after_later_steps >= 5
    state, drawn = replay(sent)
    elapsed = [bar.elapsed for bar in drawn]
    assert elapsed == sorted(elapsed), elapsed
    steps = [bar.step for bar in drawn]
    assert steps == sorted(steps)
    bar = finished(state)
    # The bar's clock spans the loop: the 19 s compile included, from its step-0 event.
    assert (bar.step, bar.state) == (STEPS, "done")
    assert bar.elapsed == pytest.approx(ended[STEPS] - T0)
    assert bar.values["loss"] == pytest.approx(1 / STEPS)  # the last late loss is kept
    assert len(bar.losses) == STEPS // 5


def test_a_late_value_keeps_the_bars_step_and_a_bar_that_counts_again_restarts():
    state = LaunchState(1, clock=Clock())
    for step in range(7):
        state.handle(Progress(0, step, STEPS, {}, time=T0 + 19.8 + step))
    # "6/60 · 19.8 s elapsed", then step 5's loss, fetched after step 6, later.
    state.handle(Progress(0, 5, STEPS, {"loss": 0.5}, time=T0 + 26.0, late=True))
    (bar,) = state.view().bars
    assert (bar.step, bar.values) == (6, {"loss": 0.5})
    assert bar.elapsed == pytest.approx(6.0)  # from its start, not from the late value
    # An `hx.report` bar that counts from the start again (the next epoch) still restarts.
    state.handle(Progress(0, 1, STEPS, {"loss": 0.4}, time=T0 + 40.0))
    (bar,) = state.view().bars
    assert (bar.step, bar.elapsed, bar.rate) == (1, 0.0, None)


# -- the bar's rate is the result's -----------------------------------------------------------


def test_the_final_rate_is_the_steady_rate_the_result_counts():
    sent, ended = fine_tune_events()
    state, _ = replay(sent)
    bar = finished(state)
    result = steady_samples_per_second(ended)  # about 87 samples/s
    assert bar.samples_rate == pytest.approx(result, rel=0.10)
    assert bar.rate == pytest.approx(result / ROWS, rel=0.10)
    # Not the whole loop's average, which the 19 s compile drags down to about half.
    overall = STEPS * ROWS / (ended[STEPS] - T0)
    assert bar.samples_rate > 1.5 * overall
    parts = text.timing_parts(bar)
    assert parts[-1].endswith(" samples/s after warm-up"), parts
    # While it ran, the rate shown was measured the same way: near the result already.
    live = [bar for bar in replay(sent)[1] if bar.state == "running" and bar.step >= 20]
    assert all(abs(bar.samples_rate - result) < 0.10 * result for bar in live)


def test_the_bars_warm_up_is_the_results():
    assert reader.BAR_WARMUP_STEPS == loop.STEADY_AFTER_STEPS


def test_the_loops_loss_event_is_marked_late(monkeypatch):
    # `TrainingLoop.log` runs on the fetcher's thread: its event is values, not progress.
    sent = []
    monkeypatch.setattr(loop._xla, "to_cpu", lambda tensors: [12.0])
    monkeypatch.setattr(loop, "emit", sent.append)
    training = object.__new__(loop.TrainingLoop)
    training.plan = SimpleNamespace(total_steps=60, rows_per_step=ROWS)
    training.logged, training.history, training._report_rank = (0, 0.0), [], 0
    training.log(10, object(), 1e-4)
    (event,) = sent
    assert (event.step, event.late, event.values) == (10, True, {"loss": 1.2, "lr": 1e-4})


# -- compiling, ETA, unit ----------------------------------------------------------------------


def test_the_first_step_says_it_is_compiling_until_it_ends():
    clock = Clock()
    state = LaunchState(1, clock=clock)
    state.handle(Started(0, 1, 100))
    state.handle(Progress(0, 0, STEPS, {}, 0, time=T0))
    for seconds in (0.0, 8.0, 19.9):
        clock.now = T0 + seconds
        (bar,) = state.view().bars
        assert text.timing_parts(bar) == [f"compiling the first step ({units.clock(seconds)} "
                                          "so far)"]
        line = text.bar_line(bar)
        assert "ETA" not in line and "it/s" not in line and "?" not in line
    assert f'title="{text.COMPILING_MEANS}"' in html.bars_html([bar]).replace("&#x27;", "'")
    state.handle(Progress(0, 1, STEPS, {}, ROWS, time=T0 + 20.0))
    clock.now = T0 + 20.0
    (bar,) = state.view().bars
    assert not bar.compiling and text.timing_parts(bar) == ["20.0 s elapsed"]
    # A bar whose first report already says a step is done never says so.
    other = LaunchState(1, clock=clock)
    other.handle(Progress(0, 1, STEPS, {}, time=T0 + 20.0))
    assert not other.view().bars[0].compiling


def test_no_eta_before_steady_steps_and_then_the_steady_one():
    sent, ended = fine_tune_events()
    _, drawn = replay(sent)
    running = [bar for bar in drawn if bar.state == "running"]
    warming = [bar for bar in running if bar.step <= reader.BAR_WARMUP_STEPS]
    assert warming and all(bar.eta is None and bar.rate is None for bar in warming)
    assert not any("ETA" in text.bar_line(bar) for bar in warming)
    # At step 6 about 20 s are left (54 steps of 0.37 s), not the 2:51 a rate with the
    # compile in it gave.
    (at_six, *_) = [bar for bar in running if bar.step >= 6]
    left = ended[STEPS] - ended[at_six.step]
    assert at_six.eta == pytest.approx(left, rel=0.15)
    assert all(bar.eta is not None for bar in running if bar.step >= 6)


def rate_units(drawn: list[BarView]) -> set[str]:
    """The units of the steps' rate in every drawn bar line."""
    found = set()
    for bar in drawn:
        found.update(re.findall(r"\d (it/s|s/it)", text.bar_line(bar)))
    return found


def test_the_unit_never_flips_within_a_run():
    # Steps of 1.07 s and 0.93 s: the rate goes a little below and up to 1 step per second.
    sent, _ = fine_tune_events(step_seconds=(1.07, 0.93), compile_seconds=5.0)
    _, drawn = replay(sent)
    rates = [bar.rate for bar in drawn if bar.rate is not None]
    # A rule of this rate alone would flip between "1.0 it/s" and "1.00 s/it".
    assert {units.rate(value, "it")[-4:] for value in rates} == {"it/s", "s/it"}
    assert len(rate_units(drawn)) == 1
    # Clearly slow or fast runs read in their own unit throughout.
    assert rate_units(replay(fine_tune_events(step_seconds=(2.0, 2.2))[0])[1]) == {"s/it"}
    assert rate_units(replay(fine_tune_events()[0])[1]) == {"it/s"}


def test_one_rule_with_hysteresis_decides_the_unit():
    rule = reader.seconds_per_step
    assert rule(0.99) and not rule(1.0)  # a first rate: seconds per step below 1 step/s
    assert rule(1.2, before=True) and not rule(1.25, before=True)
    assert not rule(0.85, before=False) and rule(0.79, before=False)
    assert units.rate(0.5, "it", per_step=True) == "2.00 s/it"
    assert units.rate(1.1, "it", per_step=True) == "0.91 s/it"
    assert units.rate(0.9, "it", per_step=False) == "0.9 it/s"


def test_a_rate_of_a_thousand_and_more_is_written_whole_not_in_scientific_form():
    # `f"{1025:.3g}"` is "1.03e+03": a long-figured bar showed "1.03e+03 samples/s".
    assert units.rate(1025.4, "samples") == "1,025 samples/s"
    assert units.rate(999.6, "samples") == "1,000 samples/s"
    assert units.rate(999.4, "samples") == "999 samples/s"
    assert units.rate(31.84, "it") == "31.8 it/s"


# -- the evaluation's bar, drawn from the start --------------------------------------------------


def test_a_waiting_evaluation_bar_says_when_it_runs():
    """An evaluation every N steps is not "after training" (`TrainerSettings.when_evaluating`
    says when, the announced bar shows it)."""
    from hfxla_nb.train.flow import TrainerSettings

    assert TrainerSettings(eval_strategy="steps", eval_steps=10).when_evaluating() == (
        "every 10 steps")
    assert TrainerSettings(eval_strategy="epoch").when_evaluating() == "each epoch"
    assert TrainerSettings().when_evaluating() == "after training"
    state = LaunchState(1, clock=Clock())
    state.handle(Progress(0, 0, STEPS, {}, 0, "train", time=T0))
    state.handle(Progress(0, 0, 4, label="eval", time=T0, waiting=True, starts="every 10 steps"))
    evaluation = state.view().bars[1]
    assert text.timing_parts(evaluation) == ["every 10 steps"]
    assert "after training" not in text.bar_line(evaluation)


def test_the_evaluation_bar_is_drawn_from_the_start_and_its_clock_starts_with_it():
    clock = Clock()
    state = LaunchState(1, clock=clock)
    state.handle(Progress(0, 0, STEPS, {}, 0, "train", time=T0))
    state.handle(Progress(0, 0, 4, label="eval", time=T0, waiting=True))
    clock.now = T0 + 30.0
    state.handle(Progress(0, 10, STEPS, {}, 10 * ROWS, "train", time=T0 + 30.0))
    train, evaluation = state.view().bars  # the same rows while training runs as after
    assert (train.label, evaluation.label) == ("train", "eval")
    assert (evaluation.step, evaluation.total, evaluation.elapsed) == (0, 4, 0.0)
    assert text.timing_parts(evaluation) == ["after training"]
    assert "after training" in text.bar_line(evaluation)
    # Its clock starts with the evaluation, 40 s after it was announced, not before.
    state.handle(Progress(0, STEPS, STEPS, {}, STEPS * ROWS, "train", time=T0 + 40.0))
    state.handle(Progress(0, 0, 4, label="eval", time=T0 + 40.0))
    clock.now = T0 + 41.0
    state.handle(Progress(0, 4, 4, label="eval", time=T0 + 41.0))
    bar = [bar for bar in state.view().bars if bar.label == "eval"][0]
    assert (bar.step, bar.state, bar.waiting) == (4, "done", False)
    assert bar.elapsed == pytest.approx(1.0)
    # A launch that failed before its evaluation says it did not run.
    failed = LaunchState(1, clock=Clock())
    failed.handle(Progress(0, 0, 4, label="eval", time=T0, waiting=True))
    failed.handle(Finished(0, None))
    failed.close(None)
    (bar,) = failed.view().bars
    assert text.timing_parts(bar) == ["not run"]



# -- the final wall time per step --------------------------------------------------------------


def growing_run() -> tuple[list[tuple[int, float]], list[tuple[int, int]]]:
    """A 40-step loop whose batch grows every 8 steps, as the panel recorded it: a step that
    compiled takes about 625 ms, the others about 256 ms; the metrics snapshots (every
    0.5 s, so every 2 steps) show compiles added in steps 1-2 and at each 8th step. The
    last step, 40, compiled."""
    compiling = {1, 2, 8, 16, 24, 32, 40}
    times = [(step, 0.625 if step in compiling else 0.256 + 0.001 * (step % 3))
             for step in range(2, 41)]  # the first update has no step time
    spans = [(0, 2)] + [(step - 2, step) for step in sorted(compiling) if step > 2]
    return times, spans


def test_the_final_wall_time_per_step_is_the_median_of_the_steps_that_did_not_compile():
    times, spans = growing_run()
    assert times[-1] == (40, 0.625)  # what the final chart used to say
    steady = [seconds for step, seconds in times if seconds < 0.6 and step > 4]
    assert reader.steady_step_time(times, spans, first_step=1) == sorted(steady)[len(steady) // 2]
    # Without snapshots, the median of the steps after the warm-up still is a steady step's.
    assert 0.256 <= reader.steady_step_time(times, [], first_step=1) <= 0.258
    # A run too short for any steady step: the median of what there is.
    assert reader.steady_step_time([(2, 0.6), (3, 0.2), (4, 0.3)], [(0, 4)]) == 0.3
    assert reader.steady_step_time([], []) is None


def test_the_final_chart_says_the_median_and_the_live_one_the_last_step():
    times, spans = growing_run()
    live = BarView("train", 0, 39, 40, 10.0, None, 3.9, None, {}, [0.5],
                   [seconds for _, seconds in times[:-1]], reader.BarState.RUNNING)
    assert text.step_time_label(live)[:2] == ("wall time per step", text.STEP_TIME_MEANS)
    ended = BarView("train", 0, 40, 40, 10.0, None, 3.9, None, {}, [0.5],
                    [seconds for _, seconds in times], reader.BarState.DONE,
                    steady_step_time=reader.steady_step_time(times, spans, 1))
    label, means, seconds = text.step_time_label(ended)
    assert label == "median wall time per step" and "compiled nothing" in means
    chart = html.chart_html([ended])
    assert "median wall time per step</span>" in chart and units.duration(seconds) in chart
    assert units.duration(0.625) not in chart


def test_the_steps_that_compiled_are_read_from_the_snapshots_compile_counts():
    from hfxla_nb.events import MetricsSnapshot
    from hfxla_nb.observe.reader import LiveMetrics

    live = LiveMetrics()
    for step, compiles in ((1, 1), (3, 2), (5, 2), (7, 2), (9, 3), (11, 3)):
        data = {"counters": {}, "metrics": {
            "CompileTime": {"count": compiles, "total": compiles * 1e9, "samples": []}}}
        live.add(MetricsSnapshot(0, step, data))
    assert live.compiled_spans(0) == [(0, 1), (1, 3), (7, 9)]


def test_a_bar_that_stopped_early_ends_done_where_it_stopped_and_says_so():
    """An early stop keeps the bar's total: `✔ 14/60 · stopped early`, the reason its tooltip,
    done (not "short": the loop ended on purpose), neither "14/14" nor an ETA."""
    reason = "stopped early at step 14 of 60: eval_loss did not improve for 2 evaluations"
    state = LaunchState(1, clock=Clock())
    state.handle(Started(0, 1, 100))
    state.handle(Progress(0, 0, STEPS, {}, 0, "train", time=T0))
    state.handle(Progress(0, 10, STEPS, {}, 10 * ROWS, "train", time=T0 + 10.0))
    state.handle(Progress(0, 14, STEPS, {}, 14 * ROWS, "train", time=T0 + 14.0, ended=reason))
    bar = state.view().bars[0]
    assert (bar.step, bar.total, bar.state, bar.ended) == (14, STEPS, "done", reason)
    line = text.bar_line(bar)
    assert "✔" in line and f"14/{STEPS} · stopped early · " in line and "ETA" not in line
    assert f'title="{reason}">stopped early</span>' in html.bars_html([bar])
    state.handle(Finished(0, None))
    assert units.short_bar_note(state.view().bars[0]) is None
    # Without the reason the same bar, ended by its rank, is one cut short.
    cut = LaunchState(1, clock=Clock())
    cut.handle(Started(0, 1, 100))
    cut.handle(Progress(0, 14, STEPS, {}, 14 * ROWS, "train", time=T0 + 14.0))
    cut.handle(Finished(0, None))
    assert cut.view().bars[0].state == "short"
