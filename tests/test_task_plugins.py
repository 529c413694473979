"""Every task a plug-in: what differs between tasks is an attribute or a method of the task.

Read from the source with `ast` (nothing is launched, no fork): no module outside
`hfxla_nb/train/tasks/` compares a task name; each built-in task is defined by its own module
only; every task attribute the kernel and the worker read exists on `Task`. And a task
registered from here, in no file of the package, goes through `prepare_fine_tune`.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import hfxla_nb
from hfxla_nb.train import FineTuneConfig, prepare_fine_tune
from hfxla_nb.train.tasks import TASK_MODULES, TASKS, register_task, unregister_task
from hfxla_nb.train.tasks.base import Task
from hfxla_nb.train.tasks.classification import Classification

PACKAGE = Path(hfxla_nb.__file__).parent
TASKS_DIR = PACKAGE / "train" / "tasks"
TASK_NAMES = frozenset(TASK_MODULES)


def _modules(inside_tasks: bool) -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))
            if (TASKS_DIR in path.parents) == inside_tasks}


def _names_in(node: ast.AST) -> set[str]:
    """The task names written as string constants inside `node`."""
    return {n.value for n in ast.walk(node)
            if isinstance(n, ast.Constant) and n.value in TASK_NAMES}


def _collections_of_names(modules: dict[Path, ast.Module]) -> set[str]:
    """Names bound at a module's or a class's top level to a collection that holds task names
    (`AHEAD_TASKS = frozenset({...})`, `TASK_TYPES = {"causal-lm": ...}`)."""
    found = set()
    for tree in modules.values():
        bodies = [tree.body] + [n.body for n in tree.body if isinstance(n, ast.ClassDef)]
        for statement in (s for body in bodies for s in body):
            value = getattr(statement, "value", None)
            if isinstance(statement, (ast.Assign, ast.AnnAssign)) and value is not None and (
                    isinstance(value, (ast.Set, ast.List, ast.Tuple, ast.Dict, ast.Call))
                    and _names_in(value)):
                targets = statement.targets if isinstance(statement, ast.Assign) else [
                    statement.target]
                found |= {t.id for t in targets if isinstance(t, ast.Name)}
    return found


def _comparisons_of_task_names(path: Path, tree: ast.Module, collections: set[str]) -> list[str]:
    where = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        constants = {o.value for o in operands if isinstance(o, ast.Constant)} & TASK_NAMES
        against = [c for op, c in zip(node.ops, node.comparators, strict=True)
                   if isinstance(op, (ast.In, ast.NotIn))]
        names = {c.id if isinstance(c, ast.Name) else c.attr for c in against
                 if isinstance(c, (ast.Name, ast.Attribute))}
        literal = any(isinstance(c, (ast.Set, ast.List, ast.Tuple, ast.Dict)) and _names_in(c)
                      for c in against)
        if constants or literal or names & collections:
            where.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: "
                         f"{ast.unparse(node)}")
    return where


@pytest.mark.slow  # parses every module of the package
def test_no_task_name_is_compared_outside_the_tasks_package():
    outside = _modules(inside_tasks=False)
    collections = _collections_of_names(outside)
    found = [line for path, tree in outside.items()
             for line in _comparisons_of_task_names(path, tree, collections)]
    assert not found, ("task names compared outside hfxla_nb/train/tasks/ (make it an "
                       "attribute or a method of the task):\n" + "\n".join(found))


def _defined_names(tree: ast.Module) -> set[str]:
    """The `name = "..."` of every class in a module."""
    return {statement.value.value for node in tree.body if isinstance(node, ast.ClassDef)
            for statement in node.body
            if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant)
            and any(isinstance(t, ast.Name) and t.id == "name" for t in statement.targets)}


def test_each_task_is_defined_by_its_own_module_only():
    defined = {path: _defined_names(tree) for path, tree in _modules(inside_tasks=True).items()}
    for name, module in TASK_MODULES.items():
        where = [path.name for path, names in defined.items() if name in names]
        assert where == [module.lstrip(".") + ".py"], (name, where)
        task = TASKS[name]
        assert isinstance(task, Task) and task.name == name
        assert type(task).__module__ == importlib.import_module(
            module, "hfxla_nb.train.tasks").__name__


def _task_attributes_read(modules: dict[Path, ast.Module]) -> dict[str, str]:
    """Attribute -> where, for every `task.x`, `<anything>.task.x` and `TASKS[...].x` read in
    hfxla_nb/train outside the tasks package (the kernel and the worker: `task` there is a
    task object)."""
    found = {}
    for path, tree in modules.items():
        if PACKAGE / "train" not in path.parents:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            value = node.value
            is_task = (isinstance(value, ast.Name) and value.id == "task") or (
                isinstance(value, ast.Attribute) and value.attr == "task") or (
                isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name)
                and value.value.id == "TASKS")
            if is_task:
                found.setdefault(node.attr, f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def test_every_task_attribute_the_kernel_and_the_worker_read_is_on_task():
    read = _task_attributes_read(_modules(inside_tasks=False))
    # The kernel's and the worker's own reads: found, so this test reads what it claims to.
    assert {"prepare", "peft_task_type", "check_model", "auto_class"} <= set(read)
    missing = {attribute: where for attribute, where in read.items()
               if not hasattr(Task, attribute)}
    assert not missing, f"read from a task but not on Task: {missing}"


class MyClassification(Classification):
    """Classification under another name, with one step of its own."""

    name = "my-classification"
    title = "my classification"

    def prepare(self, splits, config, context):
        prepared = super().prepare(splits, config, context)
        prepared.data.notes.append("prepared by my-classification")
        return prepared


@pytest.fixture
def my_task():
    task = register_task(MyClassification())
    yield task
    unregister_task(task.name)
    assert task.name not in TASKS


def test_a_task_registered_elsewhere_goes_through_prepare_fine_tune(my_task, cache):
    from hfxla_nb.demo import demo_dataset, demo_model_dir
    from hfxla_nb.train.result import FineTuneResult

    FineTuneConfig(task="my-classification")  # a choice of task= now
    plan = prepare_fine_tune(demo_model_dir(cache=cache), demo_dataset(n=100),
                             task="my-classification", batch_size=8, output_dir=None)
    assert plan.task == "my-classification" and plan.model_kwargs["num_labels"] == 2
    assert "prepared by my-classification" in plan.data.notes
    assert plan.steps_per_epoch == 10 and plan.data.eval is not None
    result = FineTuneResult.from_dict({
        "output_dir": None, "loss_history": [], "metrics": {}, "steps": 1, "epochs": 1.0,
        "samples_per_second": None, "train_seconds": 0.0, "compiles": 1, "eval_compiles": 0,
        "executions_per_step": None, "transfers_per_step": None, "label_names": [],
        "strategy": "spmd", "devices": 1, "precision": "fp32", "bucket_lengths": [],
        "task": plan.task})
    assert (result.task_title, result.shows_labels) == ("my classification", True)
