"""What a `transformers.Trainer` user expects of a `fine_tune` run, with the Trainer's names:
learning-rate schedules (`lr_scheduler_type`, `warmup_ratio`), evaluation during training
(`eval_strategy`, `eval_steps`), the best model (`metric_for_best_model`, `greater_is_better`,
`load_best_model_at_end`, `save_total_limit`) and `callbacks`.

Checked in the kernel before any fork: the options alone in `FineTuneConfig.validate`
(`config.check_trainer_options`), against the data and the step count in `prepare`
(`trainer_settings`).
The worker side is `worker/callbacks.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .config import FineTuneError


class ReportsMetrics(Protocol):
    """What the settings read of a task (`tasks.base.Task`, which imports this module's
    callers: named by its shape to keep the imports one way)."""

    name: str
    takes_compute_metrics: bool

    def eval_metric_names(self, config: Any) -> tuple[str, ...] | None: ...

@dataclass
class TrainerSettings:
    """The Trainer-named options of one run, resolved (plain data, forked with the plan).

    Attributes:
        lr_scheduler_type: a name of `config.SCHEDULES`.
        lr_scheduler_kwargs: passed to `transformers.get_scheduler` as
            `scheduler_specific_kwargs`.
        warmup_steps: warm-up steps (`warmup_ratio` or a fractional `warmup_steps` resolved).
        eval_strategy: "no", "steps" or "epoch".
        eval_steps: evaluate every this many steps ("steps"; else None).
        metric_for_best_model: the metric that picks the best evaluation, with its "eval_"
            prefix, or None.
        greater_is_better: whether a larger `metric_for_best_model` is better.
        load_best_model_at_end: the result's metrics and saved model are the best
            evaluation's.
        save_total_limit: keep at most this many checkpoints (the best one besides), or None.
        callbacks: the `transformers.TrainerCallback`s to call in the worker.
    """

    lr_scheduler_type: str = "linear"
    lr_scheduler_kwargs: dict[str, Any] = field(default_factory=dict)
    warmup_steps: int = 0
    eval_strategy: str = "no"
    eval_steps: int | None = None
    metric_for_best_model: str | None = None
    greater_is_better: bool = False
    load_best_model_at_end: bool = False
    save_total_limit: int | None = None
    callbacks: tuple = ()

    def when_evaluating(self) -> str:
        """When the evaluation runs, in words: "every 10 steps", "each epoch", or "after
        training"."""
        if self.eval_strategy == "steps":
            return f"every {self.eval_steps} steps"
        return "each epoch" if self.eval_strategy == "epoch" else "after training"


@dataclass(frozen=True)
class TrainerMetrics:
    """A Trainer-style `compute_metrics`, among a run's metrics (`TrainPlan.metrics`)."""

    function: Callable[[Any], Mapping[str, float]]

    def __call__(self, scores: np.ndarray, labels: np.ndarray) -> dict[str, float]:
        """The function's values for `EvalPrediction(scores, labels)`, each named "eval_...".

        Raises:
            TypeError: the function returned something else than a mapping of numbers.
        """
        from transformers import EvalPrediction

        values = self.function(EvalPrediction(predictions=scores, label_ids=labels))
        if not isinstance(values, Mapping):
            raise TypeError(f"compute_metrics returned {type(values).__name__}; return a dict "
                            "of floats, as for the Trainer ({'f1': 0.9}).")
        return {name if name.startswith("eval_") else f"eval_{name}": float(value)
                for name, value in values.items()}


def trainer_settings(config: Any, task: ReportsMetrics, total_steps: int,
                     has_eval: bool) -> TrainerSettings:
    """The run's `TrainerSettings`, resolved as `transformers.TrainingArguments` resolves
    them (a ratio of steps, `metric_for_best_model` "loss" with `load_best_model_at_end`,
    `greater_is_better` from the metric's name), checked against the data.

    Raises:
        FineTuneError: evaluation asked for without evaluation data, a best-model metric the
            task's evaluation does not report, or schedule options the schedule refuses.
    """
    if config.compute_metrics is not None and not task.takes_compute_metrics:
        raise FineTuneError(
            f"compute_metrics works for classification of text and images; a {task.name!r} "
            "run reports its own metrics: leave compute_metrics out.")
    strategy = config.eval_strategy
    if strategy != "no" and not has_eval:
        raise FineTuneError(
            f"eval_strategy={strategy!r} evaluates during training, and this run has no "
            "evaluation data: pass eval_dataset=..., or a DatasetDict with a 'validation' "
            "split (or eval_strategy='no').")
    eval_steps = None
    if strategy == "steps":
        steps = config.eval_steps if config.eval_steps is not None else config.log_every
        eval_steps = int(steps) if steps >= 1 else math.ceil(total_steps * steps)
    warmup = config.warmup_steps
    if config.warmup_ratio:
        warmup = math.ceil(total_steps * config.warmup_ratio)
    elif warmup and warmup < 1:
        warmup = math.ceil(total_steps * warmup)
    metric = config.metric_for_best_model
    if metric is None and config.load_best_model_at_end:
        metric = "loss"
    greater = config.greater_is_better
    if metric is not None:
        short = metric[5:] if metric.startswith("eval_") else metric
        names = task.eval_metric_names(config)
        if names is not None and short not in names:
            raise FineTuneError(
                f"metric_for_best_model={config.metric_for_best_model!r}: a {task.name!r} "
                f"evaluation reports {', '.join(map(repr, names))}; pass one of them.")
        if greater is None:
            greater = not short.endswith("loss")
        metric = "eval_" + short
    settings = TrainerSettings(
        lr_scheduler_type=config.lr_scheduler_type,
        lr_scheduler_kwargs=dict(config.lr_scheduler_kwargs or {}),
        warmup_steps=int(warmup), eval_strategy=strategy, eval_steps=eval_steps,
        metric_for_best_model=metric, greater_is_better=bool(greater),
        load_best_model_at_end=bool(config.load_best_model_at_end),
        save_total_limit=config.save_total_limit, callbacks=tuple(config.callbacks))
    learning_rates(settings, 1.0, total_steps)  # the schedule's own options, checked now
    return settings


def learning_rates(settings: TrainerSettings, learning_rate: float,
                   total_steps: int) -> list[float]:
    """The rate of each step (`transformers.get_scheduler`'s, step 1 first), computed on the
    host with a throwaway optimizer.

    Raises:
        FineTuneError: the schedule refuses its options (`lr_scheduler_kwargs`).
    """
    import torch
    from transformers import get_scheduler

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=learning_rate)
    try:
        scheduler = get_scheduler(settings.lr_scheduler_type, optimizer,
                                  num_warmup_steps=settings.warmup_steps,
                                  num_training_steps=total_steps,
                                  scheduler_specific_kwargs=dict(settings.lr_scheduler_kwargs))
    except (TypeError, ValueError) as error:
        raise FineTuneError(f"lr_scheduler_type={settings.lr_scheduler_type!r} with "
                            f"lr_scheduler_kwargs={settings.lr_scheduler_kwargs!r}: {error}"
                            ) from None
    lambdas = scheduler.lr_lambdas[0]
    return [learning_rate * lambdas(step) for step in range(total_steps)]


def take_back(callbacks: tuple, states: list[dict[str, Any] | None] | None) -> None:
    """Give the notebook's callback objects the attributes the worker's copies ended the run
    with (what a callback collected: losses to plot, a patience counter)."""
    for callback, state in zip(callbacks, states or [], strict=False):
        if state is not None:
            vars(callback).update(state)
