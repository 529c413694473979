"""Panels: the state behind them, the text and HTML builders, the console, widget and HTML
renderers (widget state without a browser, and in a real kernel through nbclient)."""

from __future__ import annotations

import json
import re
import sys
from html import unescape
from types import SimpleNamespace

import pytest

from hfxla_nb import ui
from hfxla_nb.events import (
    Failed,
    Finished,
    Heartbeat,
    MetricsSnapshot,
    ProcessExited,
    Progress,
    Started,
)
from hfxla_nb.launch.supervision import LaunchRecord, RankRecord
from hfxla_nb.ui import NullDisplay, html, launch_display, text
from hfxla_nb.ui import state as units
from hfxla_nb.ui.html import MetricsPanel
from hfxla_nb.ui.live import ConsoleDisplay, HtmlDisplay, WidgetDisplay, widget_state
from hfxla_nb.ui.state import BORDER, PADDING, LaunchState
from tests.helpers import T0, Clock, Shown, bundles_of, error_of, run_notebook, stdout_of


def record(ok=True, **ranks):
    """A real `LaunchRecord` as the launcher leaves it: `record(r0="finished", r1="failed")`."""
    rank_records = [RankRecord(rank=int(r[1:]), exit_state=state, duration=1.0,
                               error=None if state == "finished" else "ValueError: bad batch")
                    for r, state in ranks.items()]
    outcome = "finished" if ok else "failed"
    return LaunchRecord("spmd", len(rank_records), rank_records, duration=4.0, outcome=outcome)


SNAPSHOT = {
    "counters": {"MarkStep": 20, "CachedCompile": 18, "aten::nonzero": 3},
    "metrics": {
        "CompileTime": {"count": 2, "total": 3e9, "samples": [(1, 2e9), (2, 1e9)]},
        "ExecuteTime": {"count": 20, "total": 1e9, "samples": []},
        "TransferFromDeviceTime": {"count": 21, "total": 2e6, "samples": []},
    },
    "fallback_ops": ["aten::nonzero"],
}


def train_events(rank=0, steps=4, total=4, start=T0, dt=0.5):
    """Started, then one Progress per step (loss fetched at every step), at `dt` s per step."""
    yield Started(rank, 2, 100 + rank)
    for step in range(1, steps + 1):
        yield Progress(rank, step, total, {"loss": 1.0 / step, "lr": 0.001}, samples=8 * step,
                       time=start + step * dt)


# -- state ---------------------------------------------------------------------------------------


def test_state_rates_eta_and_values():
    clock = Clock()
    state = LaunchState(2, clock=clock)
    assert state.view().state == "starting"
    for event in train_events(steps=6, total=10):
        state.handle(event)
    clock.now = T0 + 3.0
    view = state.view()
    assert view.state == "running" and view.ranks == {0: "running", 1: "pending"}
    (bar,) = view.bars
    assert (bar.name, bar.step, bar.total, bar.state) == ("train [rank 0]", 6, 10, "running")
    # Rates and ETA over the steps after the warm-up (tests/test_bar_clock.py).
    assert bar.rate == pytest.approx(2.0) and bar.samples_rate == pytest.approx(16.0)
    assert bar.eta == pytest.approx(2.0)
    assert bar.elapsed == pytest.approx(3.0)
    assert bar.values == {"loss": pytest.approx(1 / 6), "lr": 0.001}
    assert bar.losses == [pytest.approx(1 / step) for step in range(1, 7)]
    assert bar.step_times == [pytest.approx(0.5)] * 5


def test_state_keeps_values_fetched_late_and_ignores_unknown_events():
    state = LaunchState(1, clock=Clock())
    state.handle(Progress(0, 10, 20, {}, time=T0 + 1))
    state.handle(Progress(0, 11, 20, {}, time=T0 + 2))
    state.handle(Progress(0, 10, 20, {"loss": 0.25}, time=T0 + 1))  # a step closure's values
    state.handle(ProcessExited(rank=0, pid=100, exitcode=9))  # the record says it at the end
    state.handle(Heartbeat(0))
    (bar,) = state.view().bars
    assert bar.step == 11 and bar.values == {"loss": 0.25} and bar.losses == [0.25]


def test_evaluations_during_training_are_dots_on_the_live_loss_chart():
    """Each evaluation is a dot on the live loss chart; a visible legend names the line and the
    dots from the start (the evaluation bar is announced then), and the chart's highest and
    lowest values stand beside it."""
    # As the worker sends them: the evaluation bar announced, the loss every step, then the
    # evaluation as late values of the train bar at the step it ran after
    # (`TrainingLoop.evaluate_now`).
    state = LaunchState(1, clock=Clock())
    state.handle(Progress(0, 0, 4, label="eval", time=T0, waiting=True, starts="every 6 steps"))
    for step in range(1, 7):
        state.handle(Progress(0, step, 10, {"loss": 1 / step}, time=T0 + step))
    before = html.chart_html(state.view().bars)
    state.handle(Progress(0, 6, 10, {"eval_loss": 0.3, "eval_accuracy": 0.5}, late=True,
                          time=T0 + 6.5))
    bar = state.view().bars[0]
    assert bar.evaluations == [(6, 0.3)] and bar.losses[-1] == pytest.approx(1 / 6)
    chart = html.chart_html(state.view().bars)
    (dot,) = re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)" r="2.5" fill="([^"]+)"', chart)
    # At the sixth loss (the line's right end), between the line's highest and lowest points.
    assert dot == ("178.0", dot[1], html.SERIES["eval loss"]) and 2 < float(dot[1]) < 34
    assert not re.findall(r'r="2.5"', before)
    legend = re.search(r'<span class="hfxla-legend"[^>]*>(.*?)</span>', chart).group(1)
    assert unescape(re.sub(r"<[^>]+>", " ", legend)).split() == ["train", "loss", "eval", "loss"]
    axis = re.search(r'<span class="hfxla-axis"[^>]*>(.*?)</span></span>', chart).group(1)
    assert re.sub(r"<[^>]+>", " ", axis).split() == ["1", "0.1667"]  # highest, lowest
    # The dots add no text: the chart line keeps its width and the panel its height.
    assert re.sub(r"<svg.*?</svg>", "", chart) == re.sub(r"<svg.*?</svg>", "", before)
    # A run that does not evaluate during training has no dots to name.
    alone = LaunchState(1, clock=Clock())
    for step in range(1, 4):
        alone.handle(Progress(0, step, 10, {"loss": 1 / step}, time=T0 + step))
    assert "eval loss" not in html.chart_html(alone.view().bars)

    # Past the chart's history the oldest evaluations go with their losses.
    for step in range(7, units.HISTORY + 60):
        state.handle(Progress(0, step, None, {"loss": 1.0}, time=T0 + step))
    state.handle(Progress(0, step, None, {"eval_loss": 0.9}, late=True, time=T0 + step))
    bar = state.view().bars[0]
    assert bar.evaluations == [(units.HISTORY, 0.9)]


def test_state_restarts_a_bar_that_counts_again():
    state = LaunchState(1, clock=Clock())
    for step in (1, 2, 3):
        state.handle(Progress(0, step, 3, {"loss": 1.0}, time=T0 + step))
    assert state.view().bars[0].state == "done"
    state.handle(Progress(0, 1, 3, {"loss": 0.5}, time=T0 + 10))  # epoch 2
    (bar,) = state.view().bars
    assert (bar.step, bar.state, bar.rate) == (1, "running", None)
    assert bar.losses == [1.0, 1.0, 1.0, 0.5]


def test_state_aggregates_large_worlds_and_shows_failure():
    clock = Clock()
    state = LaunchState(8, clock=clock)
    for rank in range(8):
        for event in train_events(rank, steps=5 if rank == 5 else 6, total=8):
            state.handle(event)
    (bar,) = state.view().bars
    assert bar.rank is None and bar.ranks == 8 and bar.step == 5  # the slowest rank
    assert bar.name == "train (8 ranks)"
    assert bar.samples_rate == pytest.approx(8 * 16.0)
    state.handle(Failed(5, "ValueError", "bad batch", "Traceback ..."))
    state.close(record(ok=False, r0="finished", r5="failed"))
    view = state.view()
    assert view.state == "failed" and view.bars[0].state == "failed"
    # Who and what, once: the message itself is the LaunchError's (not repeated from the record).
    assert view.errors == ["rank 5 raised ValueError"]
    assert view.elapsed == pytest.approx(4.0)


def test_state_close_tolerates_any_record():
    state = LaunchState(1, clock=Clock())
    for event in train_events(steps=2, total=None):
        state.handle(event)
    state.handle(Finished(0, result=1))
    state.close(None)  # no attributes at all: judged from the events
    view = state.view()
    assert view.state == "finished" and view.bars[0].state == "done"
    state = LaunchState(1, clock=Clock())
    state.close(LaunchRecord("spmd", 1, [RankRecord(0)], outcome="timeout"))
    assert state.view().state == "failed" and state.view().errors == ["timed out"]


def test_state_metrics_from_snapshots():
    state = LaunchState(1, clock=Clock())
    state.handle(MetricsSnapshot(0, 20, SNAPSHOT))
    view = state.view()
    assert view.metrics.compiles == 2 and view.metrics_rank == 0
    assert {alert.code for alert in view.alerts} == {"frequent-transfers", "cpu-fallback"}


# `xm.get_memory_info()` as a TPU v5e answers it (XLA on the CPU raises UNIMPLEMENTED): the
# panel is tested with these recorded values.
TPU_V5E_MEMORY = {"bytes_used": 1_288_490_189, "bytes_limit": 17_179_869_184,
                  "peak_bytes_used": 2_147_483_648}


def test_device_memory_of_a_tpu_reaches_every_panel():
    state = LaunchState(1, clock=Clock())
    state.handle(MetricsSnapshot(0, 20, SNAPSHOT, memory=dict(TPU_V5E_MEMORY)))
    view = state.view()
    line = "device memory: 1.2 GiB used of 16.0 GiB (peak 2.0 GiB)"
    assert line in text.launch_text(view)
    assert "1.2 GiB used of 16.0 GiB (peak 2.0 GiB)" in html.launch_html(view)
    state = LaunchState(1, clock=Clock())
    state.handle(MetricsSnapshot(0, 20, SNAPSHOT))
    assert "device memory: not available" in text.launch_text(state.view())


def process_snapshot(step, executions, *, sender, time, ranks=(0, 1, 2, 3), pid=4242):
    """A snapshot of a process running `ranks` as threads, sent from `sender`'s thread."""
    data = {"counters": {"MarkStep": executions}, "fallback_ops": [],
            "metrics": {"ExecuteTime": {"count": executions, "total": 1e6, "samples": []}},
            "process": {"pid": pid, "ranks": list(ranks), "rank_steps": executions}}
    return MetricsSnapshot(sender, step, data, time=time)


def test_state_metrics_of_rank_threads_name_their_process():
    # 4 rank threads in one process share torch_xla's counters: whichever thread sends them,
    # the panel shows the process (named honestly), and the newest reading wins.
    state = LaunchState(4, clock=Clock())
    state.handle(process_snapshot(5, 20, sender=1, time=T0 + 1))
    state.handle(process_snapshot(30, 100, sender=3, time=T0 + 3))
    state.handle(process_snapshot(20, 80, sender=0, time=T0 + 2))  # older, arrived late
    view = state.view()
    assert view.metrics_ranks == [0, 1, 2, 3] and view.metrics_rank == 0
    assert view.metrics.executions == 100 and view.metrics.steps == 30
    assert text.metrics_title(view) == "XLA metrics (process of ranks 0-3)"
    assert "(process of ranks 0-3)" in text.launch_text(view).splitlines()[1]
    assert "XLA metrics (process of ranks 0-3) as of step 30" in html.launch_html(view)
    assert "rank 1" not in html.launch_html(view)
    assert text.metrics_label([2]) == "rank 2"
    assert text.metrics_label([0, 2, 5]) == "process of ranks 0, 2, 5"


# -- text ----------------------------------------------------------------------------------------


def test_units_formats():
    assert units.duration(3.21) == "3.2 s"
    assert units.duration(125) == "2 min 05 s"
    assert units.duration(3 * 3600 + 120) == "3 h 02 min"
    assert units.duration(None) == "?"
    # Steps of a few tens of milliseconds read in milliseconds, not "0.0 s".
    assert units.duration(0.024) == "24 ms" and units.duration(0.0333) == "33 ms"
    assert units.duration(0.0042) == "4.2 ms" and units.duration(0) == "0 s"
    assert units.duration(0.9996) == "1.0 s" and units.duration(0.5) == "500 ms"
    assert units.duration(0.00004) == "40 µs" and units.duration(0.0009999) == "1.0 ms"
    assert units.size(None) == "n/a" and units.size(512) == "512 B"
    assert units.size(3 * 1024**3) == "3.0 GiB"
    assert units.rate(0.5, "it") == "2.00 s/it" and units.rate(12.34, "it") == "12.3 it/s"
    # Compact, so a bar's values stay short: 4 significant digits, or 2 in short scientific
    # form for very small and large values.
    assert units.number(0.000012) == "1.2e-5" and units.number(0.4213) == "0.4213"
    assert units.number(1.6667e-4) == "1.7e-4" and units.number(5e-5) == "5e-5"
    assert units.number(123456.789) == "1.2e5" and units.number(-0.0004) == "-4e-4"
    assert units.number(12.3456) == "12.35" and units.number(0) == "0"
    assert units.number(0.001367) == "0.0014" and units.number(0.01234) == "0.0123"
    assert units.number(12345.6) == "1.2e4" and units.number(1234.5) == "1234"
    # A bar's times, short past a minute (so its stats stay on one line).
    assert units.clock(12.04) == "12.0 s" and units.clock(0.85) == "850 ms"
    assert units.clock(65) == "1:05" and units.clock(3725) == "1:02:05"


def test_text_panel_lines():
    state = LaunchState(1, clock=Clock())
    for event in train_events(steps=5, total=10):
        state.handle(event)
    state.handle(MetricsSnapshot(0, 20, SNAPSHOT))
    line = text.bar_line(state.view().bars[0], width=4)
    # One rank: no "[rank 0]"; the mark's place is kept blank while it runs.
    assert line.startswith("train   |██░░| 5/10 · ")
    assert line.endswith(" · 2 it/s, 16 samples/s · loss=0.2 · lr=0.001")
    whole = text.launch_text(state.view())
    assert ("XLA as of step 20: 2 compiles (3.0 s), 20 executions (1.0 s, 50 ms XLA per step), "
            "compile 75% / execute 25%\n") in whole
    assert "CPU fallbacks: aten::nonzero x3" in whole
    assert "device memory: not available" in whole
    assert "⚠ Operations ran on the CPU: aten::nonzero" in whole


# -- HTML builders -------------------------------------------------------------------------------


def test_sparkline_svg():
    assert html.sparkline_svg([1.0]) == ""
    svg = html.sparkline_svg([3.0, 1.0, 2.0], width=100, height=20)
    assert svg.startswith("<svg") and svg.count(",") == 3
    assert 'points="2.0,2.0 50.0,18.0 98.0,10.0"' in svg
    assert 'points="2.0,10.0 98.0,10.0"' in html.sparkline_svg([5, 5], width=100, height=20)
    long = html.sparkline_svg(list(range(1000)), width=50)
    assert long.count(",") <= 52


def test_launch_html_escapes_and_colors():
    state = LaunchState(1, clock=Clock())
    for event in train_events(steps=4, total=4):
        state.handle(event)
    # A bar's label is the user's (a tqdm description): escaped like every other text.
    state.handle(Progress(0, 1, 2, {}, label="<script>alert(1)</script>", time=T0 + 3))
    state.handle(Failed(0, "ValueError", "bad", ""))
    state.handle(MetricsSnapshot(0, 20, SNAPSHOT))
    state.close(record(ok=False, r0="failed"))
    page = html.launch_html(state.view())
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert html.COLORS["failed"] in html.status_html(state.view())
    assert "<svg" in page  # loss and step-time charts
    assert "CPU fallbacks" in page and "aten::nonzero x3" in page
    assert "Fix:" in page


def full_view():
    """A failed launch with every part of the panel: bars, charts, errors, metrics, alerts."""
    state = LaunchState(2, clock=Clock())
    for rank in (0, 1):
        for event in train_events(rank, steps=4, total=8, dt=0.024):
            state.handle(event)
    state.handle(Failed(1, "ValueError", "bad batch", ""))
    data = dict(SNAPSHOT, input_shapes={"x": [
        {"shape": [8 + i, 8], "first": i, "last": i, "count": 1} for i in range(12)]})
    state.handle(MetricsSnapshot(0, 20, data))
    state.close(record(ok=False, r0="failed", r1="failed"))
    return state.view()


def test_html_colours_read_on_light_and_dark_themes():
    page = html.launch_html(full_view())
    assert "wall time per step" in page and "24 ms" in page  # a 24 ms step is not "0.0 s"
    # No fixed grey text (#444 on JupyterLab Dark is unreadable) and no light-only fill.
    for grey in ("#444", "#555", "#666", "#777", "#e8e8e8"):
        assert grey not in page
    # Coloured text names JupyterLab's theme colour, after a plain fallback.
    for match in re.finditer(r"(?<![-\w])color:(#[0-9a-f]{6});", page):
        assert page[match.end():].startswith("color:var(--jp-"), page[match.start():][:80]
    assert "color:var(--jp-error-color1,#d62728)" in page
    # Secondary text: JupyterLab's secondary text colour, a mid grey where it has none.
    assert "color:var(--jp-ui-font-color2,#7f7f7f)" in page and "opacity" not in page
    assert f"background:{html.TRACK}" in page


def test_input_shapes_row_says_when_more_exist():
    page = html.launch_html(full_view())
    row = re.search(r"input &#x27;x&#x27;</td><td[^>]*>([^<]*)</td>", page).group(1)
    assert row.startswith("(8, 8), (9, 8), ") and row.endswith(", … (12 shapes in all)")
    assert row.count("), (") == text.SHAPES_SHOWN - 1
    assert "input 'x' shapes: (8, 8), " in text.launch_text(full_view())
    assert "… (12 shapes in all)" in text.launch_text(full_view())


def test_metrics_panel_has_html_and_text():
    from hfxla_nb.observe import alerts, metrics

    summary = metrics.summarize(SNAPSHOT)
    panel = MetricsPanel(summary, alerts.analyze(summary), title="cell")
    assert "<table" in panel._repr_html_() and "20 executions" not in panel._repr_html_()
    assert "20 (1.0 s, 50 ms XLA per step)" in panel._repr_html_()
    assert repr(panel).startswith("cell\nXLA in 20 steps: 2 compiles")


# -- renderers -----------------------------------------------------------------------------------


def feed(display, clock_events=True):
    for rank in (0, 1):
        for event in train_events(rank, steps=4, total=4):
            display.handle(event)
    display.handle(MetricsSnapshot(0, 4, SNAPSHOT))
    display.refresh()
    display.handle(Finished(0, result=1))
    display.handle(Finished(1, result=1))
    display.close(record(ok=True, r0="finished", r1="finished"))


def test_console_prints_throttled_lines_and_final_state(capsys):
    display = ConsoleDisplay(2)
    for event in train_events(0, steps=2, total=4):
        display.handle(event)
    display.refresh()
    display.handle(Progress(0, 3, 4, {}))
    display.refresh()  # within min_interval: nothing printed
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("… running for ") and out[0].endswith(
        ": 1 of 2 ranks running, 0 finished")
    assert out[1].startswith("train [rank 0]   |") and " 2/4 · " in out[1]
    assert len(out) == 2
    display.min_interval = 0
    display.refresh()
    display.refresh()  # nothing new: nothing printed
    assert capsys.readouterr().out.count("\n") == 1
    display.close(record(ok=False, r0="failed", r1="pending"))
    final = capsys.readouterr().out
    assert final.startswith("✖ launch of 2 ranks failed after 4.0 s: rank 0: ValueError: bad")
    assert repr(display) == final.rstrip("\n")


# What the bars' HTML says of each bar (also what assistive technology reads).
BAR = re.compile(r'role="progressbar" aria-valuenow="(\d+)" aria-valuemin="0"'
                 r'(?: aria-valuemax="(\d+)")? aria-label="([^"]*)" data-state="(\w+)"')


def bars_of(value: str) -> list[tuple]:
    """(name, step, total, state) of every bar in a bars HTML."""
    return [(name, int(step), int(total) if total else None, state)
            for step, total, name, state in BAR.findall(value)]


def test_widget_display_state_without_a_browser():
    display = WidgetDisplay(2, attempt="attempt 2 of 3")
    status, bars, chart, metrics_html = display.widget.children
    assert bars.value == "" and "(attempt 2 of 3)" in status.value
    live = display._repr_mimebundle_()  # while it runs: the widget view and a text form
    assert live["application/vnd.jupyter.widget-view+json"]["model_id"] == (
        display.widget.model_id)
    assert live["text/plain"].startswith("… starting 2 ranks, ")  # what repr() says
    display.min_interval = 0
    for event in train_events(0, steps=2, total=4):
        display.handle(event)
    display.refresh()
    assert bars_of(bars.value) == [("train [rank 0]", 2, 4, "running")]
    assert "<b>2/4</b>" in bars.value and "loss=0.5" in bars.value
    assert "running" in status.value
    feed(display)
    state = widget_state(display.widget)
    assert [child["class"] for child in state["children"]] == ["HTML"] * 4
    assert bars_of(state["children"][1]["value"]) == [("train [rank 0]", 4, 4, "done"),
                                                      ("train [rank 1]", 4, 4, "done")]
    assert "finished" in status.value and html.COLORS["finished"] in status.value
    assert "<svg" in chart.value and "aten::nonzero" in metrics_html.value
    assert repr(display).startswith("✔ launch of 2 ranks finished in 4.0 s (attempt 2 of 3)")
    # Closed: displaying the panel again shows its final state as static HTML and text.
    bundle = display._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" not in bundle
    assert bundle["text/plain"] == repr(display)
    assert "✔ launch of 2 ranks finished" in bundle["text/html"] and "<svg" in bundle["text/html"]


def test_live_parts_are_the_final_panels_parts():
    """One geometry: each live widget holds exactly what the final panel shows in its place,
    so nothing can move when the launch ends (the browser tests measure it)."""
    display = WidgetDisplay(2)
    feed(display)
    final = html.launch_html(display.view)
    parts = "".join(child.value for child in display.widget.children)
    assert final == f'<div class="hfxla-launch" style="{html.PANEL}">{parts}</div>'
    # The live box is the final one: the same border and padding, JupyterLab's 20 px outside.
    assert display.widget.layout.margin == "0px 20px 0px 0px"
    assert display.widget.layout.padding == PADDING and display.widget.layout.border == BORDER
    assert f"border:{BORDER};" in html.PANEL and f"padding:{PADDING};" in html.PANEL
    assert all(child.layout.margin == "0px" for child in display.widget.children)


def test_widget_panel_ends_as_static_html_and_closes_its_widgets(monkeypatch):
    shown = Shown(monkeypatch)
    display = WidgetDisplay(2)
    kind, first = shown.calls[0]
    assert kind == "display" and "application/vnd.jupyter.widget-view+json" in first
    display.min_interval = 0
    for event in train_events(0, steps=2, total=4):
        display.handle(event)
    display.refresh()
    parts = [display.widget, display.status, display.bars, display.chart, display.metrics]
    assert all(widget.comm is not None for widget in parts)
    feed(display)
    # The saved notebook keeps the last update: static HTML and text, no widget view.
    kind, final = shown.calls[-1]
    assert kind == "update"
    assert set(final) == {"text/html", "text/plain"}
    assert final["text/plain"].startswith("✔ launch of 2 ranks finished")
    assert "✔ launch" in final["text/html"] and "aten::nonzero" in final["text/html"]
    # The widgets' comms are closed: no model is left for the page or the saved notebook.
    assert all(widget.comm is None for widget in parts)
    assert bars_of(widget_state(display.widget)["children"][1]["value"])[0][3] == "done"


def test_bars_keep_a_fixed_width_and_their_values_on_one_line():
    state = LaunchState(2, clock=Clock())
    state.handle(Progress(0, 1, 4, {"loss": 0.5}, time=T0 + 1))
    state.handle(Progress(1, 1, 4, {"loss": 123456.789, "lr": 1.6667e-4, "grad_norm": 1.5},
                          time=T0 + 1))
    page = html.bars_html(state.view().bars)
    assert page.count(f"width:{html.BAR_WIDTH}px;min-width:{html.BAR_WIDTH}px") == 2
    # One grid for every bar: captions share a column, the mark has its own.
    assert f"grid-template-columns:max-content 1.1em {html.BAR_WIDTH}px minmax(0,1fr)" in page
    pieces = re.findall(r'<span class="hfxla-stat" style="white-space:nowrap">(.*?)</span>'
                        r'(?= <span class="hfxla-stat"|</span>)', page)
    assert any("lr=1.7e-4" in piece for piece in pieces)
    assert any("loss=1.2e5" in piece for piece in pieces)


STATS_CELL = re.compile(r'<span class="hfxla-bar-stats" style="([^"]*)" title="([^"]*)">')


def test_a_bars_figures_keep_one_line_to_the_end_of_the_run():
    # Near the end of a run the figures are at their longest ("ETA 542 ms", a small loss, a
    # decayed lr): the stats cell holds them on one line, cut with an ellipsis, never wrapped.
    clock = Clock()
    display = WidgetDisplay(1)
    display.state = LaunchState(1, clock=clock)
    display.min_interval = 0
    display.handle(Started(0, 1, 100))
    seen = []
    for step in range(1, 301):
        clock.now = T0 + step * 0.058
        display.handle(Progress(0, step, 300, {"loss": 7.9e-4 * 300 / step, "lr": 1.5e-4},
                                samples=32 * step, time=clock.now))
        if step % 30 == 0 or step > 285:
            display.refresh(force=True)
            seen.append(widget_state(display.widget)["children"][1]["value"])
    assert any("ETA" in value and " ms" in value for value in seen)
    for value in seen:
        (style, title), = STATS_CELL.findall(value)
        for rule in ("white-space:nowrap", "overflow:hidden", "text-overflow:ellipsis",
                     "font-variant-numeric:tabular-nums"):
            assert rule in style, (rule, style)
        # The tooltip holds the whole line the cell may cut.
        assert "/300 · " in title and "elapsed" in title and "lr=1.5e-4" in title
    assert "288/300 · " in "".join(seen)


def test_widget_bars_without_total_and_failures():
    display = WidgetDisplay(1)
    display.handle(Progress(0, 7, None, {}))
    display.refresh(force=True)
    assert bars_of(display.bars.value) == [("train", 7, None, "running")]
    assert "width:100.0%" in display.bars.value  # unknown total: a full bar, like tqdm
    display.handle(Failed(0, "RuntimeError", "oom", ""))
    display.close(record(ok=False, r0="failed"))
    assert bars_of(display.bars.value) == [("train", 7, None, "failed")]
    assert "✖ launch failed" in display.status.value
    assert "the function raised RuntimeError" in display.status.value


def test_html_display_updates_one_output(monkeypatch):
    shown = []

    class Handle:
        def update(self, obj):
            shown.append(obj)

    def display(obj, display_id=None):
        assert display_id is True
        shown.append(obj)
        return Handle()

    monkeypatch.setattr("IPython.display.display", display)
    panel = HtmlDisplay(2)
    panel.min_interval = 0
    feed(panel)
    assert len(shown) >= 3
    final = shown[-1]
    assert "✔ launch of 2 ranks finished" in final._repr_html_()
    assert repr(final).startswith("✔ launch of 2 ranks finished")


# -- mode selection ------------------------------------------------------------------------------


def test_select_mode(monkeypatch):
    assert ui.select_mode("auto", notebook=False) == "console"
    assert ui.select_mode(True, notebook=True) == "widgets"
    assert ui.select_mode(False) == "none" and ui.select_mode(None) == "none"
    assert ui.select_mode("html") == "html"
    with pytest.raises(ValueError, match="mode='fancy'"):
        ui.select_mode("fancy")
    assert not ui.in_notebook()  # pytest is no kernel
    assert isinstance(launch_display(1, "none"), NullDisplay)
    assert isinstance(launch_display(1, False), NullDisplay)
    assert isinstance(launch_display(2), ConsoleDisplay)


def test_widgets_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import fails
    with pytest.raises(ImportError, match="mode='widgets' needs ipywidgets"):
        launch_display(1, "widgets")
    with pytest.warns(UserWarning, match="ipywidgets is not installed"):
        assert ui.select_mode("auto", notebook=True) == "html"


def test_old_ipywidgets_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", SimpleNamespace(__version__="7.5.1"))
    assert "too old" in ui.widgets_problem()
    monkeypatch.setitem(sys.modules, "ipywidgets", SimpleNamespace(__version__="7.7.1"))
    assert ui.widgets_problem() is None


# -- in a real kernel ----------------------------------------------------------------------------

KERNEL_SETUP = """
import json, time
from hfxla_nb.events import Started, Progress, Finished, Failed, MetricsSnapshot
from hfxla_nb.launch.supervision import LaunchRecord, RankRecord
from hfxla_nb.ui import launch_display
from hfxla_nb.ui.live import widget_state

def run(display, fail=False):
    display.min_interval = 0
    now = time.time()
    display.handle(Started(0, 1, 1))
    for step in range(1, 6):
        display.handle(Progress(0, step, 5, {"loss": 1.0 / step}, time=now + step * 0.1))
        display.refresh()
    display.handle(MetricsSnapshot(0, 5, {"counters": {"MarkStep": 5}, "metrics": {},
                                          "fallback_ops": []}))
    display.handle(Failed(0, "ValueError", "bad", "") if fail else Finished(0, 1))
    state = "failed" if fail else "finished"
    display.close(LaunchRecord("spmd", 1, [RankRecord(0, exit_state=state,
                                                      error="bad" if fail else None)],
                               duration=1.5, outcome=state))
    return display
"""


@pytest.mark.kernel
def test_panels_in_a_real_kernel():
    cells = run_notebook([
        KERNEL_SETUP,
        "d = run(launch_display(1))\nprint(type(d).__name__)\nprint(repr(d))",
        "print(json.dumps(widget_state(d.widget)))",
        "h = run(launch_display(1, 'html'), fail=True)",
        "launch_display(1, 'bogus')",
    ])
    assert error_of(cells[0]) is None
    out = stdout_of(cells[1]).splitlines()
    assert out[0] == "WidgetDisplay"  # auto in a kernel with ipywidgets
    assert out[1].startswith("✔ launch finished in 1.5 s")
    widget_bundles = bundles_of(cells[1])
    (bundle,) = widget_bundles
    # What nbconvert stores: the final state, updated in place by close(), as static HTML and
    # text (a widget view would show "model not found" once the notebook is reopened).
    assert "application/vnd.jupyter.widget-view+json" not in bundle
    assert bundle["text/plain"].startswith("✔ launch finished")
    assert "✔ launch finished" in bundle["text/html"]
    state = json.loads(stdout_of(cells[2]))
    assert state["children"][1]["class"] == "HTML"
    assert bars_of(state["children"][1]["value"]) == [("train", 5, 5, "done")]
    (html_bundle,) = bundles_of(cells[3])
    assert "✖ launch failed" in html_bundle["text/html"]
    assert "the function raised ValueError" in html_bundle["text/html"]
    assert html_bundle["text/plain"].startswith("✖ launch failed after 1.5 s")
    assert error_of(cells[4])["ename"] == "ValueError"


LAUNCHES = """
import time
import hfxla_nb as hx

def train(index, steps, fail_at):
    import torch, torch_xla
    dev = torch_xla.device()
    for step in range(1, steps + 1):
        x = torch.randn(16, 8, device=dev)
        hx.report(step=step, total=steps, loss=(x ** 2).mean(), inputs={"x": x})
        torch_xla.sync()
        time.sleep(0.01 * (index + 1))
        if step == fail_at:
            raise ValueError(f"boom at step {step}")
    return index
"""


def panel_outputs(output):
    """The launch panel's first display and its last update (by display_id)."""
    (first,) = [d for d in output.displays
                if "application/vnd.jupyter.widget-view+json" in d["data"]]
    display_id = first["transient"]["display_id"]
    updates = [u for u in output.updates if u["transient"]["display_id"] == display_id]
    return first, updates[-1]["data"]


@pytest.mark.kernel
def test_launch_panels_in_a_kernel_end_as_static_html_with_final_metrics():
    """Real launches in a real kernel: the live widget panel is replaced, at the end, by static
    HTML and text (what a saved notebook keeps), showing the final metrics: after a failure
    too, and for rank threads of one process, after every rank's work."""
    import textwrap

    from tests.helpers import Kernel

    kernel = Kernel()
    try:
        assert kernel.run(LAUNCHES).error is None
        done = kernel.run("hx.notebook_launcher(train, args=(30, 0))", timeout=180)
        assert done.error is None, done.error
        first, final = panel_outputs(done)
        assert "text/plain" in first["data"]  # live: the widget view, with a text form
        assert set(final) == {"text/html", "text/plain"}
        assert final["text/plain"].startswith("✔ launch finished in ")
        assert "XLA metrics in 30 steps" in final["text/html"]  # one rank: no "(rank 0)"
        assert "<b>30/30</b>" in final["text/html"]

        failed = kernel.run(textwrap.dedent("""
            try:
                hx.notebook_launcher(train, args=(150, 40))
            except Exception as error:
                print(type(error).__name__)
        """), timeout=180)
        assert failed.stdout.strip().endswith("LaunchError"), failed.text
        _, final = panel_outputs(failed)
        assert set(final) == {"text/html", "text/plain"}
        assert final["text/plain"].startswith("✖ launch failed")
        assert "\ntrain ✖ |" in final["text/plain"]
        assert "| 40/150 · " in final["text/plain"]
        # The metrics of the step it failed at, not of the last periodic snapshot.
        assert "XLA in 40 steps" in final["text/plain"]

        threads = kernel.run("import warnings; warnings.simplefilter('ignore')\n"
                             "hx.notebook_launcher(train, args=(30, 0), num_processes=4)",
                             timeout=180)
        assert threads.error is None, threads.error
        _, final = panel_outputs(threads)
        lines = final["text/plain"].splitlines()
        assert lines[0].startswith("✔ launch of 4 ranks finished in ")
        (xla,) = [line for line in lines if line.startswith("XLA (")]
        # One process's counters, all 4 rank threads' work (30 executions each), named so.
        assert xla.startswith("XLA (process of ranks 0-3) in 30 steps: ")
        assert " 120 executions " in xla
        assert "XLA metrics (process of ranks 0-3) in 30 steps" in final["text/html"]
    finally:
        kernel.close()


def test_an_evaluations_metrics_are_drawn_on_the_evaluation_bars_row():
    """Sent as late values of the training bar, an evaluation's metrics are drawn on the
    evaluation bar's row (at the end of the training bar's line they were cut off at
    1024 px); a run without an evaluation bar keeps them where they came."""
    state = LaunchState(1, clock=Clock())
    state.handle(Progress(0, 0, 4, label="eval", time=T0, waiting=True, starts="every 6 steps"))
    for step in range(1, 7):
        state.handle(Progress(0, step, 10, {"loss": 1 / step, "lr": 1e-3}, time=T0 + step))
    state.handle(Progress(0, 6, 10, {"eval_loss": 0.3, "eval_accuracy": 0.5}, late=True,
                          time=T0 + 6.5))
    train, evaluation = state.view().bars
    assert (train.label, evaluation.label) == ("train", "eval")
    assert set(train.values) == {"loss", "lr"}
    assert evaluation.values == {"eval_loss": 0.3, "eval_accuracy": 0.5}
    # Its metrics before its times: what the row is read for comes first.
    assert "0/4 · eval_loss=0.3 · eval_accuracy=0.5 · " in text.bar_line(evaluation)
    drawn = html.bar_stats_html(evaluation)
    assert drawn.index("eval_accuracy=0.5") < drawn.index("every 6 steps")
    alone = LaunchState(1, clock=Clock())
    alone.handle(Progress(0, 6, 10, {"loss": 0.2, "eval_loss": 0.3}, time=T0 + 6))
    (train,) = alone.view().bars
    assert set(train.values) == {"loss", "eval_loss"}
