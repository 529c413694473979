"""The live launch panels as a person sees them: JupyterLab in Chromium, light and dark theme.

Each test runs a tiny notebook (a few seconds of XLA on the CPU) through Run > Run All Cells
and reads the page. While a launch runs, its panel is an ipywidgets view (a progress widget per
bar); when it ends, static HTML (`ui.html.launch_html`, class `hfxla-launch`) replaces it.
"""

from __future__ import annotations

import json
import os
import re

import pytest

pytest.importorskip("playwright.sync_api", reason="pip install -r requirements-browser.txt")
if not os.access("/usr/bin/chromium", os.X_OK):
    pytest.skip("no /usr/bin/chromium (apt-get install chromium)", allow_module_level=True)

SETUP = "import hfxla_nb as hx\nfrom tqdm.auto import tqdm"

LOOP = """\
import time

def train():
    import torch
    import torch_xla
    device = torch_xla.device()
    for step in range(1, 61):
        x = torch.randn(8, 8, device=device)
        hx.report(step=step, total=60, loss=(x ** 2).mean())  # an XLA tensor, never fetched
        torch_xla.sync()
        time.sleep({delay})

hx.notebook_launcher(train, num_processes=1)
"""

FAILING = """\
def train(index):
    if index == 0:
        raise ValueError("boom")

hx.notebook_launcher(train, num_processes=1)
"""

TQDM = """\
def train():
    import time
    from tqdm.auto import tqdm  # inside the function: the worker's tqdm reports to the panel
    for _ in tqdm(range(20)):
        time.sleep(0.01)

hx.notebook_launcher(train, num_processes=1)
"""

# The bar rows. Live: an HBox of the IntProgress (label and track) and an HTML widget with the
# stats. Final: a flex row of caption, track (a fixed-width span) and stats.
LIVE_ROW = ".widget-hbox:has(> .widget-hprogress)"
LIVE_BAR = LIVE_ROW + " .widget-hprogress .progress"
LIVE_STATS = LIVE_ROW + " .widget-html-content > span"
FINAL_ROW = ".hfxla-launch > div[style*='display:flex']"
FINAL_BAR = FINAL_ROW + " > span:nth-child(2) > span"
FINAL_STATS = FINAL_ROW + " > span:nth-child(3) > span"
SPINNERS = ".jp-Spinner, .fa-spin, [class*='spinner'], [class*='Spinner']"


def assert_settled(nb) -> None:
    """After the end: no "running", no spinner, no widget placeholder anywhere on the page."""
    body = nb.page.locator("body").inner_text()
    assert "running" not in body.lower(), body
    assert "Loading widget" not in body
    assert nb.page.locator(SPINNERS).count() == 0
    assert nb.kernel_idle()


def test_launched_loop_ends_with_the_total_and_a_compile_count(browser_lab):
    with browser_lab.notebook("launched_loop", [SETUP, LOOP.format(delay=0.01)]) as nb:
        text = nb.output_text(1)
        assert text.startswith("✔ finished: 1 rank"), text
        (row,) = nb.measure(1, FINAL_ROW)
        assert "train [rank 0] ✔" in row["text"] and "60/60 (100%)" in row["text"], row
        compiles = re.search(r"compiles\s+(\d+) \(", text)
        assert compiles and int(compiles.group(1)) >= 1, text
        assert "XLA metrics (rank 0) in 60 steps" in text
        assert_settled(nb)


def test_failing_launch_names_rank_and_exception(browser_lab):
    with browser_lab.notebook("failing_launch", [SETUP, FAILING]) as nb:
        text = nb.output_text(1)
        assert "✖ failed" in text, text
        assert "rank 0" in text and "ValueError: boom" in text, text
        assert "LaunchError" in text, text  # the cell raised it, with the remote traceback
        assert_settled(nb)


def test_tqdm_inside_the_function_reaches_its_total(browser_lab):
    with browser_lab.notebook("tqdm_bar", [SETUP, TQDM]) as nb:
        rows = [row["text"] for row in nb.measure(1, FINAL_ROW)]
        tqdm_rows = [row for row in rows if row.startswith("tqdm")]
        assert tqdm_rows and "20/20 (100%)" in tqdm_rows[0], rows
        assert_settled(nb)
        # A measurement, not an assertion: which stats of the row wrap at 1024 px.
        wrapped = nb.wrapped(1, f"{FINAL_STATS}, {FINAL_STATS} *")
        print("tqdm row, wrapped:", [f"{v['tag']}: {v['text']!r}" for v in wrapped])


# -- geometry of the bar row at 1024 px ----------------------------------------------------------


def _row_geometry(nb, row: str, bar: str, stats: str) -> dict:
    (row_box,) = nb.measure(1, row)
    (bar_box,) = nb.measure(1, bar)
    values = nb.measure(1, f"{stats}, {stats} *")  # the stats line, then each value in it
    return {"row_width": round(row_box["width"], 1), "bar_width": round(bar_box["width"], 1),
            "bar_x": round(bar_box["x"], 1), "stats": values[0]["text"],
            "stats_height": round(values[0]["height"], 1),
            "line_height": round(values[0]["lineHeight"], 1),
            "wrapped": [f"{v['tag']}: {v['text']!r}" for v in values if v["wraps"]]}


@pytest.fixture(scope="module")
def bar_geometry(browser_lab):
    """The bar row's geometry mid-run (the widget, at step 20 to 50 of 60) and after the end
    (the static HTML), one slow launch per theme; also saved as geometry-<theme>.json."""
    geometry: dict = {"theme": browser_lab.theme}

    def poll(nb) -> None:
        if "live" in geometry or not nb.measure(1, LIVE_BAR):
            return
        stats = nb.measure(1, LIVE_STATS)
        step = re.match(r"\s*(\d+)/60", stats[0]["text"]) if stats else None
        if step and 20 <= int(step.group(1)) <= 50:
            geometry["live"] = dict(_row_geometry(nb, LIVE_ROW, LIVE_BAR, LIVE_STATS),
                                    step=int(step.group(1)))
            nb.screenshot(browser_lab.artifacts, f"geometry-live-{browser_lab.theme}", [1])

    with browser_lab.notebook("geometry", [SETUP, LOOP.format(delay=0.1)], poll=poll) as nb:
        geometry["final"] = _row_geometry(nb, FINAL_ROW, FINAL_BAR, FINAL_STATS)
    path = browser_lab.artifacts / f"geometry-{browser_lab.theme}.json"
    path.write_text(json.dumps(geometry, indent=2, ensure_ascii=False))
    return geometry


def test_bar_geometry_live_and_final(bar_geometry):
    """A measurement: printed (and in artifacts/browser/geometry-<theme>.json)."""
    print(json.dumps(bar_geometry, indent=2, ensure_ascii=False))
    assert "live" in bar_geometry, "the live widget row was never seen between steps 20 and 50"
    live, final = bar_geometry["live"], bar_geometry["final"]
    assert live["bar_width"] > 0 and final["bar_width"] > 0
    assert final["stats"].startswith("60/60")


@pytest.mark.xfail(strict=True, reason=(
    "measured at 1024 px (file browser open, both themes): the live IntProgress track is "
    "172.4 px wide at x=474 (45% of a 592 px row, less its label), the final static bar a "
    "fixed 200 px at x=500.2: the bar jumps in width and place when the launch ends"))
def test_bar_keeps_its_width_when_the_launch_ends(bar_geometry):
    live, final = bar_geometry["live"], bar_geometry["final"]
    assert abs(live["bar_width"] - final["bar_width"]) <= 1, (live, final)
