"""Panels a person can trust: a finished run looks finished, every figure says what it counts,
the words are a person's, and the figures shown are data too (`hx.last_launch()`).

The state, text and HTML are driven with real events; the record with a real `RecordKeeper`;
the remote traceback with the launcher's own `run_rank`.
"""

from __future__ import annotations

import re

import pytest

from hfxla_nb.events import Channel, Failed, Finished, MetricsSnapshot, Progress, Started
from hfxla_nb.launch import worker
from hfxla_nb.launch.record import LaunchRecord, RankRecord, RecordKeeper
from hfxla_nb.train.result import FineTuneResult
from hfxla_nb.ui import html, text
from hfxla_nb.ui.finetune_panel import result_html
from hfxla_nb.ui.state import LaunchState
from tests.kernel_helpers import run_python

T0 = 1_000_000.0
NS = 1e9


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def finished(world: int = 1) -> LaunchRecord:
    ranks = [RankRecord(rank, exit_state="finished") for rank in range(world)]
    return LaunchRecord("replicated", world, ranks, duration=9.0, outcome="finished")


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


def run(steps, total=60, world=1, dt=0.1, record=None, values=None):
    """A launch of `world` ranks whose rank 0 reports `steps` (0-based or 1-based)."""
    clock = Clock()
    state = LaunchState(world, clock=clock)
    state.handle(Started(0, world, 1))
    for i, step in enumerate(steps):
        state.handle(Progress(0, step, total, dict(values or {"loss": float(step)}),
                              samples=8 * step, time=T0 + (i + 1) * dt))
    clock.now = T0 + (len(steps) + 1) * dt
    live = state.view()
    state.handle(Finished(0, None))
    state.close(record or finished(world))
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
    _, two = run(range(1, 11), total=10, world=2, record=finished(2))
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
    assert text.timing_parts(final_bar) == ["6.0 s elapsed",
                                           "overall 10 it/s, 80 samples/s"]


def test_the_status_line_says_which_attempt():
    from hfxla_nb.ui import launch_display

    # `max_restarts=3`: the launcher hands each attempt's display its `attempt_text`.
    display = launch_display(1, "console", attempt="attempt 2 of 4")
    display.state.clock = clock = Clock()
    display.state.start = T0
    display.handle(Started(0, 1, 1))
    clock.now = T0 + 3
    live = display.view
    assert text.status_line(live) == "… running for 3.0 s (attempt 2 of 4)"
    assert "running for 3.0 s (attempt 2 of 4)</div>" in html.status_html(live)
    display.handle(Failed(0, "ValueError", "boom", ""))
    record = LaunchRecord("replicated", 1, [RankRecord(0, exit_state="failed")], duration=4.0,
                          outcome="failed", attempt=2, max_attempts=4)
    display.close(record)
    assert text.status_line(display.view) == (
        "✖ launch failed after 4.0 s (attempt 2 of 4): the function raised ValueError")
    # The final record says it too (a display made without it); no words without restarts.
    state = LaunchState(1, clock=Clock())
    state.close(LaunchRecord("replicated", 1, [RankRecord(0, exit_state="finished")],
                             duration=9.0, outcome="finished", attempt=4, max_attempts=4))
    assert text.status_line(state.view()) == "✔ launch finished in 9.0 s (attempt 4 of 4)"
    assert "(attempt 4 of 4)" in html.launch_html(state.view())
    state = LaunchState(1, clock=Clock())
    state.close(finished())
    assert text.status_line(state.view()) == "✔ launch finished in 9.0 s"


def test_a_bar_clock_starts_with_its_own_work():
    clock = Clock()
    state = LaunchState(1, clock=clock)
    state.handle(Started(0, 1, 1))  # at T0: start-up and model loading follow
    state.handle(Progress(0, 0, 10, {}, samples=0, time=T0 + 5))  # the loop starts: step 0
    for step in range(1, 11):
        state.handle(Progress(0, step, 10, {}, samples=8 * step, time=T0 + 5 + step))
    state.handle(Progress(0, 1, 2, {}, label="eval", time=T0 + 15.5))  # no step 0 sent
    state.handle(Progress(0, 2, 2, {}, label="eval", time=T0 + 16))
    state.handle(Finished(0, None))
    state.close(finished())
    train, evaluation = state.view().bars
    assert train.elapsed == pytest.approx(10.0)  # the loop, not the rank's start-up
    assert evaluation.elapsed == pytest.approx(1.0)  # after training ended, not from T0


def test_a_report_bar_and_a_tqdm_bar_over_one_loop_count_the_same_time():
    # `for step in tqdm(range(10)): ...; hx.report(step=step + 1, total=10)`: the tqdm bar
    # says step 0 when it is made, before the loop; `report` says nothing before step 1.
    clock = Clock()
    state = LaunchState(1, clock=clock)
    state.handle(Started(0, 1, 1))  # at T0: 5 s of set-up follow
    state.handle(Progress(0, 0, 10, {}, label="tqdm", time=T0 + 5))
    for step in range(1, 11):
        at = T0 + 5 + step * 0.5
        state.handle(Progress(0, step, 10, {"loss": 1 / step}, time=at))
        state.handle(Progress(0, step, 10, {}, label="tqdm", time=at))
        clock.now = at
        if step == 6:
            live = {bar.label: text.timing_parts(bar) for bar in state.view().bars}
    state.handle(Finished(0, None))
    state.close(finished())
    train, bar = state.view().bars
    assert (train.label, bar.label) == ("train", "tqdm")
    # Both clocks start with the loop (not the rank's set-up): the same elapsed and rates.
    assert train.elapsed == bar.elapsed == pytest.approx(5.0)
    assert text.timing_parts(train) == text.timing_parts(bar) == [
        "5.0 s elapsed", "overall 2 it/s"]
    assert live["train"] == live["tqdm"] == ["3.0 s elapsed", "ETA 2.0 s", "2 it/s"]
    # Each figure says what it counts (tooltips in the HTML panel and the widget's parts).
    page = html.bars_html([train])
    assert f'title="{text.ELAPSED_MEANS}"' in page.replace("&#x27;", "'")
    assert f'title="{text.RATE_MEANS}"' in page.replace("&#x27;", "'")
    chart = html.chart_html([train])
    assert "wall time per step</span>" in chart and "500 ms" in chart


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
    state = LaunchState(1, clock=clock)
    state.handle(Progress(0, 30, 30, {}, time=T0 + 1))
    state.handle(snapshot(30, executions=30))  # 20 ms of execution in all
    state.close(finished())
    view = state.view()
    assert "30 executions (20 ms, 667 µs XLA per step)" in text.launch_text(view)
    page = html.launch_html(view)
    assert f'title="{html.escape(text.XLA_STEP_MEANS)}">30 (20 ms, 667 µs XLA per step)<' in page
    # A run that failed in its 5th step: the function reported 5 steps, 4 graphs ran.
    state = LaunchState(1, clock=clock)
    state.handle(Progress(0, 5, 30, {}, time=T0 + 1))
    state.handle(snapshot(5, executions=4))
    state.handle(Failed(0, "ValueError", "boom", ""))
    state.close(LaunchRecord("replicated", 1, [RankRecord(0, exit_state="failed")],
                             duration=2.0, outcome="failed"))
    view = state.view()
    said = "4 executions (20 ms) for 5 steps reported: the last step's graph did not run"
    assert "XLA in 5 steps: 2 compiles (1.3 s), " + said in text.launch_text(view)
    assert ">4 (20 ms) for 5 steps reported: the last step&#x27;s graph did not run<" in (
        html.launch_html(view))


def test_metrics_header_says_as_of_which_step():
    clock = Clock()
    state = LaunchState(1, clock=clock)
    state.handle(Progress(0, 50, 60, {}, time=T0 + 1))
    state.handle(snapshot(41))
    live = state.view()
    assert live.metrics_step == 41
    assert "XLA metrics as of step 41" in html.launch_html(live)
    assert "\nXLA as of step 41: 2 compiles (1.3 s), 60 executions" in text.launch_text(live)
    state.handle(snapshot(60))
    state.close(finished())
    assert "XLA metrics in 60 steps" in html.launch_html(state.view())


def test_a_launch_that_compiled_and_executed_nothing_has_no_xla_part():
    state = LaunchState(1, clock=Clock())
    state.handle(Progress(0, 1, 1, {}, time=T0 + 1))
    state.handle(snapshot(1, compiles=0, executions=0, transfers=0, cached=0))
    live = state.view()  # while it runs, the XLA part says so: XLA may still come
    assert "XLA as of step 1: nothing compiled or executed yet" in text.launch_text(live)
    assert "nothing compiled or executed yet" in html.launch_html(live)
    state.close(finished())
    view = state.view()
    # The summary itself is one line (what %%xla_metrics shows for such a cell) ...
    assert text.summary_lines(view.metrics, "XLA") == [
        "XLA in 1 step: nothing compiled or executed"]
    # ... and a finished launch that ran no XLA has no XLA part at all.
    assert "XLA" not in text.launch_text(view) and html.view_metrics_html(view) == ""
    assert "XLA" not in html.launch_html(view)


# -- words and colours --------------------------------------------------------------------------


def test_counts_are_written_as_a_person_would():
    state = LaunchState(1, clock=Clock())
    state.handle(snapshot(1, compiles=1, executions=1, transfers=1, cached=1))
    summary = state.view().metrics
    lines = text.summary_lines(summary)
    assert lines[0].startswith("XLA in 1 step: 1 compile (1.3 s), 1 execution (20 ms)")
    # Nothing sent to the device: "none", not "0 transfers, n/a, 0 s".
    assert lines[1] == "transfers: device → host 1 transfer, 1.0 ms; host → device none"
    page = html.summary_html(summary)
    assert "1 (1.3 s), 1 cache hit<" in page and "1 transfer, 1.0 ms<" in page
    for wrong in ("1 transfers", "1 steps", "1 cache hits", "n/a", "0 transfers"):
        assert wrong not in page and wrong not in "\n".join(lines)
    state.handle(snapshot(30, compiles=2, executions=30, transfers=0, cached=0))
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
    record = LaunchRecord("replicated", 1, [RankRecord(0)])
    keeper = RecordKeeper(record)
    keeper.handle(Started(0, 1, 1))
    keeper.handle(failed)
    message = keeper.failure_message()
    # The first line names it; the traceback ends with it, as Python's own does.
    assert message.startswith("rank 0 failed: ValueError: boom.\n\nRemote traceback (rank 0):")
    assert message.rstrip().endswith('raise ValueError("boom")\nValueError: boom')
    assert record.ranks[0].reason == "raised ValueError"
    state = LaunchState(1, clock=Clock())
    state.handle(failed)
    state.close(record)
    assert state.view().errors == ["the function raised ValueError"]


# -- the figures are data too -------------------------------------------------------------------


def test_last_launch_carries_each_ranks_figures_as_data():
    record = LaunchRecord("replicated", 2, [RankRecord(0), RankRecord(1)], outcome="finished")
    keeper = RecordKeeper(record)
    for rank in (0, 1):
        keeper.handle(Started(rank, 2, 7))
        for step in range(1, 6):
            keeper.handle(Progress(rank, step, 5, {"loss": 1.0}, time=T0 + step * 0.5))
    # One process ran both ranks as threads: its counters are theirs together.
    data = dict(snapshot(5, compiles=3, executions=10, transfers=2).data)
    data["process"] = {"pid": 7, "ranks": [0, 1], "rank_steps": 10}
    keeper.handle(MetricsSnapshot(1, 5, data, time=T0 + 9))
    keeper.handle(Progress(0, 3, 5, {"loss": 0.5}, time=T0 + 1.5))  # a late fetch: no new time
    keeper.finish()
    metrics = record.ranks[0].metrics
    assert metrics.shared_with == [0, 1] and record.ranks[1].metrics.shared_with == [0, 1]
    assert (metrics.steps, metrics.compiles, metrics.executions) == (5, 3, 10)
    assert metrics.transfers_from_device == 2 and metrics.compile_seconds == pytest.approx(1.3)
    assert metrics.step_times == [(step, pytest.approx(0.5)) for step in range(2, 6)]
    assert metrics.to_dict()["cached_compiles"] == 1
    frame = record.to_dataframe()
    assert list(frame["rank"]) == [0, 1] and list(frame["compiles"]) == [3, 3]
    assert {"execute_seconds", "transfers_from_device", "step_times", "alerts"} <= set(frame)
    assert re.fullmatch(r"\d+\.\d+", f"{frame['compile_seconds'][0]:.2f}")
    empty = LaunchRecord("spmd", 1, [RankRecord(0)])
    RecordKeeper(empty).finish()  # no snapshot: a function that never used XLA
    assert empty.ranks[0].metrics is None
    assert empty.to_dataframe().loc[0, "exit_state"] == "pending"
