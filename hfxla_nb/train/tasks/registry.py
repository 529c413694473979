"""The fine-tuning tasks, by name: the one place a task plugs in.

`TASK_MODULES` maps each built-in task name to the module that defines it; the module is
imported on first use and registers its task object with `register_task`. A task object says
everything that differs between tasks (docs in `tasks.Task`): how the kernel prepares the
data (`prepare`), the training loss, what evaluation computes on the device and then on the
host, and how a prediction is decoded (`decode`, shared by evaluation and `predict`).

Adding a task: write a module with a `tasks.Task` subclass, call `register_task(MyTask())` at
its bottom, and add `"my-task": ".my_module"` to `TASK_MODULES` (so `task="my-task"` is known
before the module is imported). Nothing else changes: `FineTuneConfig` validates `task=`
against this registry, `prepare_fine_tune` calls the task's `prepare`, the worker its hooks.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any

#: Built-in task name -> module of `hfxla_nb.train` that registers it (imported on first use).
TASK_MODULES: dict[str, str] = {
    "classification": ".classification",
    "causal-lm": ".causal_lm",
    "token-classification": ".token_classification",
    "question-answering": ".question_answering",
    "masked-lm": ".masked_lm",
    "multiple-choice": ".multiple_choice",
    "seq2seq": ".seq2seq",
}


class TaskRegistry(Mapping):
    """Task name -> task object; built-in tasks are imported when first looked up."""

    def __init__(self) -> None:
        self._tasks: dict[str, Any] = {}

    def register(self, task: Any) -> Any:
        self._tasks[task.name] = task
        return task

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


def task_choices() -> tuple[str, ...]:
    """What `task=` accepts: "auto" and every registered task name."""
    return ("auto", *TASKS)
