"""The worker's typed interface (`train/worker/context.py`): every task hook and worker helper
takes a `WorkerContext` (no untyped `run`), no worker class keeps a module on its instance, and
`WorkerTask` (what the worker calls on a task) names only what `tasks.base.Task` defines. Static
checks: no XLA runtime starts."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import hfxla_nb
from hfxla_nb.train.tasks import TASKS
from hfxla_nb.train.tasks.base import Task
from hfxla_nb.train.worker.context import WorkerTask

PACKAGE = Path(hfxla_nb.__file__).parent
WORKER_SIDE = [*sorted((PACKAGE / "train" / "worker").glob("*.py")),
               *sorted((PACKAGE / "train" / "tasks").glob("*.py")),
               PACKAGE / "train" / "lora.py"]


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_hook_or_helper_takes_an_untyped_run():
    untyped = []
    for path in WORKER_SIDE:
        for function in _functions(path):
            for argument in function.args.args:
                annotation = ast.unparse(argument.annotation) if argument.annotation else None
                if argument.arg in ("run", "ctx") and annotation != "WorkerContext":
                    untyped.append(f"{path.name}:{function.lineno} {function.name}")
    assert untyped == []


def test_no_worker_class_keeps_a_module_on_its_instance():
    stored = []
    for path in WORKER_SIDE:
        for function in _functions(path):
            for node in ast.walk(function):
                if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
                        and node.value.id in ("torch", "_xla", "np", "transformers")
                        and any(isinstance(target, ast.Attribute) for target in node.targets)):
                    stored.append(f"{path.name}:{node.lineno}")
    assert stored == []


def test_what_the_worker_calls_on_a_task_is_what_task_defines():
    declared = {name for name in vars(WorkerTask) if not name.startswith("_")}
    declared |= set(WorkerTask.__annotations__)
    assert declared <= set(dir(Task))
    for name in ("train_loss", "eval_outputs", "eval_metrics", "decode", "chance_accuracy"):
        assert (list(inspect.signature(getattr(WorkerTask, name)).parameters)
                == list(inspect.signature(getattr(Task, name)).parameters)), name


def test_tasks_say_whether_evaluation_compiles_ahead_and_their_chance_accuracy():
    ahead = {name for name in TASKS if TASKS[name].eval_ahead}
    assert ahead == {"classification", "causal-lm", "token-classification",
                     "question-answering", "masked-lm", "multiple-choice",
                     "image-classification", "audio-classification", "speech-recognition"}
    assert TASKS["seq2seq"].chance_accuracy(None) is None
    assert TASKS["classification"].chance_accuracy(None) is None
