"""Every test carries the marks of what it does, written on it, so `make test-fast` (the tests
with no `kernel`, `launch` or `slow` mark) starts no kernel and no process.

The marks are written, not inferred, so that fixtures can live in tests/conftest.py. This
module reads each test's code, and that of the functions and fixtures it names (in its module,
in the tests.* modules it imports from, and in tests/conftest.py), for what starts a Jupyter
kernel or a process, and fails for a test that does without its mark. At run time,
tests/conftest.py fails a test without a mark that started a process anyway.
"""

from __future__ import annotations

import ast
import textwrap
from functools import cache
from pathlib import Path

TESTS = Path(__file__).parent

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
REFUSES = frozenset({"refuse_launches", "no_launch", "no_launch_in_empty_folder"})
MARKS = ("kernel", "launch", "slow")


def top_level(source: str, path: Path) -> dict[str, ast.AST]:
    """A module's top-level functions, classes and assignments by name, with those it imports
    from other modules of tests/ (their definitions there)."""
    found: dict[str, ast.AST] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
            other = TESTS.joinpath(*node.module.split(".")[1:]).with_suffix(".py")
            if other.is_file() and other != path:
                theirs = definitions(other)
                found.update({a.asname or a.name: theirs[a.name] for a in node.names
                              if a.name in theirs})
    return found


@cache
def definitions(path: Path) -> dict[str, ast.AST]:
    return top_level(path.read_text(), path)


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


def _refusing(found: dict[str, ast.AST]) -> set[str]:
    """REFUSES and the fixtures that ask for one of them: a test that asks for one has every
    launch refused before its body runs."""
    refusing = set(REFUSES)
    fixtures = {name: node for name, node in found.items() if isinstance(node, ast.FunctionDef)
                and any("fixture" in ast.unparse(d) for d in node.decorator_list)}
    while grown := {name for name, node in fixtures.items()
                    if name not in refusing and _names_in(node) & refusing}:
        refusing |= grown
    return refusing


def _needed_by(root: ast.AST, found: dict[str, ast.AST]) -> set[str]:
    """The marks a function needs by what it and the functions and fixtures it names use."""
    refusing = _refusing(found)
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
        if names & PROCESS_NAMES or (names & LAUNCH_CALLS and not names & refusing):
            marks.add("launch")
        todo.extend(found[name] for name in names if name in found)
    return marks


def _marks_named(node: ast.AST) -> set[str]:
    """The `pytest.mark.<name>` of MARKS written in `node` (a decorator, a `pytestmark`)."""
    return {inner.attr for inner in ast.walk(node) if isinstance(inner, ast.Attribute)
            and inner.attr in MARKS and isinstance(inner.value, ast.Attribute)
            and inner.value.attr == "mark"}


def unmarked(source: str, path: Path) -> list[str]:
    """Each test of the module (`source`, at `path`) that starts a kernel or a process without
    the mark that says so, with the marks it lacks."""
    # A module's own names come first, as pytest finds a module's fixture before conftest's.
    found = {**definitions(TESTS / "conftest.py"), **top_level(source, path)}
    body = ast.parse(source).body
    module = set().union(*(_marks_named(node.value) for node in body
                           if isinstance(node, ast.Assign) and any(
                               isinstance(t, ast.Name) and t.id == "pytestmark"
                               for t in node.targets)))
    autouse = [node for node in body if isinstance(node, ast.FunctionDef) and any(
        "autouse" in ast.unparse(decorator) for decorator in node.decorator_list)]
    missing = []
    for node in body:
        if not (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and node.name.startswith("test_")
                or isinstance(node, ast.ClassDef) and node.name.startswith("Test")):
            continue
        test = f"{path.relative_to(TESTS.parent)}::{node.name}"
        written = module | set().union(
            *(_marks_named(decorator) for decorator in node.decorator_list))
        needed = set().union(*(_needed_by(code, found) for code in [node, *autouse]))
        if needed - written:
            missing.append(f"{test}: " + ", ".join(f"@pytest.mark.{mark}"
                                                   for mark in sorted(needed - written)))
    return missing


def test_every_test_that_starts_a_kernel_or_a_process_carries_its_mark():
    missing = [line for path in sorted(TESTS.glob("test_*.py"))
               for line in unmarked(path.read_text(), path)]
    assert not missing, ("these tests start a kernel or a process without the mark that keeps "
                         "them out of `make test-fast`:\n" + "\n".join(missing))


def test_the_check_finds_a_kernel_or_launch_without_its_mark():
    source = textwrap.dedent('''
        import pytest
        from tests.helpers import run_python, kernel_fixture

        kernel = kernel_fixture()

        def trained(model_dir):
            return fine_tune(model_dir, [])

        def test_a_subprocess():
            run_python("print(1)")

        @pytest.mark.launch
        def test_a_marked_subprocess():
            run_python("print(1)")

        def test_a_kernel(kernel):
            pass

        def test_a_launch_through_a_helper(model_dir):
            trained(model_dir)

        def test_a_refusal(model_dir, no_launch):
            fine_tune(model_dir, [])

        @pytest.fixture
        def refused_here(no_launch, tmp_path):
            pass

        def test_a_refusal_through_a_fixture(model_dir, refused_here):
            fine_tune(model_dir, [])

        def test_nothing(model_dir, tmp_path):
            pass
    ''')
    path = TESTS / "test_example.py"
    assert unmarked(source, path) == [
        "tests/test_example.py::test_a_subprocess: @pytest.mark.launch",
        "tests/test_example.py::test_a_kernel: @pytest.mark.kernel",
        "tests/test_example.py::test_a_launch_through_a_helper: @pytest.mark.launch"]
    marked = "import pytest\npytestmark = [pytest.mark.kernel, pytest.mark.launch]\n"
    assert unmarked(marked + source.split("\n", 2)[2], path) == []
