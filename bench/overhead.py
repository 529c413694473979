"""Group 1: what visibility costs. The best-practice hand-written loop (`workloads`) in one
launched worker, its steady steps cut into segments of `SEGMENT` steps that alternate between
watched (`hx.report(...)` every step, so the widget and the console renderers, both drawing
every event headless in this notebook process, have something to draw) and bare (no
`hx.report`); pairs in the order bare-watched, watched-bare, ... so a drift hits both alike.
Each segment is timed in the worker between two `wait_device_ops()` (its steps executed); the
figure is the median of the per-pair ratios of steps/s, watched / bare.

Why one worker and not one launch per side: a launch's warm-up (a fresh process, the model
loaded, three graphs compiled: about 9 s here) outweighs its steady steps, so launches per side
bought few seconds of measurement each, far apart in time, on a machine whose load moves
(repetitions spread 0.80x to 1.28x). Segments a second apart see the same machine. Compilation
tracing is on for the whole worker (torch_xla reads its setting once per process), so both
sides pay it: its own cost per execution is figure 10's (alternating launches).
"""

from __future__ import annotations

import contextlib
import io
import time
from typing import Any

from . import common, workloads

GROUP = "1 reporting overhead"
SEGMENT = 10  # steps per segment: one loss fetch (every 10th step) in each, on either side
PAIRS = 6 if common.QUICK else 20
WARMUP = 10  # steps before the first segment (the compiling ones and a few more)


class HeadlessPanels:
    """The launch drawn by the ipywidgets renderer and the console renderer at once, as in a
    notebook, with nowhere to show them: widgets without a front end, console lines into a
    buffer. Every event reaches both; `refresh` redraws both at their own throttles."""

    def __init__(self, world: int) -> None:
        from hfxla_nb.ui.live import ConsoleDisplay, WidgetDisplay

        self.lines = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()):  # display() without IPython prints
            self.parts = [WidgetDisplay(world), ConsoleDisplay(world, file=self.lines)]
        self.events = 0

    def handle(self, event: Any) -> None:
        self.events += 1
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
    """Launches in this block draw with `HeadlessPanels` (whatever their `progress`); the
    yielded list holds the ones made."""
    from hfxla_nb.launch import launcher

    made: list[HeadlessPanels] = []
    original = launcher.launch_display

    def display(world, *args, **kwargs):
        made.append(HeadlessPanels(world))
        return made[-1]

    launcher.launch_display = display
    try:
        yield made
    finally:
        launcher.launch_display = original


def schedule(pairs: int, segment: int = SEGMENT, warmup: int = WARMUP) -> list[str]:
    """The side of each segment: bare-watched, watched-bare, ... (`2 * pairs` segments of
    `segment` steps after `warmup` steps)."""
    order = []
    for pair in range(pairs):
        order += ["bare", "watched"] if pair % 2 == 0 else ["watched", "bare"]
    return order


def run_interleaved(config: dict) -> dict[str, Any]:
    """In a launched worker: the hand-written loop (`workloads.best_practice_loop`),
    `config["warmup"]` steps, then segments of `config["segment"]` steps alternating as
    `schedule` says, `hx.report` on every step of a watched segment only; each segment's
    seconds and worker CPU seconds, between two `wait_device_ops()`."""
    import torch_xla

    import hfxla_nb as hx

    sides = schedule(config["pairs"])
    warmup, segment = config["warmup"], config["segment"]
    steps = warmup + segment * len(sides)
    batches, train_step = workloads.best_practice_loop(config, steps)
    seconds: dict[str, list[float]] = {"bare": [], "watched": []}
    cpu: dict[str, list[float]] = {"bare": [], "watched": []}
    started = cpu_started = 0.0
    for step, tensors in enumerate(batches, 1):
        index = (step - warmup - 1) // segment  # the segment of this step (< 0: warm-up)
        loss = train_step(step, tensors)
        if index >= 0 and sides[index] == "watched":
            hx.report(step=step, total=steps, loss=loss, log_every=10)
        if step >= warmup and (step - warmup) % segment == 0:  # a segment's edge
            torch_xla.sync()
            workloads.wait()
            now, cpu_now = time.perf_counter(), time.process_time()
            if index >= 0:
                seconds[sides[index]].append(now - started)
                cpu[sides[index]].append(cpu_now - cpu_started)
            started, cpu_started = now, cpu_now
    return {"seconds": seconds, "cpu": cpu, "sides": sides}


def run(pairs: int = PAIRS) -> list[common.Figure]:
    model = workloads.tiny_bert()
    data = workloads.tokenized(model, 400, 64)
    config = {"model": model, "data": data, "warmup": WARMUP, "segment": SEGMENT,
              "pairs": pairs, "batch_size": 16}
    before = time.process_time()
    with headless_panels() as panels:
        result = workloads.launched(run_interleaved, config, progress="console",
                                    trace_compiles=True)
    notebook_cpu = time.process_time() - before
    # Pair i: the i-th segment of each side (adjacent in time: bare-watched, watched-bare, ...).
    rate = {side: [SEGMENT / s for s in result["seconds"][side]] for side in ("bare", "watched")}
    pairs_ratios = common.ratios(rate["watched"], rate["bare"])
    value = common.median(pairs_ratios)
    cpu = {side: common.median(result["cpu"][side]) / SEGMENT * 1000 for side in result["cpu"]}
    events = panels[0].events if panels else 0
    common.say(f"  steps/s watched {common.median(rate['watched']):.2f}, bare "
               f"{common.median(rate['bare']):.2f}; ratios {[round(r, 3) for r in pairs_ratios]}")
    note = (f"tiny BERT, batch 16, one launched worker: {len(pairs_ratios)} pairs of "
            f"{SEGMENT}-step segments after {WARMUP} warm-up steps, alternating bare-watched, "
            f"watched-bare; each segment timed in the worker between two wait_device_ops(); "
            f"steps/s {common.median(rate['watched']):.2f} watched vs "
            f"{common.median(rate['bare']):.2f} bare; watched = hx.report every step + widget "
            f"and console panels drawn (headless) in the notebook process ({events} events); "
            "compilation tracing on in both (set once per process; its cost per execution: "
            f"figure 10); worker CPU per step {cpu['watched']:.1f} ms watched vs "
            f"{cpu['bare']:.1f} ms bare; the notebook process used {notebook_cpu:.1f} s of CPU "
            "in the whole launch")
    # The worker's own CPU per step, pair by pair (bare / watched: below 1 is what hx.report
    # costs the worker): other work on the machine moves it less than wall time.
    cpu_ratios = common.ratios(result["cpu"]["bare"], result["cpu"]["watched"])
    return [common.target_figure(GROUP, "steps/s with report + panels / without (one traced "
                                 "worker, alternating segments)",
                                 value, ">=", 0.98, "x", len(pairs_ratios), note, pairs_ratios),
            common.Figure(GROUP, "worker CPU per step, bare / watched (the same segments)",
                          common.median(cpu_ratios), "x", repeats=len(cpu_ratios),
                          samples=cpu_ratios,
                          note=f"{cpu['bare']:.1f} ms bare vs {cpu['watched']:.1f} ms watched "
                               "(medians); reported: what hx.report costs the worker, which the "
                               "machine's other load disturbs less than steps/s (the panels are "
                               "drawn in the notebook process, not counted here)")]
