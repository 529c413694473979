"""Groups 8 and 9: `fine_tune` under SPMD over CPU virtual devices (on a TPU: its devices).

- 8: the tiny BERT, batch 16 over 1, 2, 4 and 8 devices: steady steps/s and graphs
  compiled (1 training graph expected, whatever the device count: a regression catcher).
- 9: the demo's tiny Llama (`task="causal-lm"`), `sharding="data"` vs `"fsdp"` (FSDPv2) on 4
  and 8 devices: tokens/s, graphs compiled, and the training state `sharding="auto"` sizes a
  model by (parameters x 16 bytes: fp32 weights, gradients and AdamW's two moments; divided
  over the devices under FSDP) against what XLA's post-compilation analysis says the largest
  traced graph needs per device.

Each run is a fresh forked worker, so each gets its own device count. Rates are medians over
the progress updates after the warm-up of one run (no comparison target here).
"""

from __future__ import annotations

import contextlib
from typing import Any

from . import common, workloads

SPMD, LM = "8 SPMD", "9 causal LM"
DEVICES = (1, 2, 4, 8)
LM_DEVICES = (4, 8)
SKIP_STEPS = 10
VIRTUAL = ("reported: virtual XLA:CPU devices share this machine's 2 cores, so a rate "
           "says how the layout runs, not how it scales")


class TraceRecorder:
    """A launch display that draws nothing and keeps the compilations' analysis."""

    def __init__(self, world: int) -> None:
        from hfxla_nb.observe.tracing import TraceLog

        self.trace = TraceLog()

    def handle(self, event: Any) -> None:
        from hfxla_nb.events import Compiled

        if isinstance(event, Compiled):
            self.trace.add(event.records)

    def refresh(self) -> None:
        pass

    def close(self, record: Any) -> None:
        pass


@contextlib.contextmanager
def recorded():
    """Launches in this block keep their compilations in the yielded list's `TraceRecorder`."""
    from hfxla_nb.launch import launcher

    made: list[TraceRecorder] = []
    original = launcher.launch_display

    def display(world, mode="auto", **drawn):  # attempt=, reader=: not needed here
        made.append(TraceRecorder(world))
        return made[-1]

    launcher.launch_display = display
    try:
        yield made
    finally:
        launcher.launch_display = original


def steps_per_second(raw: dict) -> float | None:
    seconds = common.median(workloads.steady_step_seconds(raw["bench_step_times"], SKIP_STEPS))
    return 1 / seconds if seconds else None


def spmd(steps: int) -> list[common.Figure]:
    model = workloads.tiny_bert()
    rows = workloads.demo_rows(steps * 16)
    figures = []
    for devices in DEVICES:
        raw = workloads.fine_tune_measured(model, rows, max_steps=steps, batch_size=16,
                                           max_length=64, num_processes=devices,
                                           output_dir=None, progress=False, learning_rate=1e-4)
        rate = steps_per_second(raw)
        updates = len(workloads.steady_step_seconds(raw["bench_step_times"], SKIP_STEPS))
        common.say(f"  {devices} devices: {rate} steps/s, {raw['compiles']} compiles")
        figures.append(common.Figure(
            SPMD, f"tiny BERT over {devices} device{'s' if devices > 1 else ''}: steps/s", rate,
            "steps/s", repeats=updates,
            note=f"batch 16 split over the devices, {steps} steps; median of {updates} updates; "
                 f"{VIRTUAL}"))
        figures.append(common.Figure(
            SPMD, f"tiny BERT over {devices} device{'s' if devices > 1 else ''}: training graphs",
            raw["compiles"], "graphs", "== 1", raw["compiles"] == 1, 1,
            "expected 1 (step 1 is already the steady step); 1 run"))
    return figures


def causal_lm(steps: int) -> list[common.Figure]:
    from transformers import AutoConfig

    from hfxla_nb.demo.lm import TEMPLATE, demo_lm_dataset, demo_lm_model_dir
    from hfxla_nb.train.tasks.causal_lm import BYTES_PER_PARAMETER, parameter_count

    model = demo_lm_model_dir()
    length, batch = 64, 16
    data = demo_lm_dataset(n=steps * batch * 2)["train"]
    parameters = parameter_count(AutoConfig.from_pretrained(model))
    figures = []
    rates: dict[tuple[int, str], float | None] = {}
    for devices in LM_DEVICES:
        for sharding in ("data", "fsdp"):
            with recorded() as displays:
                raw = workloads.fine_tune_measured(
                    model, data, task="causal-lm", prompt_column="prompt",
                    response_column="response", template=TEMPLATE, max_length=length,
                    max_steps=steps, batch_size=batch, learning_rate=3e-3, sharding=sharding,
                    num_processes=devices, output_dir=None, progress=False)
            rate = steps_per_second(raw)
            tokens = rate * batch * length if rate else None
            rates[(devices, sharding)] = tokens
            largest = displays[0].trace.largest() if displays else None
            measured = largest.memory if largest is not None else None
            estimate = parameters * BYTES_PER_PARAMETER / (devices if sharding == "fsdp" else 1)
            common.say(f"  {sharding} on {devices}: {tokens} tokens/s, {raw['compiles']} "
                       f"compiles, largest graph {measured} B, estimate {estimate:.0f} B")
            where = f"{sharding} on {devices} devices"
            figures.append(common.Figure(
                LM, f"tiny Llama, {where}: tokens/s", tokens, "tokens/s",
                repeats=len(workloads.steady_step_seconds(raw["bench_step_times"], SKIP_STEPS)),
                note=f"batch {batch} x {length} tokens, {steps} steps; median of the updates; "
                     f"{VIRTUAL}"))
            figures.append(common.Figure(
                LM, f"tiny Llama, {where}: training graphs", raw["compiles"], "graphs", "== 1",
                raw["compiles"] == 1, 1, "expected 1; 1 run"))
            figures.append(common.Figure(
                LM, f"tiny Llama, {where}: largest graph's memory / training-state estimate",
                measured / estimate if measured else None, "x", repeats=1,
                note=(f"XLA: {measured / 2**20:.2f} MiB per device (inputs, outputs, "
                      f"temporaries, program); estimate {estimate / 2**20:.2f} MiB "
                      f"({parameters:,} parameters x {BYTES_PER_PARAMETER} B"
                      f"{' / devices' if sharding == 'fsdp' else ''}); 1 run; reported: XLA's "
                      "temporaries of a model this small dwarf its state")
                if measured else "no graph memory in the trace"))
    for devices in LM_DEVICES:
        fsdp, data_rate = rates[(devices, "fsdp")], rates[(devices, "data")]
        figures.append(common.Figure(
            LM, f"tiny Llama on {devices} devices: tokens/s fsdp / data",
            fsdp / data_rate if fsdp and data_rate else None, "x", repeats=1,
            note="ratio of the two medians above (separate runs, not alternated); reported: "
                 "what FSDP costs on shared CPU cores, where its memory saving is the point"))
    return figures


def run() -> list[common.Figure]:
    steps = 24 if common.QUICK else 30  # 8 launches: make bench's 15 minutes
    return spmd(steps) + causal_lm(steps)
