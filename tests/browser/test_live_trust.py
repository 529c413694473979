"""What a person sees while a fine-tune runs can be trusted, read from the page in
JupyterLab + Chromium, in both themes, poll by poll while the run is live: the bar's elapsed
time never goes back, the panel keeps its height from the first step to the end, its final
rate is within 10% of the result's, no library or XLA native warning text reaches the cell,
predictions are a table, and the compilations table keeps its numbers on one line at 1024 px.
Each poll's figures are saved as `trust-<theme>.json` beside the screenshots, which show every
kind of panel in both themes."""

from __future__ import annotations

import json
import re

from .test_panels_browser import FINAL, LIVE, PARTS, SETUP, assert_settled, step_of

TRAIN = """\
from hfxla_nb.demo import demo_dataset, demo_model_dir
folder, data = demo_model_dir(), demo_dataset(n=1200)
result = hx.fine_tune(folder, data, epochs=2, batch_size=32, learning_rate=4e-3,
                      output_dir="trust-model", log_every=5, num_processes=1)
"""
PREDICT = 'result.predict(["a great little product", "awful, it broke at once"])'
COMPILATIONS = """\
%load_ext hfxla_nb
%xla_info
"""
PLAN = 'hx.plan_memory(folder, batch_size=32, max_length=64, hardware="v5e-1")'  # one panel more
METRICS = """\
%%xla_metrics
import torch, torch_xla
device = torch_xla.device()
for n in range(1, 6):  # five shapes: five graphs from one line
    (torch.ones(n, 8, device=device) * 2).sum().item()
"""
UNITS = {"µs": 1e-6, "ms": 1e-3, "s": 1.0}
NOISE = ("site-packages", "dist-packages", "FutureWarning", "UserWarning", "sharding_propagation",
         "Shardy")


def elapsed_seconds(stats: str) -> float | None:
    """The bar's elapsed time ("4 min 05 s elapsed", "19.8 s elapsed", "268 ms"), in seconds."""
    match = re.search(r"(?:(\d+) h )?(?:(\d+) min )?([\d.]+) (µs|ms|s)\b(?! ?/)", stats)
    if match is None:
        return None
    hours, minutes, value, unit = match.groups()
    return (int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(value) * UNITS[unit])


def rate_of(stats: str) -> float | None:
    """`156 samples/s` -> 156.0, `1,030 samples/s` -> 1030.0; None without one."""
    match = re.search(r"(\d[\d,]*(?:\.\d+)?) samples/s", stats)
    return float(match.group(1).replace(",", "")) if match else None


def test_a_live_fine_tune_panel_can_be_trusted(browser_lab):
    samples: list[dict] = []

    def poll(nb) -> None:
        stats = nb.measure(2, LIVE + PARTS["stats"])
        step = step_of(stats)
        if step is None or step < 1:
            return
        height = sum(child["height"] for child in nb.measure(2, ".jp-OutputArea-child"))
        sample = {"step": step, "stats": stats[0]["text"],
                  "elapsed": elapsed_seconds(stats[0]["text"]), "height": round(height, 1)}
        panel = nb.output_text(2)
        sample["metrics"] = "XLA metrics" in panel  # the first step's snapshot has come
        if not samples or samples[-1]["height"] != sample["height"]:
            sample["text"] = panel  # what a change of height showed or hid
        samples.append(sample)
        if len(samples) == 1 or step in (10, 40):
            nb.screenshot(browser_lab.artifacts, f"trust-live-{browser_lab.theme}-{step}", [2])

    cells = [SETUP, "import os", TRAIN, "result", PREDICT, COMPILATIONS, METRICS, PLAN]
    with browser_lab.notebook("trust", cells, timeout=500, poll=poll) as nb:
        (final,) = nb.measure(2, FINAL + PARTS["stats"])[:1]
        cell_text = nb.output_text(2)
        result_text = nb.output_text(3)
        predictions = nb.measure(4, ".hfxla-predictions table")
        prediction_text = nb.output_text(4)
        compilations = nb.measure(6, "td")  # the metrics panel and its compilations table
        # Every kind of panel, in this theme: launch, result, predictions, %xla_info, metrics
        # with its compilations, the memory plan (the failure view: test_panels_browser.py).
        nb.screenshot(browser_lab.artifacts, f"trust-final-{browser_lab.theme}",
                      [2, 3, 4, 5, 6, 7])
        assert_settled(nb)
    (browser_lab.artifacts / f"trust-{browser_lab.theme}.json").write_text(
        json.dumps({"samples": samples, "final": final["text"], "result": result_text},
                   indent=2, ensure_ascii=False))
    assert len(samples) >= 5, samples
    # 1. The clock only moves forward (never "6/60 · 19.8 s", then "48/60 · 8.1 s").
    times = [sample["elapsed"] for sample in samples if sample["elapsed"] is not None]
    assert times and all(later >= earlier
                         for earlier, later in zip(times, times[1:], strict=False)), samples
    # 2. The panel holds its height once the first step is done, to the end (it did not
    # when its chart line appeared at step 10 and a note beside it came and went). During
    # step 1 it grows as its parts arrive: the metrics, then the compilations traced while
    # the step and the evaluation compile side by side.
    heights = {sample["height"] for sample in samples if sample["metrics"] and sample["step"] > 1}
    assert heights and max(heights) - min(heights) <= 1.0, samples
    # 3. The bar's final rate agrees with the result's within 10%.
    bar_rate = rate_of(final["text"])
    (result_rate_text,) = re.findall(r"(\d[\d,]*(?:\.\d+)?) samples/s after warm-up",
                                     result_text)
    result_rate_text = result_rate_text.replace(",", "")  # "1,035.2" on a fast machine
    assert bar_rate is not None, final
    assert abs(bar_rate - float(result_rate_text)) <= 0.10 * float(result_rate_text), (
        final["text"], result_text)
    # 4. No library warning or XLA native notice in the cell's own words.
    for word in NOISE:
        assert word not in cell_text, (word, cell_text)
    # 5. Predictions are a table, values rounded for display.
    assert predictions, prediction_text
    assert not re.search(r"\d\.\d{5,}", prediction_text), prediction_text
    # 6. The compilations table keeps each count on one line at 1024 px.
    assert compilations, "no compilations table"
    assert not [box["text"] for box in compilations
                if box["wraps"] and re.fullmatch(r"[\d\s/.,a-z]+", box["text"].strip())]
