"""Group 12: where the host's time per training step goes, `fine_tune` (each step after a
shape's first run by its compiled graph: `train/worker/captured.py`) beside `fine_tune` with
every step traced (`TrainPlan.capture_steps=False`, the loop before) and the hand-written
loop, for the tiny BERT, BERT 4x256 and a BERT-base body (12 x 768; host time only, at a small
batch: its execution on XLA:CPU is slow, and tracing is per operation, not per row; with a
projection of what a v5e and a v6e need for the step at 32 x 128 tokens, from its FLOPs).

Inside the launched worker, the phases of each steady step are timed by wrapping what every
training loop calls (nothing in `hfxla_nb` is changed for it): the model's forward (hooks on
the top module), `Tensor.backward`, `clip_grad_norm_`, the optimizer's and the scheduler's
`step`, torch_xla's graph cut (`_xla_step_marker`) and its step closures, and the batch
(fine_tune: `train_batch` + `upload`; hand-written: the `MpDeviceLoader` iterator on the
training thread). Each phase's CPU time on the training thread (`time.thread_time`, which the
other processes of a shared machine disturb far less than wall time) per step, and:

- tracing: forward + backward + clip + optimizer + scheduler (torch_xla's own `LazyTracing`
  timer, the C++ part of it, is reported beside);
- graph cut: the step marker (hashing the graph, handing its data over; the wait for the
  previous execution, `DeviceLockWait`, is wall time, not CPU), or for a step run by its
  compiled graph its end without a cut (`_xla.end_step`), and the allocator's sorting
  of the chunks it freed (paid at the next large allocation after it, whoever makes it: made
  inside the marker's timing, see `install`);
- data: the batch made and uploaded (or taken from the loader's queue);
- compiled step: a step run by its compiled graph (its inputs gathered, the previous step
  waited for, the outputs put in place); AdamW's host numbers count as the optimizer's;
- ours: everything else on the training thread: `report`, the loss closures, step
  accounting (fine_tune's loop; in the hand-written loop, its own few lines).

The target: fine_tune's "ours" <= 2% of its steady wall time per step, for the tiny BERT (the
hard case: its step is the shortest), the median of 5 runs; the hand-written loop is measured
beside it once (its split is reported, not compared), BERT 4x256 once, fine_tune only
(reported: a 6x longer step; its hand-written run took a third of the group's time). Run alone:
`python -m bench.host_time` prints the figures.
"""

from __future__ import annotations

import time
from typing import Any

from . import common, workloads

GROUP = "12 host time"
# model, steps, batch, length, fine_tune's runs, the hand-written loop's runs, targeted (CPU
# time per phase varies little between runs; the whole of make bench must fit in 15 minutes)
CASES = (("tiny BERT", 30, 16, 64, 5, 1, True), ("BERT 4x256", 14, 16, 64, 1, 0, False),
         ("BERT-base", 12, 2, 32, 1, 0, False))
SKIP = 6  # steps left out (compiling, the first executions)
FREED_SORT_BYTES = 8 * 1024  # more than glibc's thread cache serves (1,032 bytes)
PHASES = ("forward", "loss", "backward", "clip", "optimizer", "scheduler", "graph cut",
          "closures", "data", "report", "compiled step")
TRACED = "fine_tune, every step traced"  # the baseline side: `TrainPlan.capture_steps=False`
# BERT-base: the host's CPU per step against what the step needs of a TPU at its peak, for
# the batch the figure was taken at (32 x 128 tokens); measured at a small batch on
# XLA:CPU (its execution is slow; tracing is per operation, not per row).
BASE_TARGET_MS = 14.0
TPU_PEAKS = {"v5e": 197e12, "v6e": 918e12}  # bf16 FLOP/s per chip, Google's published peaks
PROJECTED_TOKENS = 32 * 128
TRACING = ("forward", "loss", "backward", "clip", "optimizer", "scheduler")


class PhaseClock:
    """CPU (training thread) and wall seconds per phase, from step `skip` on."""

    def __init__(self, skip: int) -> None:
        self.skip = skip
        self.steps = 0
        self.cpu = dict.fromkeys(PHASES, 0.0)
        self.wall = dict.fromkeys(PHASES, 0.0)
        self.start: tuple[float, float] | None = None
        self.end: tuple[float, float] | None = None
        self.lazy_start = 0.0
        self.lazy_end = 0.0
        self.inner: list[list[float]] = []  # per open phase: CPU and wall of phases inside it
        self.off_thread = 0.0  # CPU of the loop's own work on other threads (loss fetches)

    def counting(self) -> bool:
        return self.start is not None and self.end is None

    def enter(self) -> None:
        self.inner.append([time.thread_time(), time.perf_counter(), 0.0, 0.0])

    def leave(self, phase: str) -> None:
        """A phase inside another (MpDeviceLoader cuts the graph in its iterator; the loss
        holds the forward) counts once, as itself."""
        cpu, wall, inner_cpu, inner_wall = self.inner.pop()
        spent_cpu, spent_wall = time.thread_time() - cpu, time.perf_counter() - wall
        self.cpu[phase] += spent_cpu - inner_cpu
        self.wall[phase] += spent_wall - inner_wall
        if self.inner:
            self.inner[-1][2] += spent_cpu
            self.inner[-1][3] += spent_wall

    def timed(self, phase: str, function):
        def wrapper(*args, **kwargs):
            if not self.counting():
                return function(*args, **kwargs)
            self.enter()
            try:
                return function(*args, **kwargs)
            finally:
                self.leave(phase)
        wrapper.__wrapped__ = function
        return wrapper

    def step_done(self, total: int) -> None:
        """After each step's graph cut: start counting after `skip`, stop at the last step."""
        self.steps += 1
        if self.steps == self.skip:
            workloads.wait()
            self.lazy_start = _lazy_tracing_seconds()
            self.start = (time.thread_time(), time.perf_counter())
        elif self.steps == total and self.start is not None:
            self.end = (time.thread_time(), time.perf_counter())
            self.lazy_end = _lazy_tracing_seconds()

    def figures(self) -> dict[str, Any]:
        steps = self.steps - self.skip
        cpu = (self.end[0] - self.start[0]) / steps
        wall = (self.end[1] - self.start[1]) / steps
        per = {phase: self.cpu[phase] / steps for phase in PHASES}
        tracing = sum(per[p] for p in TRACING)
        return {
            "steps": steps, "wall": wall, "cpu": cpu, "phases": per,
            "tracing": tracing, "graph_cut": per["graph cut"], "data": per["data"],
            "graph_cut_wall": self.wall["graph cut"] / steps,
            "compiled": per["compiled step"],
            # The loss fetches run on the fetcher's thread: still the loop's own work.
            "ours": (cpu - tracing - per["graph cut"] - per["data"] - per["compiled step"]
                     + self.off_thread / steps),
            "off_thread": self.off_thread / steps,
            "report": per["report"] + per["closures"],
            "lazy_tracing": (self.lazy_end - self.lazy_start) / steps,
        }


def _lazy_tracing_seconds() -> float:
    import torch_xla.debug.metrics as met

    data = met.metric_data("LazyTracing")
    return data[1] / 1e9 if data else 0.0


def install(clock: PhaseClock, total: int) -> None:
    """Wrap what every loop calls, in this (forked worker) process only."""
    import torch
    import torch_xla
    from torch.nn.modules import module as torch_module
    from torch.optim import optimizer as torch_optimizer
    from torch.optim.lr_scheduler import LRScheduler

    torch.Tensor.backward = clock.timed("backward", torch.Tensor.backward)
    torch.nn.utils.clip_grad_norm_ = clock.timed("clip", torch.nn.utils.clip_grad_norm_)
    LRScheduler.step = clock.timed("scheduler", LRScheduler.step)
    marker = torch_xla._XLAC._xla_step_marker

    def marker_and_its_frees(*args, **kwargs):
        result = marker(*args, **kwargs)
        # The cut frees the traced graph's many small nodes; glibc sorts those chunks at the
        # next allocation too large for its thread cache, whoever makes it (tiny BERT: 1.5 ms
        # for the first 8 KiB after a sync, 0.007 ms for the next). Made here, that cost is
        # counted as the graph cut's, which causes it, in both loops alike.
        bytearray(FREED_SORT_BYTES)
        return result

    timed_marker = clock.timed("graph cut", marker_and_its_frees)

    def step_marker(*args, **kwargs):
        timed_marker(*args, **kwargs)
        clock.step_done(total)

    torch_xla._XLAC._xla_step_marker = step_marker
    # A step run by its compiled graph ends without a cut (`_xla.end_step`: the seed moved,
    # the step closures run): its end, counted as the graph cut's phase.
    from hfxla_nb import _xla as seam

    timed_end = clock.timed("graph cut", seam.end_step)

    def step_end(*args, **kwargs):
        timed_end(*args, **kwargs)
        clock.step_done(total)

    seam.end_step = step_end
    import torch_xla.core.xla_model as xm

    xm._run_step_closures = clock.timed("closures", xm._run_step_closures)
    depth = {"forward": 0, "optimizer": False}

    def before(*_):
        if clock.counting():
            depth["optimizer"] = True
            clock.enter()

    def after(*_):
        if depth["optimizer"]:
            depth["optimizer"] = False
            clock.leave("optimizer")

    torch_optimizer.register_optimizer_step_pre_hook(before)
    torch_optimizer.register_optimizer_step_post_hook(after)

    def forward_before(module, *_):
        depth["forward"] += 1
        if depth["forward"] == 1 and clock.counting():
            depth["timed"] = True
            clock.enter()

    def forward_after(module, *_):
        depth["forward"] -= 1
        if not depth["forward"] and depth.pop("timed", False):
            clock.leave("forward")

    # Global module hooks see every module; the depth keeps the outermost call only.
    torch_module.register_module_forward_pre_hook(forward_before)
    torch_module.register_module_forward_hook(forward_after)


def fine_tune_worker(index: int, plan: Any) -> dict[str, Any]:
    from hfxla_nb.train import batching
    from hfxla_nb.train.tasks import TASKS
    from hfxla_nb.train.worker import captured, context, loop, optimizer
    from hfxla_nb.train.worker import loop as fetcher

    clock = PhaseClock(SKIP)
    install(clock, plan.total_steps)
    # A step run by its compiled graph: the host's numbers (AdamW's step, uploaded) and the
    # run (its inputs gathered, the previous step waited for, the outputs put in place).
    optimizer.AdamW.count_step = clock.timed("optimizer", optimizer.AdamW.count_step)
    captured.CapturedStep.run = clock.timed("compiled step", captured.CapturedStep.run)
    batching.train_batch = clock.timed("data", batching.train_batch)
    context.WorkerContext.upload = clock.timed("data", context.WorkerContext.upload)
    loop.report = clock.timed("report", loop.report)
    optimizer.GradientClipper.__call__ = clock.timed("clip", optimizer.GradientClipper.__call__)
    fetcher_init = fetcher.Fetcher.__init__

    def counted_fetcher(instance, log):
        def counted_log(*args):
            start, counting = time.thread_time(), clock.counting()
            try:
                return log(*args)
            finally:
                if counting:
                    clock.off_thread += time.thread_time() - start
        fetcher_init(instance, counted_log)

    fetcher.Fetcher.__init__ = counted_fetcher
    task = TASKS[plan.task]
    task.train_loss = clock.timed("loss", task.train_loss)  # the forward inside is its own
    loop.train_worker(index, plan)
    return clock.figures()


def hand_written_worker(config: dict) -> dict[str, Any]:
    import torch
    import torch_xla.distributed.parallel_loader as pl

    import hfxla_nb as hx

    clock = PhaseClock(SKIP)
    install(clock, config["steps"])
    pl.PerDeviceLoader.__next__ = clock.timed("data", pl.PerDeviceLoader.__next__)
    torch.nn.functional.cross_entropy = clock.timed("loss", torch.nn.functional.cross_entropy)
    hx.report = clock.timed("report", hx.report)
    workloads.run_hand_written(config)
    return clock.figures()


def measure(model: str, steps: int, batch: int, length: int, repeats: int,
            hand_repeats: int | None = None) -> dict[str, dict]:
    """`repeats` runs of fine_tune, the first alternating with one of fine_tune with every
    step traced and, `hand_repeats` times (default: as often), the hand-written loop's."""
    import dataclasses

    import hfxla_nb as hx
    from hfxla_nb.train.config import FineTuneConfig

    rows = workloads.demo_rows(max(steps * batch, 64))
    config = FineTuneConfig.build(None, dict(max_steps=steps, batch_size=batch,
                                             max_length=length, output_dir=None, progress=False,
                                             learning_rate=1e-4))
    plan = hx.prepare_fine_tune(model, rows, config)
    hand = {"model": model, "batch_size": batch, "warmup": SKIP, "steps": steps,
            "data": workloads.tokenized(model, max(steps * batch, 64), length)}

    def fine_tune(run_plan=plan):
        return hx.notebook_launcher(fine_tune_worker, args=(run_plan,),
                                    strategy=config.strategy,
                                    num_processes=config.num_processes, progress=False,
                                    trace_compiles=config.trace_compiles)

    def traced():
        return fine_tune(dataclasses.replace(plan, capture_steps=False))

    def hand_written():
        return workloads.launched(hand_written_worker, hand)

    hand_repeats = repeats if hand_repeats is None else min(hand_repeats, repeats)
    results = common.alternate({"fine_tune": fine_tune, TRACED: traced}, 1, common.say)
    if hand_repeats:
        results |= common.alternate({"hand-written": hand_written}, hand_repeats, common.say)
    more = common.alternate({"fine_tune": fine_tune}, repeats - 1, common.say)
    results["fine_tune"] += more["fine_tune"]
    return results


def _ms(value: float) -> str:
    return f"{value * 1000:.2f} ms"


def run(models: tuple[str, ...] | None = None) -> list[common.Figure]:
    figures: list[common.Figure] = []
    for name, steps, batch, length, repeats, hand_repeats, targeted in CASES:
        if models and name not in models:
            continue
        model = workloads.MODELS[name]()
        if common.QUICK:
            steps = max(SKIP + 8, steps // 2)
        results = measure(model, steps, batch, length, min(repeats, common.REPEATS),
                          min(hand_repeats, common.REPEATS))
        med = {side: {key: common.median([r[key] for r in runs])
                      for key in ("wall", "cpu", "tracing", "graph_cut", "data", "ours", "compiled",
                                  "lazy_tracing", "graph_cut_wall", "off_thread")}
               for side, runs in results.items()}
        for side, m in med.items():
            phases = results[side][0]["phases"]
            split = ", ".join(f"{p} {_ms(common.median([r['phases'][p] for r in results[side]]))}"
                              for p in phases)
            fetcher = (f" ({_ms(m['off_thread'])} of it on the loss fetcher's thread)"
                       if side == "fine_tune" else "")
            # A compiled step's run waits for the previous step inside torch_xla's timed
            # code: its LazyTracing timer then counts that wait (wall), not tracing.
            lazy = ("torch_xla's LazyTracing timer, the compiled steps' waits included"
                    if m["compiled"] else "torch_xla's LazyTracing timer")
            note = (f"per steady step, training thread's CPU: tracing {_ms(m['tracing'])} "
                    f"({lazy} {_ms(m['lazy_tracing'])}), graph cut "
                    f"{_ms(m['graph_cut'])} (wall {_ms(m['graph_cut_wall'])}, the wait for the "
                    f"previous execution included), data {_ms(m['data'])}, the loop's own "
                    f"{_ms(m['ours'])}{fetcher}; in all {_ms(m['cpu'])} CPU of the training "
                    f"thread, "
                    f"{_ms(m['wall'])} wall; "
                    f"phases: {split}; batch {batch}, length {length}, {steps} steps, "
                    f"the first {SKIP} left out")
            figures.append(common.Figure(GROUP, f"{name}, {side}: host CPU per step",
                                         m["cpu"] * 1000 if m["cpu"] else None, "ms",
                                         repeats=len(results[side]),
                                         note=note + "; reported: the split the target row "
                                         "below is taken from"))
        figures += _compiled_figures(name, model, med, results)
        shares = [r["ours"] / r["wall"] * 100 for r in results["fine_tune"]]
        label = (f"{name}: fine_tune's own host work (report, closures, step accounting) / "
                 "steady step")
        note = f"{_ms(med['fine_tune']['ours'])} of {_ms(med['fine_tune']['wall'])} per step"
        if "hand-written" in med:
            note += f"; the hand-written loop's own lines {_ms(med['hand-written']['ours'])}"
        if targeted:
            figures.append(common.target_figure(GROUP, label, common.median(shares), "<=", 2,
                                                "%", len(shares), note, shares))
        else:
            figures.append(common.Figure(
                GROUP, label, common.median(shares), "%", repeats=len(shares), samples=shares,
                note=note + "; reported: the 2% target is the tiny BERT's, whose step is the "
                "shortest (the hard case)"))
    return figures


def _parameters(model: str) -> int:
    """The model's parameter count (built on the meta device: no memory, no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    with torch.device("meta"):
        network = AutoModelForSequenceClassification.from_config(
            AutoConfig.from_pretrained(model))
    return sum(parameter.numel() for parameter in network.parameters())


def _compiled_figures(name: str, model: str, med: dict, results: dict) -> list[common.Figure]:
    """Each step run by its compiled graph against every step traced; for BERT-base, the
    target and what a TPU would need for the step."""
    ours, traced = med["fine_tune"], med[TRACED]
    ratio = ours["cpu"] / traced["cpu"] if ours["cpu"] and traced["cpu"] else None
    note = (f"{_ms(ours['cpu'])} against {_ms(traced['cpu'])} of the training thread's CPU per "
            f"steady step (the compiled step's run {_ms(ours['compiled'])}; traced: tracing "
            f"{_ms(traced['tracing'])}, graph cut {_ms(traced['graph_cut'])}); wall per step "
            f"{_ms(ours['wall'])} against {_ms(traced['wall'])}; {len(results[TRACED])} traced "
            "run beside the first; reported")
    figures = [common.Figure(GROUP, f"{name}, fine_tune: host CPU per step, compiled steps / "
                             "every step traced", ratio, "x", repeats=len(results[TRACED]),
                             note=note)]
    if name != "BERT-base":
        return figures
    figures.append(common.target_figure(
        GROUP, "BERT-base, fine_tune: host CPU per step", ours["cpu"] * 1000, "<=",
        BASE_TARGET_MS, "ms", len(results["fine_tune"]),
        f"measured at batch 2 x 32 tokens on XLA:CPU (tracing is per operation, not per row: "
        f"the host's work hardly changes with the batch); every step traced "
        f"{_ms(traced['cpu'])}"))
    flops = 6 * _parameters(model) * PROJECTED_TOKENS
    for chip, peak in TPU_PEAKS.items():
        chip_ms = flops / peak * 1000
        figures.append(common.Figure(
            GROUP, f"BERT-base: host CPU per step / a {chip}'s time for the step at its peak "
            "(projection, not a TPU measurement)", ours["cpu"] * 1000 / chip_ms, "x",
            note=f"{_ms(ours['cpu'])} of host CPU (measured here) against {chip_ms:.1f} ms: "
            f"6 x {flops / 6 / PROJECTED_TOKENS / 1e6:.0f}M parameters x {PROJECTED_TOKENS} "
            f"tokens (32 x 128) = {flops / 1e12:.2f} TFLOP at {peak / 1e12:.0f} TFLOP/s; "
            f"every step traced: {traced['cpu'] * 1000 / chip_ms:.2f}x; below 1x the chip "
            "never waits for Python; reported"))
    return figures


def main(argv: list[str] | None = None) -> int:
    import argparse

    common.bench_environment()
    parser = argparse.ArgumentParser(prog="python -m bench.host_time", description=__doc__)
    parser.add_argument("--models", default="",
                        help="comma-separated: tiny BERT,BERT 4x256,BERT-base")
    args = parser.parse_args(argv)
    for figure in run(tuple(filter(None, args.models.split(","))) or None):
        common.say(f"{figure.name}: {common.number_text(figure.value, figure.unit)} "
                   f"(target {figure.target or '-'}: {common.status_text(figure)}); {figure.note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
