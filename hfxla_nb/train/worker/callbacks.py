"""The `transformers.Trainer` side of a `fine_tune` run in the worker: its `TrainerState`,
`TrainerControl` and a `TrainingArguments`-like `args`, the default flow's decisions (when to
log, evaluate and save: `transformers.DefaultFlowCallback`'s rules), the user's callbacks
called on the Trainer's events, `log_history` in the Trainer's format, and the best
evaluation (`metric_for_best_model`).

Everything here runs on the host between two steps; nothing reads the device. The loop
(`loop.py`) asks `step_end` what to do at a step boundary and does it (the loss fetch, an
evaluation with the graphs compiled ahead, a checkpoint), then reports it back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..flow import TrainerSettings

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState

    from ..plan import TrainPlan


@dataclass
class FineTuneArguments:
    """What `transformers.TrainingArguments` carries that callbacks read, with this run's
    values (the Trainer's names; `EarlyStoppingCallback` reads `metric_for_best_model`,
    `greater_is_better`, `load_best_model_at_end`, `eval_strategy`)."""

    output_dir: str | None
    learning_rate: float
    num_train_epochs: float
    max_steps: int
    per_device_train_batch_size: int
    train_batch_size: int
    gradient_accumulation_steps: int
    weight_decay: float
    max_grad_norm: float | None
    warmup_steps: int
    lr_scheduler_type: str
    lr_scheduler_kwargs: dict[str, Any]
    logging_steps: int
    eval_strategy: str
    eval_steps: int | None
    save_strategy: str
    save_steps: int | None
    save_total_limit: int | None
    metric_for_best_model: str | None
    greater_is_better: bool
    load_best_model_at_end: bool
    seed: int
    logging_strategy: str = "steps"
    logging_first_step: bool = False
    eval_delay: float = 0
    process_index: int = 0
    local_process_index: int = 0
    world_size: int = 1
    report_to: list[str] = field(default_factory=list)
    disable_tqdm: bool = True

    @property
    def should_save(self) -> bool:
        return self.output_dir is not None

    @property
    def should_log(self) -> bool:
        return True

    @classmethod
    def from_plan(cls, plan: TrainPlan) -> FineTuneArguments:
        settings = plan.trainer
        return cls(
            output_dir=plan.output_dir if plan.save else None,
            learning_rate=plan.learning_rate,
            num_train_epochs=plan.total_steps / plan.steps_per_epoch,
            max_steps=plan.total_steps, per_device_train_batch_size=plan.batch_size,
            train_batch_size=plan.batch_size,
            gradient_accumulation_steps=plan.gradient_accumulation_steps,
            weight_decay=plan.weight_decay, max_grad_norm=plan.max_grad_norm,
            warmup_steps=plan.warmup_steps, lr_scheduler_type=settings.lr_scheduler_type,
            lr_scheduler_kwargs=dict(settings.lr_scheduler_kwargs),
            logging_steps=plan.log_every, eval_strategy=settings.eval_strategy,
            eval_steps=settings.eval_steps,
            save_strategy="steps" if plan.save_steps else "no", save_steps=plan.save_steps,
            save_total_limit=settings.save_total_limit,
            metric_for_best_model=settings.metric_for_best_model,
            greater_is_better=settings.greater_is_better,
            load_best_model_at_end=settings.load_best_model_at_end, seed=plan.seed)


#: The Trainer's events that `TrainerRun` calls, in the order of one run.
EVENTS = ("on_init_end", "on_train_begin", "on_epoch_begin", "on_step_begin", "on_step_end",
          "on_log", "on_evaluate", "on_save", "on_epoch_end", "on_train_end")


class TrainerRun:
    """The Trainer's state around one worker's training loop.

    Args:
        plan: the run's plan (`plan.trainer`: the Trainer-named settings).
        objects: what the Trainer passes each callback as keywords (`model`,
            `processing_class`, `optimizer`, `lr_scheduler`).
        learning_rate: `learning_rate(step)`: the rate step `step` used.
        rank: this replica's index (the Trainer's `is_world_process_zero` for 0).

    Attributes:
        args, state, control: the callbacks' `args`, transformers' `TrainerState` and
            `TrainerControl`.
        evaluations: `(step, metrics)` of each evaluation, in order.
        best: `(step, metrics)` of the best evaluation (`metric_for_best_model`), or None.
    """

    def __init__(self, plan: TrainPlan, objects: dict[str, Any],
                 learning_rate: Any, rank: int = 0) -> None:
        from transformers import TrainerControl, TrainerState
        from transformers.trainer_callback import ExportableState

        self.plan = plan
        self.settings: TrainerSettings = plan.trainer
        self.args = FineTuneArguments.from_plan(plan)
        self.callbacks = list(self.settings.callbacks)
        self.control: TrainerControl = TrainerControl()
        self.state: TrainerState = TrainerState(
            max_steps=plan.total_steps, num_train_epochs=self.args.num_train_epochs,
            logging_steps=plan.log_every, eval_steps=self.settings.eval_steps or 0,
            save_steps=plan.save_steps or 0, train_batch_size=plan.batch_size,
            stateful_callbacks=[c for c in (*self.callbacks, self.control)
                                if isinstance(c, ExportableState)])
        self.state.is_world_process_zero = self.state.is_local_process_zero = rank == 0
        self.objects = {**objects, "train_dataloader": None, "eval_dataloader": None}
        self.learning_rate = learning_rate
        self.evaluations: list[tuple[int, dict[str, float]]] = []
        self.best: tuple[int, dict[str, float]] | None = None
        self.delivered = 0  # training log entries already in log_history
        self.stopped_early = False
        self.stopped_by: Any = None  # the callback that set should_training_stop, if one did

    # -- the events ------------------------------------------------------------------------------

    def call(self, event: str, **kwargs: Any) -> TrainerControl:
        """Call `event` on every callback, as `transformers.CallbackHandler.call_event` does
        (a callback that returns a control replaces it)."""
        for callback in self.callbacks:
            stopping = self.control.should_training_stop
            result = getattr(callback, event)(self.args, self.state, self.control,
                                              **self.objects, **kwargs)
            if result is not None:
                self.control = result
            if self.control.should_training_stop and not stopping and self.stopped_by is None:
                self.stopped_by = callback
        return self.control

    def stop_reason(self, done: int) -> str | None:
        """Why the training stopped at step `done`, before its last step: "stopped early at
        step 50 of 120: eval_accuracy did not improve for 2 evaluations
        (EarlyStoppingCallback)", or the callback that stopped it; None at the last step (the
        run ended there, it was not stopped)."""
        if done >= self.plan.total_steps:
            return None
        where = f"step {done} of {self.plan.total_steps}"
        callback = self.stopped_by
        name = type(callback).__name__ if callback is not None else "a callback"
        patience = getattr(callback, "early_stopping_patience", None)
        metric = self.settings.metric_for_best_model
        if isinstance(patience, int) and metric is not None:
            metric = metric if metric.startswith("eval_") else f"eval_{metric}"
            return (f"stopped early at {where}: {metric} did not improve for "
                    f"{patience} evaluation{'' if patience == 1 else 's'} ({name})")
        return f"stopped at {where}: {name} set control.should_training_stop"

    def train_begin(self, start_step: int) -> None:
        self.state.global_step = start_step
        self.state.epoch = start_step / self.plan.steps_per_epoch
        self.call("on_init_end")
        self.control.should_training_stop = False
        self.call("on_train_begin")
        self.control.should_epoch_stop = False
        self.call("on_epoch_begin")

    def step_begin(self) -> None:
        control = self.control
        control.should_log = control.should_evaluate = control.should_save = False
        if self.callbacks:
            self.call("on_step_begin")

    def step_end(self, done: int) -> TrainerControl:
        """Step `done` ran (was launched): the default flow's decisions, then the callbacks'
        `on_step_end`. Returns the control the loop follows at this boundary."""
        plan, settings, control, state = self.plan, self.settings, self.control, self.state
        state.global_step = done
        state.epoch = done / plan.steps_per_epoch
        # transformers.DefaultFlowCallback.on_step_end, with this run's save rule.
        if done % plan.log_every == 0:
            control.should_log = True
        if settings.eval_strategy == "steps" and done % settings.eval_steps == 0:
            control.should_evaluate = True
        if plan.save_steps and done % plan.save_steps == 0:
            control.should_save = True
        if done >= plan.total_steps:
            control.should_training_stop = True
            control.should_log = True  # the last step's loss, as fine_tune always logged it
            if settings.eval_strategy == "steps":
                control.should_evaluate = True
        if self.callbacks:
            self.call("on_step_end")
        return self.control

    def epoch_end(self, done: int) -> TrainerControl:
        """The end of an epoch (or of training inside one, as the Trainer's loop ends it)."""
        if self.settings.eval_strategy == "epoch":
            self.control.should_evaluate = True
        self.call("on_epoch_end")
        return self.control

    def epoch_begin(self) -> None:
        self.control.should_epoch_stop = False
        self.call("on_epoch_begin")

    # -- what the loop did -----------------------------------------------------------------------

    def deliver(self, history: list[tuple[int, float]]) -> None:
        """The training losses logged since the last call, into `log_history` and the
        callbacks' `on_log` (on this thread, in order)."""
        while self.delivered < len(history):
            step, loss = history[self.delivered]
            self.delivered += 1
            logs = {"loss": float(loss), "learning_rate": float(self.learning_rate(step)),
                    "epoch": step / self.plan.steps_per_epoch}
            self.state.log_history.append({**logs, "step": int(step)})
            self.call("on_log", logs=logs)

    def evaluated(self, step: int, metrics: dict[str, float], rank: bool = True) -> bool:
        """An evaluation at `step`: `log_history`, `on_log`, `on_evaluate`, then the best
        metric (the Trainer's order; `rank=False`: an evaluation after training, as
        `trainer.evaluate()`, which picks no best). Returns whether it is the best so far.

        Raises:
            KeyError: `metric_for_best_model` is not among the metrics (as the Trainer).
        """
        logs = {**metrics, "epoch": step / self.plan.steps_per_epoch}
        self.state.log_history.append({**logs, "step": int(step)})
        self.evaluations.append((step, dict(metrics)))
        self.call("on_log", logs=logs)
        self.control.should_evaluate = False
        self.call("on_evaluate", metrics=dict(metrics))
        return self.is_new_best(step, metrics) if rank else False

    def is_new_best(self, step: int, metrics: dict[str, float]) -> bool:
        """`Trainer._determine_best_metric`: updates `state.best_metric` and
        `best_global_step`; True for a new best."""
        name = self.settings.metric_for_best_model
        if name is None:
            return False
        if name not in metrics:
            raise KeyError(
                f"metric_for_best_model is {name!r}, which the evaluation did not report; it "
                f"reported {', '.join(sorted(metrics))}. Pass one of them.")
        value = metrics[name]
        better = np.greater if self.settings.greater_is_better else np.less
        if self.state.best_metric is None:
            self.state.best_metric = -math.inf if self.settings.greater_is_better else math.inf
        if not better(value, self.state.best_metric):
            return False
        self.state.best_metric = float(value)
        self.state.best_global_step = int(step)
        self.best = (step, dict(metrics))
        return True

    def saved(self, folder: str) -> None:
        """A checkpoint was written at the current step."""
        if self.state.best_global_step == self.state.global_step:
            self.state.best_model_checkpoint = folder
        self.control.should_save = False
        self.call("on_save")

    def train_end(self, summary: dict[str, float]) -> None:
        """The Trainer's last training log (runtime, throughput, mean loss), then
        `on_train_end`."""
        logs = {**summary, "epoch": self.state.global_step / self.plan.steps_per_epoch}
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.call("on_log", logs=logs)
        self.call("on_train_end")

    def ended_states(self) -> tuple[list[dict[str, Any] | None], list[str]]:
        """Each callback's attributes as the run left them, for the notebook's own objects
        (None for one that cannot be sent back), and a note naming each of those."""
        import pickle

        states, notes = [], []
        for callback in self.callbacks:
            try:
                pickle.dumps(vars(callback))
            except Exception as error:  # noqa: BLE001 - whatever pickling raised, said plainly
                states.append(None)
                notes.append(f"{type(callback).__name__}'s state stayed in the worker: its "
                             f"attributes could not be sent back ({error}).")
            else:
                states.append(dict(vars(callback)))
        return states, notes

    # -- checkpoints -----------------------------------------------------------------------------

    def saved_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of this: the evaluations, the best metric and the stateful
        callbacks' state (`EarlyStoppingCallback`'s patience counter)."""
        from transformers.trainer_callback import ExportableState

        return {"evaluations": [list(pair) for pair in self.evaluations],
                "best_metric": self.state.best_metric,
                "callbacks": [c.state() if isinstance(c, ExportableState) else None
                              for c in self.callbacks]}

    def restore(self, saved: dict[str, Any] | None, history: list[tuple[int, float]]) -> None:
        """A resumed run: `log_history` from the restored losses and the saved evaluations,
        the best metric and the callbacks' state as they were. The best weights of an
        evaluation before the resume are not kept: the best is chosen again from the
        evaluations after it."""
        saved = saved or {}
        evaluations = [(int(step), dict(metrics))
                       for step, metrics in saved.get("evaluations", [])]
        self.evaluations = list(evaluations)
        entries = [(step, 0, {"loss": float(loss),
                              "learning_rate": float(self.learning_rate(step))})
                   for step, loss in history]
        entries += [(step, 1, dict(metrics)) for step, metrics in evaluations]
        for step, _, logs in sorted(entries, key=lambda entry: entry[:2]):
            self.state.log_history.append(
                {**logs, "epoch": step / self.plan.steps_per_epoch, "step": step})
        self.delivered = len(history)
        for callback, state in zip(self.callbacks, saved.get("callbacks", []), strict=False):
            for name, value in ((state or {}).get("attributes") or {}).items():
                setattr(callback, name, value)
