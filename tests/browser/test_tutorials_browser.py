"""The tutorials as a person runs them: tutorial 3 and tutorial 2, opened in JupyterLab in
Chromium (light and dark theme), Run > Run All Cells, and the page read when every cell is done.

Tutorial 3 launches a torch_xla loop with an `hx.report` bar and a `tqdm` bar, a function that
fails in its worker (a cell tagged `raises-exception`, so Run All goes on past it) and an
Accelerate function; tutorial 2 fine-tunes twice (the second time resuming from a checkpoint).
Screenshots of every cell with an output, and of the whole page, go to artifacts/browser/ as
`tutorial-03-<theme>-...png` and `tutorial-02-<theme>-...png`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest

from .lab import ROOT

pytest.importorskip("playwright.sync_api", reason="pip install -r requirements-browser.txt")
if not os.access("/usr/bin/chromium", os.X_OK):
    pytest.skip("no /usr/bin/chromium (apt-get install chromium)", allow_module_level=True)

NOTEBOOKS = ROOT / "notebooks"
# The final panel of a launch: static HTML (class hfxla-launch), one flex row per bar.
PANEL = ".hfxla-launch"
SPINNERS = ".jp-Spinner, .fa-spin, [class*='spinner'], [class*='Spinner']"
RUN_TIMEOUT = 900.0  # seconds for Run All (a busy 2-core machine; about 1.5 min when idle)


def code_cell(path: Path, marker: str) -> int:
    """The index, among the notebook's code cells (as the page lists them), of the first cell
    whose source holds `marker`."""
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    return next(i for i, cell in enumerate(cells) if marker in cell.source)


def bar_rows(nb, cell: int) -> dict[str, str]:
    """The final bar rows of the launch panel in `cell`: bar name -> its mark and stats, as
    the grid shows them (one name, mark, bar and stats cell per row)."""
    def texts(part: str) -> list[str]:
        return [" ".join(box["text"].split()) for box in nb.measure(cell, f"{PANEL} {part}")]

    names = texts(".hfxla-bar-name")
    marks = texts(".hfxla-bar-mark")
    stats = texts(".hfxla-bar-stats")
    assert len(names) == len(marks) == len(stats), (names, marks, stats)
    return {name: f"{mark} {stat}" for name, mark, stat in zip(names, marks, stats, strict=True)}


def assert_nothing_running(nb) -> None:
    """Every code cell has run (numbered prompts), the kernel is idle, and no output says
    running or waits for a widget; no spinner anywhere."""
    assert nb.done(), nb.prompts()
    outputs = "\n".join(nb.page.locator(".jp-Notebook .jp-CodeCell .jp-OutputArea")
                        .all_inner_texts())
    assert "running" not in outputs.lower(), outputs[-3000:]
    assert "Loading widget" not in outputs and "Error displaying widget" not in outputs
    assert nb.page.locator(SPINNERS).count() == 0
    # Every launch panel ended: finished or failed, none still live.
    for status in nb.page.locator(PANEL).all_inner_texts():
        assert status.lstrip().startswith(("✔ launch", "✖ launch")), status[:200]


def test_tutorial_3_your_own_loop(browser_lab):
    path = NOTEBOOKS / "03_your_own_loop.ipynb"
    train = code_cell(path, "result = hx.notebook_launcher(train)")
    failing = code_cell(path, "hx.notebook_launcher(train_with_a_bug)")
    accelerate = code_cell(path, "hx.notebook_launcher(training_function, args=(model,))")
    with browser_lab.notebook("tutorial-03", source=path, timeout=RUN_TIMEOUT) as nb:
        text = nb.output_text(train)
        assert text.lstrip().startswith("✔ launch finished in "), text
        rows = bar_rows(nb, train)
        assert "80/80" in rows["train"] and "✔" in rows["train"], rows  # hx.report
        assert "2/2" in rows["epochs"] and "✔" in rows["epochs"], rows  # the tqdm bar
        compiles = re.search(r"compiles\s+(\d+) \(", text)
        assert compiles and int(compiles.group(1)) >= 1, text  # the metrics panel's count

        failure = nb.output_text(failing)
        assert "✖ launch failed after " in failure, failure
        assert "rank 0 failed: ValueError" in failure, failure  # the rank and the exception
        assert "LaunchError" in failure and "Remote traceback (rank 0)" in failure, failure
        assert "labels[:8]" in failure, failure  # the remote traceback, down to the bug

        rows = bar_rows(nb, accelerate)
        assert "40/40" in rows["epoch 1"], rows  # the Accelerate function's tqdm bar
        assert "epoch 1: accuracy" in nb.output_text(accelerate)  # accelerator.print
        assert_nothing_running(nb)


def test_tutorial_2_fine_tune(browser_lab):
    path = NOTEBOOKS / "02_fine_tune.ipynb"
    first = code_cell(path, "result = hx.fine_tune(")
    resumed = code_cell(path, "resumed = hx.fine_tune(")
    prediction = code_cell(path, "predictions = [")
    with browser_lab.notebook("tutorial-02", source=path, timeout=RUN_TIMEOUT) as nb:
        for cell in (first, resumed):
            text = nb.output_text(cell)
            # fine_tune's own line (what it prepared in the kernel), then the launch's panel.
            prepared, status = text.strip().splitlines()[:2]
            assert re.match(r"fine_tune\s+prepared in ", prepared), text
            assert status.startswith("✔ launch finished in "), text
            rows = bar_rows(nb, cell)
            assert "60/60" in rows["train"] and "✔" in rows["train"], rows
            assert "✔" in rows["eval"], rows
            compiles = re.search(r"compiles\s+(\d+) \(", text)
            assert compiles and int(compiles.group(1)) >= 1, text
            # The result panel under it: loss, evaluation and graphs compiled.
            assert "eval_accuracy" in text and "graphs compiled" in text, text
        assert "resumed from" in nb.output_text(resumed)
        assert "['positive', 'negative']" in nb.output_text(prediction)
        assert_nothing_running(nb)
