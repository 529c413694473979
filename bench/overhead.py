"""Group 1: what visibility costs. The best-practice hand-written loop (`workloads`) run bare
(no `hx.report`, no panels, compilation tracing off) and fully watched (`hx.report(...)` every
step, the widget and the console renderers both drawing every event, headless, and
compilation tracing on), alternating launches; steady-state steps/s, watched / bare.
"""

from __future__ import annotations

import contextlib
import io
import time
from typing import Any

from . import common, workloads

GROUP = "1 reporting overhead"


class HeadlessPanels:
    """The launch drawn by the ipywidgets renderer and the console renderer at once, as in a
    notebook, with nowhere to show them: widgets without a front end, console lines into a
    buffer. Every event reaches both; `refresh` redraws both at their own throttles."""

    def __init__(self, world: int) -> None:
        from hfxla_nb.ui.console import ConsoleDisplay
        from hfxla_nb.ui.widgets import WidgetDisplay

        self.lines = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()):  # display() without IPython prints
            self.parts = [WidgetDisplay(world), ConsoleDisplay(world, file=self.lines)]

    def handle(self, event: Any) -> None:
        for part in self.parts:
            part.handle(event)

    def refresh(self) -> None:
        for part in self.parts:
            part.refresh()

    def close(self, record: Any) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            for part in self.parts:
                part.close(record)


@contextlib.contextmanager
def headless_panels():
    """Launches in this block draw with `HeadlessPanels` (whatever their `progress`)."""
    from hfxla_nb.launch import launcher

    original = launcher.launch_display
    launcher.launch_display = lambda world, mode="auto": HeadlessPanels(world)
    try:
        yield
    finally:
        launcher.launch_display = original


def run(steps: int = 45, warmup: int = 5) -> list[common.Figure]:
    model = workloads.tiny_bert()
    data = workloads.tokenized(model, 400, 64)
    base = {"model": model, "data": data, "steps": steps, "warmup": warmup, "batch_size": 16}

    def kernel_cpu(launch):
        """The launch's figures, with the CPU seconds the launching (notebook) process spent
        during it: receiving events, drawing the panels."""
        def side():
            before = time.process_time()
            figures = launch()
            figures["kernel_cpu"] = time.process_time() - before
            return figures
        return side

    @kernel_cpu
    def bare():
        return workloads.launched(workloads.run_hand_written, dict(base, report=False),
                                  trace_compiles=False)

    @kernel_cpu
    def watched():
        with headless_panels():
            return workloads.launched(workloads.run_hand_written, dict(base, report=True),
                                      progress="console", trace_compiles=True)

    results = common.alternate({"bare": bare, "watched": watched}, common.REPEATS, common.say)
    rate = {side: [r["samples_per_second"] / 16 for r in runs] for side, runs in results.items()}
    pairs = common.ratios(rate["watched"], rate["bare"])
    value = common.median(pairs)
    note = (f"tiny BERT, batch 16, {steps - warmup} steady steps; steps/s "
            f"{common.median(rate['watched']):.2f} watched vs {common.median(rate['bare']):.2f} "
            "bare; watched = hx.report every step + widget and console panels drawn (headless) "
            "+ compilation tracing; the launching process used "
            f"{common.median([r['kernel_cpu'] for r in results['watched']]):.1f} s of CPU "
            f"watched vs {common.median([r['kernel_cpu'] for r in results['bare']]):.1f} s bare")
    if value is not None and value < 0.98:
        note += ("; the notebook process's drawing and tracing share this machine's 2 cores "
                 "with the worker")
    return [common.target_figure(GROUP, "steps/s with report + panels + tracing / without",
                                 value, ">=", 0.98, "x", len(pairs), note, pairs)]
