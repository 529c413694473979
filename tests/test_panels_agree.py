"""Panels a person can trust: a finished run looks finished, every figure says what it counts,
the words are a person's, and the figures shown are the record's (`hx.last_launch()`).

One reader (`LaunchReader`) applies real events to the launch's record; the panel
(`LaunchState`, text, HTML) draws that reader, and the launch ends as the launcher ends it
(`supervision.end_launch`); the remote traceback comes from the launcher's own `run_rank`.
"""

from __future__ import annotations

import re
import time

import pytest

from hfxla_nb.events import Channel, Failed, Finished, MetricsSnapshot, Progress, Started
from hfxla_nb.launch import worker
from hfxla_nb.launch.supervision import LaunchRecord, RankRecord, end_launch, failure_message
from hfxla_nb.observe.reader import LaunchReader
from hfxla_nb.states import Outcome
from hfxla_nb.train.result import FineTuneResult
from hfxla_nb.ui import html, launch_display, text
from hfxla_nb.ui.panels import result_html
from hfxla_nb.ui.state import LaunchState
from tests.helpers import T0, Clock, run_python

NS = 1e9



def panel(world: int = 1, clock: Clock | None = None, **record) -> LaunchState:
    """The panel of a launch of `world` ranks, drawing the launch's one reader (as the
    launcher's panels do); events go to `panel.reader.handle`."""
    launch = LaunchRecord("replicated", world, [RankRecord(rank) for rank in range(world)],
                          **record)
    reader = LaunchReader(launch, clock=clock or Clock())
    return LaunchState(world, reader=reader, attempt=launch.attempt_text)


def end(state: LaunchState, outcome: Outcome = Outcome.FINISHED, seconds: float = 9.0) -> None:
    """End the launch as the launcher does, `seconds` after it began: ranks still running
    are stopped, the record gets its outcome, duration and figures, the panel is closed."""
    end_launch(state.reader, state, outcome, time.monotonic() - seconds, interrupted_line="")


def snapshot(step: int, compiles: int = 2, executions: int = 60, transfers: int = 1,
             cached: int = 1) -> MetricsSnapshot:
    data = {"counters": {"MarkStep": step, "CachedCompile": cached}, "fallback_ops": [],
            "metrics": {"CompileTime": {"count": compiles, "total": 1.3 * NS, "samples": []},
                        "ExecuteTime": {"count": executions, "total": 0.02 * NS, "samples": []},
                        "TransferFromDeviceTime": {"count": transfers, "total": 1e6,
                                                   "samples": []}}}
    if not (compiles or executions):
        data["metrics"] = {}
    return MetricsSnapshot(0, step, data, time=T0 + step)


def run(steps, total=60, world=1, dt=0.1, values=None):
    """A launch of `world` ranks whose rank 0 reports `steps` (0-based or 1-based) and every
    rank finishes: the panel while it runs, and at its end."""
    clock = Clock()
    state = panel(world, clock)
    reader = state.reader
    reader.handle(Started(0, world, 1))
    for i, step in enumerate(steps):
        reader.handle(Progress(0, step, total, dict(values or {"loss": float(step)}),
                               samples=8 * step, time=T0 + (i + 1) * dt))
    clock.now = T0 + (len(steps) + 1) * dt
    live = state.view()
    for rank in range(world):
        reader.handle(Finished(rank, None))
    end(state)
    return live, state.view()


# -- a finished run looks finished --------------------------------------------------------------


def test_a_bar_gets_its_check_mark_only_at_its_total():
    _, full = run(range(1, 61))
    (bar,) = full.bars
    assert (bar.step, bar.state) == (60, "done") and full.notes == []
    assert text.bar_line(bar, width=4).startswith("train ✔ |████| 60/60 · ")
    _, short = run(range(60))  # what `for step, batch in enumerate(loader)` reports
    (bar,) = short.bars
    assert (bar.step, bar.state, bar.first_step) == (59, "short", 0)
    assert text.bar_line(bar, width=4).startswith("train   |████| 59/60 · ")
    assert short.notes == ["train stopped at 59/60: its steps count from 0. Report the steps "
                           "done, step=i + 1 (or enumerate(loader, start=1))."]
    assert 'data-state="short"' in html.bars_html(short.bars)
    assert html.COLORS["warning"] in html.notes_html(short)
    _, early = run(range(1, 41))
    assert early.notes == ["train stopped at 40/60: the function returned before the total "
                           "it reported."]


def test_rank_labels_only_with_more_than_one_rank():
    _, alone = run(range(1, 11), total=10)
    assert alone.bars[0].name == "train" and "[rank" not in text.launch_text(alone)
    _, two = run(range(1, 11), total=10, world=2)
    assert two.bars[0].name == "train [rank 0]"
    assert text.status_line(two).startswith("✔ launch of 2 ranks finished in ")
    assert text.status_line(LaunchState(4, clock=Clock()).view()) == "… starting 4 ranks, 0 s"
    assert text.status_line(LaunchState(1, clock=Clock()).view()) == "… starting, 0 s"


# -- every figure says what it counts -----------------------------------------------------------


def test_status_is_the_launch_and_a_finished_bar_gives_overall_rates():
    live, _ = run(range(1, 31), dt=0.1)
    assert text.status_line(live) == "… running for 3.1 s"
    (live_bar,) = live.bars
    assert text.timing_parts(live_bar) == ["3.1 s elapsed", "ETA 3.0 s",
                                          "10 it/s, 80 samples/s"]
    _, final = run(range(1, 61), dt=0.1)
    assert text.status_line(final) == "✔ launch finished in 9.0 s"
    (final_bar,) = final.bars
    # Once ended, the mean over the steps after the warm-up: what fine_tune's result counts.
    assert text.timing_parts(final_bar) == ["6.0 s elapsed",
                                           "10 it/s, 80 samples/s after warm-up"]


def test_the_status_line_says_which_attempt():
    # `max_restarts=3`: the launcher hands each attempt's display its `attempt_text` and
    # the attempt's reader.
    clock = Clock()
    record = LaunchRecord("replicated", 1, [RankRecord(0)], attempt=2, max_attempts=4)
    reader = LaunchReader(record, clock=clock)
    display = launch_display(1, "console", attempt=record.attempt_text, reader=reader)
    reader.handle(Started(0, 1, 1))
    clock.now = T0 + 3
    live = display.view
    assert text.status_line(live) == "… running for 3.0 s (attempt 2 of 4)"
    assert "running for 3.0 s (attempt 2 of 4)</div>" in html.status_html(live)
    reader.handle(Failed(0, "ValueError", "boom", ""))
    end_launch(reader, display, Outcome.FAILED, time.monotonic() - 4.0, interrupted_line="")
    assert text.status_line(display.view) == (
        "✖ launch failed after 4.0 s (attempt 2 of 4): the function raised ValueError")
    state = panel(1, attempt=4, max_attempts=4)
    state.reader.handle(Finished(0, None))
    end(state)
    assert text.status_line(state.view()) == "✔ launch finished in 9.0 s (attempt 4 of 4)"
    assert "(attempt 4 of 4)" in html.launch_html(state.view())


def test_a_bar_clock_starts_with_its_own_work():
    clock = Clock()
    state = panel(1, clock)
    state.reader.handle(Started(0, 1, 1))  # at T0: start-up and model loading follow
    state.reader.handle(Progress(0, 0, 10, {}, samples=0, time=T0 + 5))  # the loop starts: step 0
    for step in range(1, 11):
        state.reader.handle(Progress(0, step, 10, {}, samples=8 * step, time=T0 + 5 + step))
    state.reader.handle(Progress(0, 1, 2, {}, label="eval", time=T0 + 15.5))  # no step 0 sent
    state.reader.handle(Progress(0, 2, 2, {}, label="eval", time=T0 + 16))
    state.reader.handle(Finished(0, None))
    end(state)
    train, evaluation = state.view().bars
    assert train.elapsed == pytest.approx(10.0)  # the loop, not the rank's start-up
    assert evaluation.elapsed == pytest.approx(1.0)  # after training ended, not from T0


def test_a_report_bar_and_a_tqdm_bar_over_one_loop_count_the_same_time():
    # `for step in tqdm(range(10)): ...; hx.report(step=step + 1, total=10)`: the tqdm bar
    # says step 0 when it is made, before the loop; `report` says nothing before step 1.
    clock = Clock()
    state = panel(1, clock)
    state.reader.handle(Started(0, 1, 1))  # at T0: 5 s of set-up follow
    state.reader.handle(Progress(0, 0, 10, {}, label="tqdm", time=T0 + 5))
    for step in range(1, 11):
        at = T0 + 5 + step * 0.5
        state.reader.handle(Progress(0, step, 10, {"loss": 1 / step}, time=at))
        state.reader.handle(Progress(0, step, 10, {}, label="tqdm", time=at))
        clock.now = at
        if step == 6:
            live = {bar.label: text.timing_parts(bar) for bar in state.view().bars}
    state.reader.handle(Finished(0, None))
    end(state)
    train, bar = state.view().bars
    assert (train.label, bar.label) == ("train", "tqdm")
    # Both clocks start with the loop (not the rank's set-up): the same elapsed and rates.
    assert train.elapsed == bar.elapsed == pytest.approx(5.0)
    assert text.timing_parts(train) == text.timing_parts(bar) == [
        "5.0 s elapsed", "2 it/s after warm-up"]
    assert live["train"] == live["tqdm"] == ["3.0 s elapsed", "ETA 2.0 s", "2 it/s"]
    # Each figure says what it counts (tooltips in the HTML panel and the widget's parts).
    page = html.bars_html([train])
    assert f'title="{text.ELAPSED_MEANS}"' in page.replace("&#x27;", "'")
    assert f'title="{text.RATE_MEANS}"' in page.replace("&#x27;", "'")
    chart = html.chart_html([train])
    assert "wall time per step</span>" in chart and "500 ms" in chart


@pytest.mark.launch
def test_in_a_real_launch_the_report_bar_and_tqdm_agree():
    # A loop after 2 s of set-up, under a tqdm bar and `hx.report`: the report bar's clock
    # used to start with the rank (5.6 s elapsed, 5.32 it/s beside tqdm's 4.6 s, 6.46 it/s).
    found = run_python(
        """
        import json, time
        import hfxla_nb as hx

        def train():
            import torch, torch_xla
            from tqdm.auto import tqdm
            time.sleep(2.0)  # set-up before the loop
            weight = torch.ones(16, 16, device=torch_xla.device())
            for i in tqdm(range(12), desc="tqdm"):
                loss = (torch.ones(4, 16, device=weight.device) @ weight).sum()
                time.sleep(0.05)
                hx.report(step=i + 1, total=12, loss=loss)
                torch_xla.sync()

        import hfxla_nb.launch.launcher as launcher
        states = []
        original = launcher.launch_display

        def keep(*args, **kwargs):
            panel = original(*args, **kwargs)
            states.append(panel.state)
            return panel

        launcher.launch_display = keep
        hx.notebook_launcher(train, num_processes=1, progress="console")
        bars = {bar.label: bar for bar in states[0].view().bars}
        print(json.dumps({label: [bar.elapsed, bar.rate, bar.step]
                          for label, bar in bars.items()}))
        """, timeout=300)
    (train_elapsed, train_rate, train_step), (tqdm_elapsed, tqdm_rate, tqdm_step) = (
        found["train"], found["tqdm"])
    assert train_step == tqdm_step == 12
    # The same clock (the loop's): they differ by at most the last step's sync, not 2 s.
    assert abs(train_elapsed - tqdm_elapsed) < 0.25 * tqdm_elapsed, found
    assert abs(train_rate - tqdm_rate) < 0.25 * tqdm_rate, found


def test_xla_time_per_step_and_a_failed_steps_counts_say_what_they_count():
    clock = Clock()
    state = panel(1, clock)
    state.reader.handle(Progress(0, 30, 30, {}, time=T0 + 1))
    state.reader.handle(snapshot(30, executions=30))  # 20 ms of execution in all
    state.reader.handle(Finished(0, None))
    end(state)
    view = state.view()
    assert "30 executions (20 ms, 667 µs XLA per step)" in text.launch_text(view)
    page = html.launch_html(view)
    assert f'title="{html.escape(text.XLA_STEP_MEANS)}">30 (20 ms, 667 µs XLA per step)<' in page
    # A run that failed in its 5th step: the function reported 5 steps, 4 graphs ran.
    state = panel(1, clock)
    state.reader.handle(Progress(0, 5, 30, {}, time=T0 + 1))
    state.reader.handle(snapshot(5, executions=4))
    state.reader.handle(Failed(0, "ValueError", "boom", ""))
    end(state, Outcome.FAILED, 2.0)
    view = state.view()
    said = "4 executions (20 ms) for 5 steps reported: the last step's graph did not run"
    assert "XLA in 5 steps: 2 compiles (1.3 s), " + said in text.launch_text(view)
    assert ">4 (20 ms) for 5 steps reported: the last step&#x27;s graph did not run<" in (
        html.launch_html(view))


def test_metrics_header_says_as_of_which_step():
    clock = Clock()
    state = panel(1, clock)
    state.reader.handle(Progress(0, 50, 60, {}, time=T0 + 1))
    state.reader.handle(snapshot(41))
    live = state.view()
    assert live.metrics_step == 41
    assert "XLA metrics as of step 41" in html.launch_html(live)
    assert "\nXLA as of step 41: 2 compiles (1.3 s), 60 executions" in text.launch_text(live)
    state.reader.handle(snapshot(60))
    state.reader.handle(Finished(0, None))
    end(state)
    assert "XLA metrics in 60 steps" in html.launch_html(state.view())


def test_a_launch_that_compiled_and_executed_nothing_has_no_xla_part():
    state = panel(1)
    state.reader.handle(Progress(0, 1, 1, {}, time=T0 + 1))
    state.reader.handle(snapshot(1, compiles=0, executions=0, transfers=0, cached=0))
    live = state.view()  # while it runs, the XLA part says so: XLA may still come
    assert "XLA as of step 1: nothing compiled or executed yet" in text.launch_text(live)
    assert "nothing compiled or executed yet" in html.launch_html(live)
    state.reader.handle(Finished(0, None))
    end(state)
    view = state.view()
    # The summary itself is one line (what %%xla_metrics shows for such a cell) ...
    assert text.summary_lines(view.metrics, "XLA") == [
        "XLA in 1 step: nothing compiled or executed"]
    # ... and a finished launch that ran no XLA has no XLA part at all.
    assert "XLA" not in text.launch_text(view) and html.view_metrics_html(view) == ""
    assert "XLA" not in html.launch_html(view)


# -- words and colours --------------------------------------------------------------------------


def test_counts_are_written_as_a_person_would():
    state = panel(1)
    state.reader.handle(snapshot(1, compiles=1, executions=1, transfers=1, cached=1))
    summary = state.view().metrics
    lines = text.summary_lines(summary)
    assert lines[0].startswith("XLA in 1 step: 1 compile (1.3 s), 1 execution (20 ms)")
    # Nothing sent to the device: "none", not "0 transfers, n/a, 0 s".
    assert lines[1] == "transfers: device → host 1 transfer, 1.0 ms; host → device none"
    page = html.summary_html(summary)
    assert "1 (1.3 s), 1 cache hit<" in page and "1 transfer, 1.0 ms<" in page
    for wrong in ("1 transfers", "1 steps", "1 cache hits", "n/a", "0 transfers"):
        assert wrong not in page and wrong not in "\n".join(lines)
    state.reader.handle(snapshot(30, compiles=2, executions=30, transfers=0, cached=0))
    page = html.summary_html(state.view().metrics)
    assert "cache hit" not in page and ".item()" not in page


def test_the_loss_has_one_colour_everywhere():
    _, view = run(range(1, 11), total=10)
    chart = html.chart_html(view.bars)
    assert f'stroke="{html.SERIES["loss"]}"' in chart
    assert f'stroke="{html.COLORS["failed"]}"' not in chart  # a falling loss is no failure

    result = FineTuneResult(
        output_dir=None, loss_history=[(5, 0.7), (10, 0.5), (15, 0.2)], metrics={}, steps=15,
        epochs=1.0, samples_per_second=90.0, train_seconds=3.0, compiles=2, eval_compiles=0,
        executions_per_step=None, transfers_per_step=None, label_names=["a", "b"],
        strategy="spmd", devices=1, precision="fp32", bucket_lengths=[16], batch_size=8,
        samples_per_second_overall=60.0, launch_seconds=5.0)
    assert f'stroke="{html.SERIES["loss"]}"' in result_html(result)


# -- a failure: its message once, without the launcher's frames ---------------------------------


def failing(index):
    def inner():
        raise ValueError("boom")

    inner()


def test_failure_message_once_and_no_launcher_frames():
    channel = Channel()
    try:
        worker.run_rank(channel, 0, 1, failing, (), True)
        (failed,) = [e for e in channel.receive(timeout=1) if isinstance(e, Failed)]
    finally:
        from hfxla_nb import events

        events.attach_worker(None, None)
        channel.close()
    assert "run_rank" not in failed.traceback and "worker.py" not in failed.traceback
    assert failed.traceback.splitlines()[1].strip().endswith("in failing")
    state = panel(1)
    state.reader.handle(Started(0, 1, 1))
    state.reader.handle(failed)
    end(state, Outcome.FAILED)
    message = failure_message(state.reader)
    # The first line names it; the traceback ends with it, as Python's own does.
    assert message.startswith("rank 0 failed: ValueError: boom.\n\nRemote traceback (rank 0):")
    assert message.rstrip().endswith('raise ValueError("boom")\nValueError: boom')
    # The panel says who raised what, once: the message is the `LaunchError`'s.
    assert state.reader.record.ranks[0].reason == "raised ValueError"
    assert state.view().errors == ["the function raised ValueError"]


# -- the figures are data too: the panel's are the record's -----------------------------------


def test_last_launch_carries_the_figures_the_panel_shows():
    state = panel(2)
    reader, record = state.reader, state.reader.record
    for rank in (0, 1):
        reader.handle(Started(rank, 2, 7))
        for step in range(1, 6):
            reader.handle(Progress(rank, step, 5, {"loss": 1.0}, time=T0 + step * 0.5))
    # One process ran both ranks as threads: its counters are theirs together.
    data = dict(snapshot(5, compiles=3, executions=10, transfers=2).data)
    data["process"] = {"pid": 7, "ranks": [0, 1], "rank_steps": 10}
    reader.handle(MetricsSnapshot(1, 5, data, time=T0 + 9))
    reader.handle(Progress(0, 3, 5, {"loss": 0.5}, time=T0 + 1.5))  # a late fetch: no new time
    for rank in (0, 1):
        reader.handle(Finished(rank, None))
    end(state)
    metrics, view = record.ranks[0].metrics, state.view()
    assert metrics.shared_with == [0, 1] and record.ranks[1].metrics.shared_with == [0, 1]
    assert (metrics.steps, metrics.compiles, metrics.executions) == (5, 3, 10)
    assert metrics.transfers_from_device == 2 and metrics.compile_seconds == pytest.approx(1.3)
    assert metrics.step_times == [(step, pytest.approx(0.5)) for step in range(2, 6)]
    assert metrics.to_dict()["cached_compiles"] == 1
    # What the panel shows is the record's: the same figures under the same names.
    assert view.metrics_ranks == metrics.shared_with and view.metrics_step == metrics.steps
    for name in ("compiles", "compile_seconds", "executions", "execute_seconds",
                 "transfers_from_device", "cached_compiles"):
        assert getattr(view.metrics, name) == getattr(metrics, name), name
    assert f"{metrics.compiles} compiles (1.3 s)" in text.launch_text(view)
    bar = next(bar for bar in view.bars if bar.rank == 0)
    assert (bar.step, bar.total) == record.ranks[0].bars["train"] == (5, 5)
    assert bar.step == record.ranks[0].last_step
    assert bar.step_times == [seconds for _, seconds in metrics.step_times]
    assert bar.values["loss"] == 0.5  # the late fetch's value, on the bar of step 5
    frame = record.to_dataframe()
    assert list(frame["rank"]) == [0, 1] and list(frame["compiles"]) == [3, 3]
    assert {"execute_seconds", "transfers_from_device", "step_times", "alerts"} <= set(frame)
    assert re.fullmatch(r"\d+\.\d+", f"{frame['compile_seconds'][0]:.2f}")
    empty = panel(1)
    end(empty)  # no snapshot: a function that never used XLA
    assert empty.reader.record.ranks[0].metrics is None
    assert empty.reader.record.to_dataframe().loc[0, "exit_state"] == "stopped"
