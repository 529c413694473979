"""Five panel figures read from the page in JupyterLab + Chromium, light and dark theme, while
the cells run and at their end: the recompile alert of a loop that reports only its step and
loss, bar figures that keep one line to the end of a run, the evaluation bar's elapsed time,
the final median wall time per step, and a LoRA fine-tune without a stderr block.

One notebook per theme runs every cell once (a growing loop, a long-figured loop, a small
fine-tune and its result, a small LoRA fine-tune); each test reads its part of what the
module fixture saw. The figures of each poll are saved as `panel-fixes-<theme>.json` beside
the screenshots (`panel-fixes-<theme>-cell<N>.png`, and `-live-` ones taken mid-run).
"""

from __future__ import annotations

import json
import re

import pytest

from .test_live_trust import elapsed_seconds
from .test_panels_browser import FINAL, LIVE, PARTS, SETUP, assert_settled, step_of

# The README's idiom: only step and loss, no total and no inputs=. The batch grows every 8
# steps, so the step's line compiles a new graph every 8 steps, the last step's too (64).
GROWING = """\
import time

def train():
    import torch, torch_xla
    device = torch_xla.device()
    weight = torch.ones(8, 8, device=device)
    for step in range(1, 65):
        x = torch.ones(2 + step // 8, 8).to(device)  # the batch grows every 8 steps
        loss = (x @ weight).mean()
        weight = weight - 0.01 * loss
        hx.report(step=step, loss=loss)
        torch_xla.sync()
        time.sleep(0.05)

hx.notebook_launcher(train, num_processes=1)
"""
SYNC_LINE = GROWING.splitlines().index("        torch_xla.sync()") + 1

# Figures at their longest near the end: `288/300 · 9.1 s elapsed · ETA 542 ms · 31.2 it/s,
# 998 samples/s · loss=7.9e-4 · lr=1.5e-4`.
LONG_FIGURES = """\
import time

def train():
    import torch, torch_xla
    device = torch_xla.device()
    for step in range(1, 301):
        x = torch.full((8, 8), 7.9e-4 * 300 / step, device=device)
        hx.report(step=step, total=300, samples=32 * step, loss=x.mean(), lr=1.5e-4)
        torch_xla.sync()
        time.sleep(0.03)

hx.notebook_launcher(train, num_processes=1)
"""

FINE_TUNE = """\
from hfxla_nb.demo import demo_dataset, demo_model_dir
result = hx.fine_tune(demo_model_dir(), demo_dataset(n=1200), epochs=2, batch_size=32,
                      learning_rate=4e-3, output_dir=None, log_every=5, num_processes=1)
"""

# FSDPv2 on one device: its backward hook on the first layer, fed by the frozen embedding,
# and peft's wrapping both warned in a stderr block before. (Over several devices XLA's own
# GSPMD notice is said there too, one muted line, as every SPMD launch's: docs/launcher.md.)
LORA = """\
from hfxla_nb.demo.lm import TEMPLATE, demo_lm_dataset, demo_lm_model_dir
lora = hx.fine_tune(demo_lm_model_dir(), demo_lm_dataset(n=128), prompt_column="prompt",
                    response_column="response", template=TEMPLATE, max_length=64, epochs=1,
                    batch_size=16, max_steps=8, log_every=4, learning_rate=1e-2,
                    sharding="fsdp", lora=True, num_processes=1, output_dir=None)
"""

# Evaluation every 5 steps, the "best" model the one with the highest loss (an early one),
# early stopping after 2 evaluations without a higher: it stops long before step 120.
EARLY = """\
from transformers import EarlyStoppingCallback
early = hx.fine_tune(demo_model_dir(), demo_dataset(n=1200), max_steps=120, batch_size=32,
                     learning_rate=4e-3, output_dir=None, log_every=5, num_processes=1,
                     eval_strategy="steps", eval_steps=5, metric_for_best_model="loss",
                     greater_is_better=True, load_best_model_at_end=True,
                     callbacks=[EarlyStoppingCallback(early_stopping_patience=2)])
"""

CELLS = [SETUP, GROWING, LONG_FIGURES, FINE_TUNE, "result", LORA, EARLY]
GROWING_CELL, LONG_CELL, FINE_TUNE_CELL, RESULT_CELL, LORA_CELL, EARLY_CELL = 1, 2, 3, 4, 5, 6
STDERR = '[data-mime-type="application/vnd.jupyter.stderr"]'
UNITS = {"µs": 1e-6, "ms": 1e-3, "s": 1.0}


def seconds(figure: str, unit: str) -> float:
    return float(figure) * UNITS[unit]


def recompile_alert(text: str) -> str | None:
    """The panel's "⚠ Recompiling: `train` in cell 2, line 12 compiled 7 different graphs
    in 64 steps" line, or None."""
    match = re.search(r"⚠ Recompiling: [^\n]*", text)
    return match.group(0) if match else None


def step_time_per_step(stats: str) -> float | None:
    """A bar's mean step time from its rate: `31.2 it/s` -> 0.032; `1.20 s/it` -> 1.2."""
    match = re.search(r"(\d[\d,]*(?:\.\d+)?) it/s", stats)
    if match:
        return 1 / float(match.group(1).replace(",", ""))
    match = re.search(r"([\d.]+) s/it", stats)
    return float(match.group(1)) if match else None


def median_step_time(chart: str) -> float | None:
    """The final chart's `median wall time per step 31.9 ms`, in seconds."""
    match = re.search(r"median wall time per step\s*([\d.]+) (µs|ms|s)\b", chart)
    return seconds(*match.groups()) if match else None


@pytest.fixture(scope="module")
def panel_fixes(browser_lab):
    """Run the notebook once per theme and keep what the page showed, live and final."""
    seen: dict = {"theme": browser_lab.theme, "growing_live": [], "long_live": [],
                  "fine_tune_live": []}
    theme = browser_lab.theme

    def poll(nb) -> None:
        # The fine-tune cell's first line from its start (the cell before it done) on.
        prompts = nb.prompts()
        if prompts[FINE_TUNE_CELL] == "[*]:" and prompts[FINE_TUNE_CELL - 1] != "[*]:":
            height = (nb.output(FINE_TUNE_CELL).bounding_box() or {}).get("height", 0)
            text = nb.output_text(FINE_TUNE_CELL)
            seen.setdefault("fine_tune_heights", []).append(
                (round(height, 1), text.strip().splitlines()[0] if text.strip() else ""))
        for cell, key in ((GROWING_CELL, "growing_live"), (LONG_CELL, "long_live"),
                          (FINE_TUNE_CELL, "fine_tune_live")):
            stats = nb.measure(cell, LIVE + PARTS["stats"])
            step = step_of(stats)
            if step is None:
                continue
            box = nb.output(cell).bounding_box() or {}
            bars = nb.measure(cell, LIVE + ".hfxla-bars")
            sample = {"step": step, "stats": [s["text"] for s in stats],
                      "stats_height": [round(s["height"], 1) for s in stats],
                      "stats_wrap": [s["wraps"] for s in stats],
                      "bars_height": round(bars[0]["height"], 1) if bars else None,
                      "panel_height": round(box.get("height", 0), 1),
                      "chart": [b["text"] for b in nb.measure(cell, LIVE + PARTS["chart"])]}
            if cell == GROWING_CELL:
                sample["alert"] = recompile_alert(nb.output_text(cell))
                if sample["alert"] and not any(s.get("alert") for s in seen[key]):
                    nb.screenshot(browser_lab.artifacts, f"panel-fixes-live-{theme}", [cell])
            if cell == LONG_CELL and step >= 270 and not seen.get("long_shot"):
                seen["long_shot"] = step
                nb.screenshot(browser_lab.artifacts, f"panel-fixes-live-{theme}", [cell])
            seen[key].append(sample)

    with browser_lab.notebook("panel-fixes", CELLS, timeout=600, poll=poll) as nb:
        seen["texts"] = [nb.output_text(i) for i in range(len(CELLS))]
        for cell, key in ((GROWING_CELL, "growing"), (LONG_CELL, "long"),
                          (FINE_TUNE_CELL, "fine_tune")):
            seen[key] = {
                "names": [b["text"] for b in nb.measure(cell, FINAL + PARTS["name"])],
                "stats": [b["text"] for b in nb.measure(cell, FINAL + PARTS["stats"])],
                "stats_height": [b["height"] for b in nb.measure(cell, FINAL + PARTS["stats"])],
                "chart": [b["text"] for b in nb.measure(cell, FINAL + PARTS["chart"])],
                "panel_height": (nb.output(cell).bounding_box() or {}).get("height"),
            }
        seen["early"] = {
            "stats": nb.measure(EARLY_CELL, FINAL + PARTS["stats"]),
            "pieces": nb.measure(EARLY_CELL, FINAL + PARTS["pieces"]),
            "legend": [b["text"] for b in nb.measure(EARLY_CELL, FINAL + ".hfxla-legend")],
            "text": nb.output_text(EARLY_CELL)}
        nb.screenshot(browser_lab.artifacts, f"panel-fixes-early-stop-{theme}", [EARLY_CELL])
        seen["stderr"] = {cell: [b["text"] for b in nb.measure(cell, STDERR)]
                          for cell in range(len(CELLS))}
        assert_settled(nb)
    path = browser_lab.artifacts / f"panel-fixes-{theme}.json"
    path.write_text(json.dumps(seen, indent=2, ensure_ascii=False))
    return seen


# -- 1. the recompile alert from the trace alone ---------------------------------------------


def test_a_growing_batch_reported_without_inputs_warns_of_recompiling_live_and_final(
        panel_fixes):
    line = f"`train` in cell 2, line {SYNC_LINE} compiled "
    live = [sample for sample in panel_fixes["growing_live"] if sample["alert"]]
    assert live, ("no recompile alert while the loop ran", panel_fixes["growing_live"])
    assert line in live[0]["alert"], live[0]
    assert re.search(r"compiled \d+ different graphs", live[0]["alert"]), live[0]
    final = recompile_alert(panel_fixes["texts"][GROWING_CELL])
    assert final and line in final, panel_fixes["texts"][GROWING_CELL]
    assert re.search(r"compiled \d+ different graphs in 64 steps", final), final
    # Without inputs= the alert says how to name the input whose shape changed.
    assert "inputs=" in panel_fixes["texts"][GROWING_CELL]


def test_the_recompile_alert_keeps_the_panel_height_while_its_numbers_change(panel_fixes):
    # Its count after the warm-up arrives a few steps after the alert itself: said in as many
    # words before, the alert keeps its lines (it grew by two, 36 px, mid-run).
    live = [sample for sample in panel_fixes["growing_live"] if sample["alert"]]
    # From the second sample that shows it: a poll measures the panel before it reads the
    # text, so the first may have measured the panel just before the alert arrived.
    heights = [(sample["step"], sample["panel_height"]) for sample in live[1:]]
    assert len(heights) >= 3, heights
    assert max(h for _, h in heights) - min(h for _, h in heights) <= 1, heights


# -- 2. the bar's figures keep one line to the end ---------------------------------------------


def test_long_bar_figures_near_the_end_keep_the_bar_row_and_the_panel_height(panel_fixes):
    late = [sample for sample in panel_fixes["long_live"] if sample["step"] >= 150]
    assert len(late) >= 3, panel_fixes["long_live"]
    # The longest figures were on the page: an ETA in ms, the rates, the small values.
    assert any("ETA" in s["stats"][0] and " ms" in s["stats"][0] for s in late), late
    assert all("samples/s" in s["stats"][0] and "lr=1.5e-4" in s["stats"][0] for s in late)
    # A rate of a thousand and more is written whole ("1,020 samples/s", not "1.02e+03").
    assert not any(re.search(r"\de\+\d", s["stats"][0]) for s in late), late
    assert not any(any(s["stats_wrap"]) for s in late), late
    for key in ("stats_height", "bars_height", "panel_height"):
        # A poll that ran while the panel's HTML was being replaced found no bars: no height.
        values = {json.dumps(s[key]) for s in late if s[key] is not None}
        assert len(values) == 1, (key, [(s["step"], s[key]) for s in late])
    # The final bar row is the live one's height: one line.
    final = panel_fixes["long"]
    assert final["stats"][0].startswith("300/300 · "), final
    assert abs(final["stats_height"][0] - late[-1]["stats_height"][0]) <= 0.5, (final, late[-1])


# -- 3. the evaluation bar times the result's evaluation ---------------------------------------


def test_the_evaluation_bar_elapsed_time_is_the_results_evaluation_time(panel_fixes):
    bars = dict(zip(panel_fixes["fine_tune"]["names"], panel_fixes["fine_tune"]["stats"],
                    strict=True))
    assert "eval" in bars, bars
    bar = elapsed_seconds(bars["eval"])
    result_text = panel_fixes["texts"][RESULT_CELL]
    match = re.search(r"\bevaluation ([\d.]+) (µs|ms|s)\b", result_text)
    assert bar is not None and match, (bars["eval"], result_text)
    result = seconds(*match.groups())
    # Both are rounded for display; before, the bar said 3.5 ms for a 34 ms evaluation.
    assert abs(bar - result) <= max(0.25 * result, 0.005), (bars["eval"], match.group(0))


# -- 4. the final wall time per step is the steady steps' median --------------------------------


@pytest.mark.parametrize("part", ["growing", "fine_tune"])
def test_the_final_wall_time_per_step_is_the_median_not_the_last_compiling_step(
        panel_fixes, part):
    final = panel_fixes[part]
    (chart,) = final["chart"]
    assert "median wall time per step" in chart, chart
    median = median_step_time(chart)
    mean = step_time_per_step(final["stats"][0])  # the rate after warm-up, as a step time
    assert median is not None and mean is not None, final
    # The growing loop's last step compiles a graph: its time alone was far above the mean.
    assert median <= 1.5 * mean, (chart, final["stats"][0])
    # While the bar ran the chart said the latest update's time; once the bar ended, the
    # median, before the launch ended too. (Its stats and chart are widgets of their own,
    # updated one after the other: only the steps well before the end are compared.)
    steps = int(re.match(r"(\d+)", final["stats"][0]).group(1))
    running = [chart for sample in panel_fixes[f"{part}_live"] for chart in sample["chart"]
               if sample["step"] <= 0.8 * steps]
    assert any("wall time per step" in chart for chart in running), running
    assert not any("median" in chart for chart in running), running


# -- 5. a LoRA fine-tune writes nothing to stderr ----------------------------------------------


def test_a_lora_fine_tune_cell_shows_no_stderr_block(panel_fixes):
    text = panel_fixes["texts"][LORA_CELL]
    assert "✔ launch finished" in text, text
    assert panel_fixes["stderr"][LORA_CELL] == [], panel_fixes["stderr"][LORA_CELL]


# -- 6. the fine-tune's cell is never blank ---------------------------------------------------


def test_a_fine_tune_cell_shows_what_it_prepares_before_the_launch_panel(panel_fixes):
    """The cell's first output is fine_tune's own line ("preparing in this process: ...",
    then "prepared in 81 ms ..."), not the launch panel after seconds of a blank cell."""
    heights = panel_fixes["fine_tune_heights"]
    shown = [line for height, line in heights if height > 0 and line]
    assert shown, heights
    assert re.match(r"fine_tune\s+(preparing|prepared) in", shown[0]), shown[:3]


# -- 7. an early stop, the evaluations and the chart say what happened -----------------------


def test_an_early_stop_ends_the_bar_where_it_stopped_and_the_evaluation_row_shows_its_metrics(
        panel_fixes):
    early = panel_fixes["early"]
    train, evaluation = (box["text"] for box in early["stats"][:2])
    # The training bar ends where the run stopped, its total kept, and says so.
    stop = re.match(r"(\d+)/120 · stopped early · ", train)
    assert stop and int(stop.group(1)) < 120, train
    # The evaluation's metrics are on the evaluation row, whole, inside the panel's width.
    assert "eval_loss=" in evaluation and "eval_loss=" not in train, (train, evaluation)
    row = early["stats"][1]
    metric = next(box for box in early["pieces"] if "eval_loss=" in box["text"])
    assert metric["x"] + metric["width"] <= row["x"] + row["width"] + 0.5, (metric, row)
    # The loss chart names its line and its dots in words on the page.
    assert any("train loss" in text and "eval loss" in text for text in early["legend"]), early
