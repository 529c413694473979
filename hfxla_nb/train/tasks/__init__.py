"""The fine-tuning tasks, by name: the one place a task plugs in (see docs/tasks.md).

`TASKS` maps each task name to its task object (a `tasks.base.Task`), which says everything
that differs between tasks: in the kernel, how the picked splits are read, checked and encoded
(`prepare`, returning a `preparation.Prepared`), how `predict`'s inputs are, and what the
result says of the task; in the worker, the training loss, what evaluation computes on the
device and then on the host, and how a prediction is decoded (`decode`, shared by evaluation
and `predict`). The kernel and the worker read these hooks and attributes, and never compare
task names.

Adding a task is one module. Write it with a `Task` subclass (its `name`, `auto_class`,
`head_suffixes`, `prepare`, `train_loss`, `eval_outputs`, `eval_metrics`, `decode`; the
attributes whose defaults do not fit it), and call `register_task(MyTask())` at its bottom.
Importing the module makes `fine_tune(..., task="my-task")` work: `FineTuneConfig` checks
`task=` against this registry, `prepare_fine_tune` calls the task's `prepare` and builds the
plan, the worker calls its hooks. A built-in task is also listed in `TASK_MODULES`, so that
its name is known, and its module imported, on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any

#: The `task=` value that lets the model's head, else the data's columns, decide.
AUTO = "auto"
#: The task of `task="auto"` when neither the head nor the columns name one.
DEFAULT_TASK = "classification"
#: Built-in task name -> module of `hfxla_nb.train.tasks` that registers it (imported on first
#: use).
TASK_MODULES: dict[str, str] = {
    "classification": ".classification",
    "causal-lm": ".causal_lm",
    "token-classification": ".token_classification",
    "question-answering": ".question_answering",
    "masked-lm": ".masked_lm",
    "multiple-choice": ".multiple_choice",
    "seq2seq": ".seq2seq",
    "audio-classification": ".audio_classification",
    "image-classification": ".image_classification",
    "speech-recognition": ".speech_recognition",
}


class TaskRegistry(Mapping):
    """Task name -> task object; built-in tasks are imported when first looked up."""

    def __init__(self) -> None:
        self._tasks: dict[str, Any] = {}

    def register(self, task: Any) -> Any:
        self._tasks[task.name] = task
        return task

    def unregister(self, name: str) -> None:
        """Forget a task registered in this process; a built-in task stays.

        Raises:
            ValueError: `name` is a built-in task (its module registers it once).
        """
        if name in TASK_MODULES:
            raise ValueError(f"{name!r} is a built-in task: it stays registered.")
        self._tasks.pop(name, None)

    def __getitem__(self, name: str) -> Any:
        if name not in self._tasks and name in TASK_MODULES:
            importlib.import_module(TASK_MODULES[name], __package__)
        return self._tasks[name]

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*TASK_MODULES, *self._tasks]))

    def __len__(self) -> int:
        return len(set(TASK_MODULES) | set(self._tasks))


TASKS = TaskRegistry()


def register_task(task: Any) -> Any:
    """Make `task` (a `tasks.Task`) available as `fine_tune(..., task=task.name)`."""
    return TASKS.register(task)


def unregister_task(name: str) -> None:
    """Forget the task registered as `name` (for a notebook or a test that tried one)."""
    TASKS.unregister(name)


def task_choices() -> tuple[str, ...]:
    """What `task=` accepts: "auto" and every registered task name."""
    return (AUTO, *TASKS)


def plain_prediction_table(predictions: list[dict[str, Any]]
                           ) -> tuple[list[dict[str, Any]], list[str] | None]:
    """The default `Task.prediction_table`: one row per input, each prediction's
    "probabilities" left out; None for the columns (the rows' keys). Here, not in `base`, so
    that `Predictions` can show a task-less list without importing the tasks."""
    rows = [{key: value for key, value in item.items() if key != "probabilities"}
            for item in predictions]
    return rows, None
