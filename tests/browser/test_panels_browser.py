"""The live launch panels as a person sees them: JupyterLab in Chromium, light and dark theme.

Each test runs a tiny notebook (a few seconds of XLA on the CPU) through Run > Run All Cells
in a 1024 px wide notebook (file browser closed) and reads the page. While a launch runs, its
panel is an ipywidgets view (HTML widgets); when it ends, static HTML (`ui.html.launch_html`,
class `hfxla-launch`) replaces it. Both are built from the same parts, so each part must keep
its box: the tests measure them live (mid-run) and final, and save screenshots of both
(`<name>-live-<theme>-cell<N>.png` while it runs, `<name>-<theme>-cell<N>.png` at the end).
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

ZERO_BASED = """\
def train():
    import torch
    import torch_xla
    device = torch_xla.device()
    for i in range(60):  # reports i: the steps count from 0
        x = torch.randn(8, 8, device=device)
        hx.report(step=i, total=60, loss=x.sum() * 0 + i)  # the loss is the step
        torch_xla.sync()

hx.notebook_launcher(train, num_processes=1)
"""

RECOMPILING = """\
import time

def train():
    import torch
    import torch_xla
    device = torch_xla.device()
    for step in range(1, 61):
        x = torch.randn(8, 4 + step % 12, device=device)  # a new shape: a new graph
        hx.report(step=step, total=60, loss=(x ** 2).mean(), inputs={"x": x})
        torch_xla.sync()
        time.sleep(0.05)

hx.notebook_launcher(train, num_processes=1)
"""

FAILING = """\
import time

def train():
    import torch
    import torch_xla
    device = torch_xla.device()
    for step in range(1, 61):
        x = torch.randn(8, 8, device=device)
        hx.report(step=step, total=60, loss=(x ** 2).mean())
        torch_xla.sync()
        time.sleep(0.1)
        if step == 30:
            raise ValueError("boom")

hx.notebook_launcher(train, num_processes=1)
"""

ONE_RANK_FAILS = """\
import time

def train(index):
    for step in range(1, 21):
        time.sleep(0.2)
        if index == 1 and step == 8:
            raise ValueError("rank 1 gives up")
        hx.report(step=step, total=20)

hx.notebook_launcher(train, num_processes=2, strategy="debug")
"""

SPMD_SHAPES = """\
def train(index):
    import numpy as np
    import torch, torch_xla
    import torch_xla.runtime as xr
    import torch_xla.distributed.spmd as xs
    device = torch_xla.device()
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (n,), ("data",))
    for step in range(12):  # 12 shapes: 12 compilations, each with XLA's GSPMD warning
        x = torch.ones(4 * (step + 1), 8, device=device)
        xs.mark_sharding(x, mesh, ("data", None))
        loss = (x * 2).sum()
        torch_xla.sync()
        hx.report(step=step + 1, total=12, loss=loss)

hx.configure(cores=4)
hx.notebook_launcher(train, strategy="spmd")
"""

FINE_TUNE_DATA = """\
from hfxla_nb.demo import demo_dataset, demo_model_dir
folder, data = demo_model_dir(), demo_dataset(n=1200)
"""
FINE_TUNE = """\
result = hx.fine_tune(folder, data, epochs=2, batch_size=32, learning_rate=4e-3,
                      output_dir=None, log_every=5, num_processes=1)
"""

TQDM = """\
def train():
    import time
    from tqdm.auto import tqdm  # inside the function: the worker's tqdm reports to the panel
    for _ in tqdm(range(20)):
        time.sleep(0.01)

hx.notebook_launcher(train, num_processes=1)
"""

# The panel's parts, the same classes live (in the widgets) and final (in the static HTML).
LIVE = ".jupyter-widgets "
FINAL = ".hfxla-launch "
PARTS = {"status": ".hfxla-status", "name": ".hfxla-bar-name", "mark": ".hfxla-bar-mark",
         "track": ".hfxla-bar-track", "stats": ".hfxla-bar-stats", "pieces": ".hfxla-stat",
         "chart": ".hfxla-chart", "metrics": ".hfxla-metrics", "rows": ".hfxla-metrics tr"}
SPINNERS = ".jp-Spinner, .fa-spin, [class*='spinner'], [class*='Spinner']"
TRANSPARENT = ("rgba(0, 0, 0, 0)", "transparent")


def assert_settled(nb) -> None:
    """After the end: no "running", no spinner, no widget placeholder anywhere on the page."""
    body = nb.page.locator("body").inner_text()
    assert "running" not in body.lower(), body
    assert "Loading widget" not in body
    assert nb.page.locator(SPINNERS).count() == 0
    assert nb.kernel_idle()


def geometry(nb, cell: int, scope: str) -> dict[str, list[dict]]:
    """Every part's boxes in cell `cell`'s panel (`scope`: LIVE or FINAL), rounded."""
    found = {}
    for name, selector in PARTS.items():
        boxes = nb.measure(cell, scope + selector)
        found[name] = [{key: round(value, 1) if isinstance(value, float) else value
                        for key, value in box.items()} for box in boxes]
    return found


def step_of(boxes: list[dict]) -> int | None:
    """The first bar's step, from its stats ("21/60 (35%) ...")."""
    match = re.match(r"\s*(\d+)", boxes[0]["text"]) if boxes else None
    return int(match.group(1)) if match else None


def run_live_and_final(browser_lab, name: str, cells: list[str], cell: int,
                       ready=lambda step: step is not None and step >= 20,
                       timeout: float = 180.0) -> dict:
    """Run `cells`; while cell `cell` runs, once `ready(step)` holds, measure its live panel
    and screenshot it; at the end measure the final panel. Saved as <name>-<theme>.json."""
    seen: dict = {"theme": browser_lab.theme}

    def poll(nb) -> None:
        if "live" in seen:
            return
        stats = nb.measure(cell, LIVE + PARTS["stats"])
        if stats and ready(step_of(stats)):
            seen["live"] = geometry(nb, cell, LIVE)
            nb.screenshot(browser_lab.artifacts, f"{name}-live-{browser_lab.theme}", [cell])

    with browser_lab.notebook(name, cells, timeout=timeout, poll=poll) as nb:
        seen["final"] = geometry(nb, cell, FINAL)
        seen["text"] = nb.output_text(cell)
        seen["texts"] = [nb.output_text(i) for i in range(len(cells))]
        assert_settled(nb)
    path = browser_lab.artifacts / f"{name}-{browser_lab.theme}.json"
    path.write_text(json.dumps(seen, indent=2, ensure_ascii=False))
    return seen


def assert_same_box(live: dict, final: dict, keys=("rx", "ry", "width", "height")) -> None:
    for key in keys:
        assert abs(live[key] - final[key]) <= 0.5, (key, live, final)


def assert_nothing_wraps(boxes: list[dict]) -> None:
    """No piece of a bar's stats (a count, a time, `lr=1.7e-4`) is broken across lines."""
    wrapped = [box["text"] for box in boxes if box["wraps"]]
    assert not wrapped, wrapped


# -- one geometry for the live and the final panel ----------------------------------------------


@pytest.fixture(scope="module")
def loop_panel(browser_lab):
    """A slow 60-step loop, measured between steps 20 and 50 and after the end."""
    return run_live_and_final(browser_lab, "geometry", [SETUP, LOOP.format(delay=0.1)], 1,
                              ready=lambda step: step is not None and 20 <= step <= 50)


def test_bar_keeps_its_width_when_the_launch_ends(loop_panel):
    assert "live" in loop_panel, "the live panel was never seen between steps 20 and 50"
    live, final = loop_panel["live"], loop_panel["final"]
    print(json.dumps({"live": live["track"], "final": final["track"]}, indent=2))
    (live_track,), (final_track,) = live["track"], final["track"]
    assert final_track["width"] == 150
    assert_same_box(live_track, final_track)
    for part in ("status", "name", "mark", "chart"):
        (live_box,), (final_box,) = live[part], final[part]
        assert_same_box(live_box, final_box)


def test_rows_keep_their_height_and_no_stripes_appear(loop_panel):
    live, final = loop_panel["live"], loop_panel["final"]
    (live_stats,), (final_stats,) = live["stats"], final["stats"]
    assert not live_stats["wraps"] and not final_stats["wraps"], (live_stats, final_stats)
    assert_same_box(live_stats, final_stats, keys=("ry", "height"))
    assert len(live["rows"]) == len(final["rows"]) >= 5
    for live_row, final_row in zip(live["rows"], final["rows"], strict=True):
        assert_same_box(live_row, final_row, keys=("rx", "ry", "height"))
        assert live_row["background"] in TRANSPARENT and final_row["background"] in TRANSPARENT


def test_loop_ends_at_60_of_60_with_its_last_values(loop_panel):
    text = loop_panel["text"]
    assert text.startswith("✔ launch finished in "), text
    (stats,) = loop_panel["final"]["stats"]
    assert stats["text"].startswith("60/60 · "), stats
    assert [box["text"] for box in loop_panel["final"]["mark"]] == ["✔"]
    assert [box["text"] for box in loop_panel["final"]["name"]] == ["train"]  # one rank
    assert re.search(r"\bloss=\d", stats["text"]), stats  # fetched when the function returned
    assert "XLA metrics in 60 steps" in text
    assert_nothing_wraps(loop_panel["live"]["pieces"] + loop_panel["final"]["pieces"])


def test_steps_counted_from_zero_end_at_their_total_everywhere(browser_lab):
    with browser_lab.notebook("zero_based", [SETUP, ZERO_BASED]) as nb:
        text = nb.output_text(1)
        (stats,) = nb.measure(1, FINAL + PARTS["stats"])
        (mark,) = nb.measure(1, FINAL + PARTS["mark"])
        # step=i reports i + 1 steps done: 60/60, as tqdm(range(60)) ends, and the metrics too.
        assert stats["text"].startswith("60/60 · ") and mark["text"] == "✔", (stats, mark)
        assert stats["text"].endswith("loss=59"), stats  # the values of the real last step
        assert "XLA metrics in 60 steps" in text and "step=i + 1" not in text, text
        assert_settled(nb)


def test_a_rank_stopped_because_another_failed_looks_stopped(browser_lab):
    seen = run_live_and_final(browser_lab, "stopped", [SETUP, ONE_RANK_FAILS], 1,
                              ready=lambda step: step is not None and step >= 5)
    text = seen["text"]
    assert "✖ launch of 2 ranks failed after" in text and "rank 1 raised ValueError" in text
    assert [box["text"] for box in seen["final"]["mark"]] == ["■", "✖"], seen["final"]["mark"]
    stopped, failed = seen["final"]["stats"]
    assert "stopped after" in stopped["text"] and "elapsed" not in stopped["text"], stopped
    assert "elapsed" in failed["text"], failed


def test_a_repeated_xla_warning_is_one_muted_line_of_whole_words(browser_lab):
    stderr = '[data-mime-type="application/vnd.jupyter.stderr"]'
    with browser_lab.notebook("gspmd", [SETUP, SPMD_SHAPES]) as nb:
        text = nb.output_text(1)
        (block,) = nb.measure(1, stderr)
        nb.screenshot(browser_lab.artifacts, f"gspmd-{browser_lab.theme}", [1])
        assert_settled(nb)
    # One muted line per kind with its count, no raw timestamp, wrapped at spaces by the relay
    # so that the browser breaks no word of it.
    assert text.count("GSPMD sharding") == 1, text
    assert "XLA warning ×12 (sharding_propagation.cc:3120)" in text, text
    assert not re.search(r"\d\d:\d\d:\d\d\.\d{6}", text), text
    lines = block["text"].strip("\n").count("\n") + 1
    assert lines == 2 and round(block["height"] / block["lineHeight"]) <= lines + 1, block


# -- a recompiling loop, a failure, a fine-tune: live and final, each screenshotted -------------


def test_recompiling_loop_warns_and_names_tensor_shapes(browser_lab):
    seen = run_live_and_final(browser_lab, "recompiling", [SETUP, RECOMPILING], 1)
    assert "live" in seen, "the live panel was never seen past step 20"
    text = seen["text"]
    assert "⚠" in text and "after warm-up" in text, text
    assert "torch.nn.functional.pad" in text and "tokenizer(" not in text, text
    assert "input 'x'" in text
    assert_nothing_wraps(seen["live"]["pieces"] + seen["final"]["pieces"])
    assert_same_box(seen["live"]["track"][0], seen["final"]["track"][0])


def test_failure_says_its_message_once_without_launcher_frames(browser_lab):
    seen = run_live_and_final(browser_lab, "failure", [SETUP, FAILING], 1,
                              ready=lambda step: step is not None and step >= 10)
    text = seen["text"]
    assert "✖ launch failed after" in text and "the function raised ValueError" in text, text
    # The LaunchError's line and the remote traceback's own last line, nothing else.
    assert text.count("ValueError: boom") == 2, text
    assert text.rstrip().endswith("ValueError: boom"), text
    assert "LaunchError" in text and 'raise ValueError("boom")' in text, text
    assert "run_rank" not in text and "worker.py" not in text, text
    (stats,) = seen["final"]["stats"]
    assert stats["text"].startswith("30/60"), stats
    assert [box["text"] for box in seen["final"]["mark"]] == ["✖"]


def test_fine_tune_bar_values_stay_on_one_line(browser_lab):
    seen = run_live_and_final(
        browser_lab, "fine_tune", [SETUP, FINE_TUNE_DATA, FINE_TUNE, "result"], 2,
        ready=lambda step: step is not None and step >= 25, timeout=400)
    assert "live" in seen, "the fine-tune's live bar was never seen past step 25"
    live, final = seen["live"], seen["final"]
    live_train = live["stats"][0]["text"]
    lr = re.search(r"\blr=(\S+)", live_train)
    assert lr and len(lr.group(1)) <= 6, live_train  # compact: `lr=0.0012`, `lr=1.7e-4`
    assert_nothing_wraps(live["pieces"] + final["pieces"])
    assert not any(box["wraps"] for box in live["stats"] + final["stats"])
    assert_same_box(live["track"][0], final["track"][0])
    final_train = final["stats"][0]["text"]
    # Its rate is the mean after the warm-up, as the result's samples_per_second counts it.
    assert final_train.startswith("60/60 · ") and "after warm-up" in final_train
    assert not re.search(r"\blr=0\b", final_train), final_train
    panel = seen["texts"][3]
    assert "launch" in panel and "training loop" in panel and "evaluation" in panel, panel
    assert "after warm-up" in panel and "over the whole training loop" in panel, panel
    assert "warning" not in panel, panel  # this one learns


def test_tqdm_inside_the_function_reaches_its_total(browser_lab):
    with browser_lab.notebook("tqdm_bar", [SETUP, TQDM]) as nb:
        names = [box["text"] for box in nb.measure(1, FINAL + PARTS["name"])]
        stats = [box["text"] for box in nb.measure(1, FINAL + PARTS["stats"])]
        assert names == ["tqdm"] and stats[0].startswith("20/20 · "), (names, stats)
        assert_nothing_wraps(nb.measure(1, FINAL + PARTS["pieces"]))
        # The function never ran an XLA graph: no metrics panel of zeros.
        assert "compiles" not in nb.output_text(1)
        assert_settled(nb)
