"""`fine_tune(report_to=...)`: the run's tracker, its hyper-parameters and its final figures.

The kernel side only: the tracker (`observe.tracking.Tracker`) follows the launch's events in
the notebook process, as the panels do; the worker sends nothing more for it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ..observe.tracking import (
    HParam,
    Tracker,
    TrackingSettings,
    check_report_to,
    default_log_dir,
    plain,
)
from .config import FineTuneConfig
from .memory_plan import MemoryPlan
from .plan import TrainPlan
from .result import FineTuneResult
from .worker.checkpoint import RUNS

#: The result's figures written when the run ends, as `final/<name>`.
FINAL_FIGURES = ("samples_per_second", "samples_per_second_overall", "executions_per_step",
                 "transfers_per_step", "uploads_per_step", "compiles", "eval_compiles",
                 "setup_compiles", "train_seconds", "eval_seconds")


def fine_tune_tracker(config: FineTuneConfig, plan: TrainPlan) -> Tracker | None:
    """The run's tracker (None without `report_to`): TensorBoard's files in `log_dir`, else
    `output_dir/runs/<run_name or date-time_host>`; every `FineTuneConfig` field and the
    memory plan as hyper-parameters."""
    names = check_report_to(config.report_to)  # checked when the config was made
    if not names:
        return None
    log_dir = config.log_dir
    if log_dir is None and plan.save:
        log_dir = default_log_dir(os.path.join(plan.output_dir, RUNS), config.run_name)
    return Tracker(TrackingSettings(
        names, os.fspath(log_dir) if log_dir is not None else None, config.project,
        config.run_name, fine_tune_hparams(config, plan.memory)))


def fine_tune_hparams(config: FineTuneConfig, memory: MemoryPlan | None) -> dict[str, HParam]:
    """Every field of `config` by its name, and the memory plan's as `memory/<field>` (its
    changes as one line), as plain values (`observe.tracking.plain`)."""
    values = {field.name: plain(getattr(config, field.name))
              for field in dataclasses.fields(config)}
    if memory is not None:
        for field in dataclasses.fields(memory):
            value: Any = getattr(memory, field.name)
            if field.name == "changes":
                value = "; ".join(f"{change.change}: {change.total_gib:.2f} GiB"
                                  + ("" if change.fits else " (does not fit)")
                                  for change in value)
            values[f"memory/{field.name}"] = plain(value)
    return values


def final_figures(result: FineTuneResult) -> dict[str, float]:
    """What the run measured, for the trackers' last step and summary: the evaluation
    metrics as `eval/<name>` (`eval_accuracy`: `eval/accuracy`), and `final/<figure>` for
    each of `FINAL_FIGURES` the run has."""
    figures: dict[str, float] = {}
    for name, value in (result.metrics or {}).items():
        if _number(value):
            figures["eval/" + (name[5:] if name.startswith("eval_") else name)] = value
    for name in FINAL_FIGURES:
        value = getattr(result, name, None)
        if _number(value):
            figures[f"final/{name}"] = value
    return figures


def finish_tracker(tracker: Tracker | None, result: FineTuneResult) -> None:
    """The run ended: its final figures written at its last step, every tracker closed."""
    if tracker is None:
        return
    try:
        tracker.finish(result.steps, final_figures(result))
    finally:
        tracker.close()


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
