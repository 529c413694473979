"""Test collection and marks.

The browser suite (tests/browser) and the Binder build (tests/binder) run only when asked for by
path (`make test-browser`, `make test-binder`, `pytest tests/browser`), never in a plain
`pytest` / `make test`.

Each test is marked by what it does, read from its source and that of the fixtures and module
functions it uses (`marks_of`): `kernel` (starts a Jupyter kernel), `launch` (forks workers,
runs a subprocess or XLA), `slow` (long without either: `SLOW`). `make test-fast` runs the
tests with none of them; a test without them that still forks or starts a process fails, named
(`pytest_runtest_call`), so the fast set stays what it says.
"""

from __future__ import annotations

import ast
import os
import sys
from functools import cache as cached
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
# tests/pods start a Ray cluster: only inside their network namespace (`make test-pods`).
# tests/xla_in_process use XLA in the test process itself, which would make every later launch
# from it refuse (its runtime started): tests/test_xla_in_process.py runs them in their own.
OPT_IN = (TESTS / "browser", TESTS / "binder", TESTS / "pods", TESTS / "xla_in_process")

# Names whose use starts a Jupyter kernel, and those whose use forks or starts a process.
KERNEL_NAMES = frozenset({"Kernel", "started_kernel", "kernel_fixture", "run_notebook",
                          "NotebookClient", "KernelManager"})
LAUNCH_CALLS = frozenset({"notebook_launcher", "fine_tune", "predict", "generate", "run_demo",
                          "run_demo_lm", "run_demo_seq2seq", "run_demo_task", "main",
                          "launched", "doctor"})
PROCESS_NAMES = frozenset({"subprocess", "Popen", "run_python", "fork", "multiprocessing",
                           "ProcessPoolExecutor", "spawn", "system",
                           "write_results"})  # bench's: `uname -p` names the CPU
# A function that refuses launches first (bad input): its launch calls fork nothing.
REFUSES = frozenset({"refuse_launches", "no_launch"})
# Tests that start no process but take seconds each here (2 shared cores, measured under load):
# not in the fast set.
SLOW = frozenset({
    # Load transformers for the memory plan (about 20 s here), as tests/test_memory_plan.py does.
    "tests/test_tpu_runs.py::test_the_memory_plan_has_the_hbm_xla_reported_on_the_recorded_hosts",
    "tests/test_tpu_runs.py::test_gemma_7b_does_not_fit_a_16_gib_device_as_xla_said",
    "tests/test_lora.py::test_bad_lora_input_is_refused_before_anything_happens",  # imports peft:
    "tests/test_lora.py::test_lora_auto_and_the_plan_decide_before_the_fork",  # 15 s, for 2
    "tests/test_lora_classifier.py::test_lora_on_a_task_without_it_is_refused_before_anything_happens",
    "tests/test_trainer.py::test_training_arguments_refuse_in_the_kernel",  # its module: peft
    "tests/test_task_plugins.py::test_no_task_name_is_compared_outside_the_tasks_package",
    "tests/test_causal_lm.py::test_bad_inputs_are_refused_before_anything_happens",  # a Llama
    "tests/test_task_auto.py::test_auto_picks_the_task_of_the_models_head",  # builds 4 models
    "tests/test_demo.py::test_two_fresh_caches_get_the_same_tokenizer",  # trains 2 tokenizers
})
# Tests that start a process in code the reading above does not follow (outside tests/).
STARTS_PROCESSES = frozenset({
    "tests/test_bench_methods.py::test_the_zygote_forks_a_fresh_process_per_side",
})
# What the audit hook counts as starting a process (a fork, an exec, a spawn).
PROCESS_EVENTS = frozenset({"os.fork", "os.forkpty", "subprocess.Popen", "os.posix_spawn",
                            "os.spawn", "os.exec", "os.system", "pty.spawn"})
_started_processes: list[str] = []


def _count_processes(event: str, args: tuple) -> None:
    if event in PROCESS_EVENTS:
        _started_processes.append(f"{event} {str(args)[:120]}")


sys.addaudithook(_count_processes)


def _asks_for(folder: Path, arg: str) -> bool:
    path = Path(arg.split("::")[0]).resolve()
    return path == folder or folder in path.parents




# -- marks -----------------------------------------------------------------------------------


@cached
def module_definitions(path: Path) -> dict[str, ast.AST]:
    """A test module's top-level functions and assignments by name, with those it imports from
    other modules of tests/ (their definitions there)."""
    found: dict[str, ast.AST] = {}
    try:
        body = ast.parse(path.read_text()).body
    except SyntaxError:
        return found  # pytest's own import reports it
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
            source = TESTS.joinpath(*node.module.split(".")[1:]).with_suffix(".py")
            if source.is_file() and source != path:
                theirs = module_definitions(source)
                found.update({a.asname or a.name: theirs[a.name] for a in node.names
                              if a.name in theirs})
    return found


def _names_in(node: ast.AST) -> set[str]:
    names = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Name):
            names.add(inner.id)
        elif isinstance(inner, ast.Attribute):
            names.add(inner.attr)
        elif isinstance(inner, ast.arg):
            names.add(inner.arg)  # fixtures a function asks for
        elif isinstance(inner, ast.alias):
            names.add((inner.asname or inner.name).split(".")[0])
    return names


def _marks_of_code(root: ast.AST, definitions: dict[str, ast.AST]) -> set[str]:
    """The marks a function earns by what it and the functions and fixtures it names use."""
    marks: set[str] = set()
    seen: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        names = _names_in(node)
        if names & KERNEL_NAMES:
            marks.add("kernel")
        if names & PROCESS_NAMES or (names & LAUNCH_CALLS and not names & REFUSES):
            marks.add("launch")
        todo.extend(definitions[name] for name in names if name in definitions)
    return marks


def _autouse_fixtures(definitions: dict[str, ast.AST]) -> list[str]:
    return [name for name, node in definitions.items()
            if isinstance(node, ast.FunctionDef) and any(
                "autouse" in ast.unparse(decorator) for decorator in node.decorator_list)]


def marks_of(path: Path, name: str) -> set[str]:
    """`kernel`, `launch` and `slow`: what the test `name` of the module at `path` does, read
    from its code (and that of the fixtures and functions it names), not run."""
    if path.suffix != ".py" or TESTS not in path.parents:
        return set()
    if any(_asks_for(folder, str(path)) for folder in OPT_IN):
        return {"slow", "launch"}
    test = f"{path.relative_to(TESTS.parent)}::{name}"
    marks = ({"slow"} if test in SLOW else set()) | (
        {"launch"} if test in STARTS_PROCESSES else set())
    definitions = module_definitions(path)
    autouse = ast.parse("\n".join(f"{fixture}()" for fixture in _autouse_fixtures(definitions)))
    if name in definitions:
        marks |= _marks_of_code(definitions[name], definitions)
    return marks | _marks_of_code(autouse, definitions)


def _selected(config, marks: set[str]) -> bool:
    """Whether `-m` selects a test with these marks (every test without `-m`)."""
    expression = config.getoption("markexpr")
    if not expression:
        return True
    from _pytest.mark.expression import Expression  # pytest's own reading of `-m`

    return Expression.compile(expression).evaluate(lambda mark, **_: mark in marks)


def pytest_ignore_collect(collection_path, config):
    for folder in OPT_IN:
        if collection_path == folder and not any(_asks_for(folder, a) for a in config.args):
            return True
    if _none_selected(collection_path, config):
        return True  # not even imported: `make test-fast` would import torch for nothing
    return None


def _none_selected(path: Path, config) -> bool:
    """Whether `-m` selects none of the tests of the module at `path`, read from its code."""
    if path.suffix != ".py" or not path.name.startswith("test_") or TESTS not in path.parents:
        return False
    tests = [name for name in module_definitions(path) if name.startswith(("test_", "Test"))]
    return bool(tests) and not any(_selected(config, marks_of(path, name)) for name in tests)


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.path))
        cls = getattr(item, "cls", None)
        name = cls.__name__ if cls else getattr(item, "originalname", item.name)
        for mark in sorted(marks_of(path, name)):
            item.add_marker(mark)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    _started_processes.clear()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    marked = {mark.name for mark in item.iter_markers()} & {"kernel", "launch", "slow"}
    if _started_processes and not marked:
        pytest.fail(f"this test started a process but has no `launch` or `kernel` mark, so "
                    f"`make test-fast` would run it: {_started_processes[:3]}. Name what it "
                    f"calls in tests/conftest.py (PROCESS_NAMES, LAUNCH_CALLS) or mark it.",
                    pytrace=False)
    return result


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """One folder for the demo models and tokenizers the tests build (`..._model_dir(cache=)`),
    so each is built once per session."""
    return tmp_path_factory.getbasetemp() / "hfxla_nb_cache"


@pytest.fixture(autouse=True)
def _environment_restored():
    """What a test body sets in os.environ ends with the test (`demo.main()` quiets XLA's C++
    log, for one), so a later test's subprocess or kernel starts as a user's would."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def _runtime_not_started_by_a_test(request):
    """The test process launches (it is the kernel of `fine_tune` and `notebook_launcher`
    tests): a test that starts XLA's runtime in it would make every later launch refuse. Named
    at the test that did it, not at the hundred launches after it."""
    from hfxla_nb import _xla

    if _asks_for(TESTS / "xla_in_process", str(request.node.path)):
        yield  # their own process: XLA in it is what they test
        return
    started = _xla.runtime_is_initialized()
    yield
    if not started and _xla.runtime_is_initialized():
        pytest.fail("this test started the XLA runtime in the test process; use XLA inside a "
                    "launched function, a subprocess (tests.helpers.run_python) or "
                    "tests/xla_in_process/")
