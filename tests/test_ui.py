"""Panels: the state behind them, the text and HTML builders, the console, widget and HTML
renderers (widget state without a browser, and in a real kernel through nbclient)."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from hfxla_nb.events import Failed, Finished, Heartbeat, MetricsSnapshot, Progress, Started
from hfxla_nb.ui import NullDisplay, html, launch_display, modes, text
from hfxla_nb.ui.console import ConsoleDisplay
from hfxla_nb.ui.html_display import HtmlDisplay
from hfxla_nb.ui.metrics_panel import MetricsPanel
from hfxla_nb.ui.state import LaunchState
from hfxla_nb.ui.widgets import WidgetDisplay, widget_state
from tests.kernel_helpers import bundles_of, error_of, run_notebook, stdout_of

T0 = 1_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def record(ok=True, **ranks):
    """A launch record, duck-typed like launch.LaunchRecord."""
    rank_records = [SimpleNamespace(rank=int(r[1:]), exit_state=state, duration=1.0,
                                    result=None, error=None if state == "finished" else
                                    "ValueError: bad batch")
                    for r, state in ranks.items()]
    return SimpleNamespace(ok=ok, duration=4.0, ranks=rank_records)


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
    for event in train_events(steps=3, total=10):
        state.handle(event)
    clock.now = T0 + 1.5
    view = state.view()
    assert view.state == "running" and view.ranks == {0: "running", 1: "pending"}
    (bar,) = view.bars
    assert (bar.name, bar.step, bar.total, bar.state) == ("train [rank 0]", 3, 10, "running")
    assert bar.rate == pytest.approx(2.0) and bar.samples_rate == pytest.approx(16.0)
    assert bar.eta == pytest.approx(3.5)
    assert bar.elapsed == pytest.approx(1.5)
    assert bar.values == {"loss": pytest.approx(1 / 3), "lr": 0.001}
    assert bar.losses == [1.0, 0.5, pytest.approx(1 / 3)]
    assert bar.step_times == [pytest.approx(0.5)] * 2


def test_state_keeps_values_fetched_late_and_ignores_unknown_events():
    state = LaunchState(1, clock=Clock())
    state.handle(Progress(0, 10, 20, {}, time=T0 + 1))
    state.handle(Progress(0, 11, 20, {}, time=T0 + 2))
    state.handle(Progress(0, 10, 20, {"loss": 0.25}, time=T0 + 1))  # a step closure's values
    state.handle(SimpleNamespace(rank=0, code=9))  # e.g. the launcher's ProcessExited
    state.handle(Heartbeat(0))
    (bar,) = state.view().bars
    assert bar.step == 11 and bar.values == {"loss": 0.25} and bar.losses == [0.25]


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
        for event in train_events(rank, steps=2 if rank == 5 else 4, total=8):
            state.handle(event)
    (bar,) = state.view().bars
    assert bar.rank is None and bar.ranks == 8 and bar.step == 2  # the slowest rank
    assert bar.name == "train (8 ranks)"
    assert bar.samples_rate == pytest.approx(8 * 16.0)
    state.handle(Failed(5, "ValueError", "bad batch", "Traceback ..."))
    state.close(record(ok=False, r0="finished", r5="failed"))
    view = state.view()
    assert view.state == "failed" and view.bars[0].state == "failed"
    assert view.errors == ["rank 5: ValueError: bad batch"]  # not repeated from the record
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
    state.close(SimpleNamespace(ok=False, outcome="timeout"))
    assert state.view().state == "failed" and state.view().errors == ["launch timeout"]


def test_state_metrics_from_snapshots():
    state = LaunchState(1, clock=Clock())
    state.handle(MetricsSnapshot(0, 20, SNAPSHOT))
    view = state.view()
    assert view.metrics.compiles == 2 and view.metrics_rank == 0
    assert {alert.code for alert in view.alerts} == {"frequent-transfers", "cpu-fallback"}


# -- text ----------------------------------------------------------------------------------------


def test_text_formats():
    assert text.duration(3.21) == "3.2 s"
    assert text.duration(125) == "2 min 05 s"
    assert text.duration(3 * 3600 + 120) == "3 h 02 min"
    assert text.duration(None) == "?"
    assert text.size(None) == "n/a" and text.size(512) == "512 B"
    assert text.size(3 * 1024**3) == "3.0 GiB"
    assert text.rate(0.5, "it") == "2.00 s/it" and text.rate(12.34, "it") == "12.3 it/s"
    assert text.number(0.000012) == "1.200e-05" and text.number(0.4213) == "0.4213"


def test_text_panel_lines():
    state = LaunchState(1, clock=Clock())
    for event in train_events(steps=2, total=4):
        state.handle(event)
    state.handle(MetricsSnapshot(0, 20, SNAPSHOT))
    line = text.bar_line(state.view().bars[0], width=4)
    assert line.startswith("train [rank 0] |██░░| 2/4 50% ")
    assert "loss=0.5 lr=0.001" in line and "2 it/s" in line and "16 samples/s" in line
    whole = text.launch_text(state.view())
    assert "2 compiles (3.0 s), 20 executions (1.0 s), compile 75% / execute 25% (rank 0)" in whole
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
    state.handle(Failed(0, "ValueError", "<script>alert(1)</script>", ""))
    state.handle(MetricsSnapshot(0, 20, SNAPSHOT))
    state.close(record(ok=False, r0="failed"))
    page = html.launch_html(state.view())
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert html.COLORS["failed"] in html.status_html(state.view())
    assert "<svg" in page  # loss and step-time charts
    assert "CPU fallbacks" in page and "aten::nonzero x3" in page
    assert "Fix:" in page


def test_metrics_panel_has_html_and_text():
    from hfxla_nb import metrics

    summary = metrics.summarize(SNAPSHOT)
    panel = MetricsPanel(summary, metrics.analyze(summary), title="cell")
    assert "<table" in panel._repr_html_() and "20 executions" not in panel._repr_html_()
    assert "20 (1.0 s)" in panel._repr_html_()
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
    assert out[0].startswith("… running: 1 of 2 ranks running")
    assert out[1].startswith("train [rank 0] |") and " 2/4 " in out[1]
    assert len(out) == 2
    display.min_interval = 0
    display.refresh()
    display.refresh()  # nothing new: nothing printed
    assert capsys.readouterr().out.count("\n") == 1
    display.close(record(ok=False, r0="failed", r1="pending"))
    final = capsys.readouterr().out
    assert final.startswith("✖ failed after 4.0 s: rank 0: ValueError: bad batch")
    assert repr(display) == final.rstrip("\n")


def test_widget_display_state_without_a_browser():
    display = WidgetDisplay(2)
    status, bars, chart, metrics_html = display.widget.children
    assert bars.children == ()
    display.min_interval = 0
    for event in train_events(0, steps=2, total=4):
        display.handle(event)
    display.refresh()
    (row,) = bars.children
    progress, stats = row.children
    assert (progress.description, progress.value, progress.max, progress.bar_style) == (
        "train [rank 0]", 2, 4, "")
    assert "2/4" in stats.value and "loss=0.5" in stats.value
    assert "running" in status.value
    feed(display)
    state = widget_state(display.widget)
    bars_state = state["children"][1]["children"]
    assert [b["children"][0]["description"] for b in bars_state] == ["train [rank 0]",
                                                                      "train [rank 1]"]
    assert all(b["children"][0]["value"] == 4 and b["children"][0]["bar_style"] == "success"
               for b in bars_state)
    assert "finished" in status.value and html.COLORS["finished"] in status.value
    assert "<svg" in chart.value and "aten::nonzero" in metrics_html.value
    assert repr(display).startswith("✔ finished: 2 ranks in 4.0 s")
    bundle = display._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == (
        display.widget.model_id)
    assert bundle["text/plain"] == repr(display)


def test_widget_bars_without_total_and_failures():
    display = WidgetDisplay(1)
    display.handle(Progress(0, 7, None, {}))
    display.refresh(force=True)
    progress = display.bars.children[0].children[0]
    assert (progress.value, progress.max, progress.bar_style) == (1, 1, "info")
    display.handle(Failed(0, "RuntimeError", "oom", ""))
    display.close(record(ok=False, r0="failed"))
    assert progress.bar_style == "danger"
    assert "✖ failed" in display.status.value


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
    assert "✔ finished" in final._repr_html_() and repr(final).startswith("✔ finished")


# -- mode selection ------------------------------------------------------------------------------


def test_select_mode(monkeypatch):
    assert modes.select_mode("auto", notebook=False) == "console"
    assert modes.select_mode(True, notebook=True) == "widgets"
    assert modes.select_mode(False) == "none" and modes.select_mode(None) == "none"
    assert modes.select_mode("html") == "html"
    with pytest.raises(ValueError, match="mode='fancy'"):
        modes.select_mode("fancy")
    assert not modes.in_notebook()  # pytest is no kernel
    assert isinstance(launch_display(1, "none"), NullDisplay)
    assert isinstance(launch_display(1, False), NullDisplay)
    assert isinstance(launch_display(2), ConsoleDisplay)


def test_widgets_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import fails
    with pytest.raises(ImportError, match="mode='widgets' needs ipywidgets"):
        launch_display(1, "widgets")
    with pytest.warns(UserWarning, match="ipywidgets is not installed"):
        assert modes.select_mode("auto", notebook=True) == "html"


def test_old_ipywidgets_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", SimpleNamespace(__version__="7.5.1"))
    assert "too old" in modes.widgets_problem()
    monkeypatch.setitem(sys.modules, "ipywidgets", SimpleNamespace(__version__="7.7.1"))
    assert modes.widgets_problem() is None


# -- in a real kernel ----------------------------------------------------------------------------

KERNEL_SETUP = """
import json, time
from types import SimpleNamespace as NS
from hfxla_nb.events import Started, Progress, Finished, Failed, MetricsSnapshot
from hfxla_nb.ui import launch_display
from hfxla_nb.ui.widgets import widget_state

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
    display.close(NS(ok=not fail, duration=1.5,
                     ranks=[NS(rank=0, exit_state=state, error="bad" if fail else None)]))
    return display
"""


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
    assert out[1].startswith("✔ finished: 1 rank in 1.5 s")
    widget_bundles = bundles_of(cells[1])
    (bundle,) = widget_bundles
    assert "model_id" in bundle["application/vnd.jupyter.widget-view+json"]
    # What nbconvert stores: the final state, updated in place by close().
    assert bundle["text/plain"].startswith("✔ finished")
    state = json.loads(stdout_of(cells[2]))
    progress = state["children"][1]["children"][0]["children"][0]
    assert (progress["class"], progress["value"], progress["max"], progress["bar_style"]) == (
        "IntProgress", 5, 5, "success")
    (html_bundle,) = bundles_of(cells[3])
    assert "✖ failed" in html_bundle["text/html"] and "ValueError: bad" in html_bundle["text/html"]
    assert html_bundle["text/plain"].startswith("✖ failed after 1.5 s")
    assert error_of(cells[4])["ename"] == "ValueError"
