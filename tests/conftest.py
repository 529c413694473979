"""Test collection, marks and the fixtures that several test modules share.

The browser suite (tests/browser) and the Binder build (tests/binder) run only when asked for by
path (`make test-browser`, `make test-binder`, `pytest tests/browser`), never in a plain
`pytest` / `make test`.

Each test carries the marks of what it does, written on it (`pytestmark = pytest.mark.launch`
in a module, or `@pytest.mark.kernel` on a test): `kernel` (starts a Jupyter kernel), `launch`
(forks workers, runs a subprocess or XLA), `slow` (takes seconds without either). The folders
that run only when asked for are marked here, by folder. `make test-fast` runs the tests with
none of them. Two checks keep that set fast: a test without a mark that still forks or starts a
process fails, named (`pytest_runtest_call`), and tests/test_markers.py reads every test's code
for what starts a kernel or a process and asks for the mark.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
# tests/pods start a Ray cluster: only inside their network namespace (`make test-pods`).
# tests/xla_in_process use XLA in the test process itself, which would make every later launch
# from it refuse (its runtime started): tests/test_xla_in_process.py runs them in their own.
OPT_IN = (TESTS / "browser", TESTS / "binder", TESTS / "pods", TESTS / "xla_in_process")
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


# -- collection and marks --------------------------------------------------------------------


def pytest_ignore_collect(collection_path, config):
    for folder in OPT_IN:
        if collection_path == folder and not any(_asks_for(folder, a) for a in config.args):
            return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.path))
        if any(_asks_for(folder, str(path)) for folder in OPT_IN):
            item.add_marker("slow")  # asked for by path: never part of `make test-fast`
            item.add_marker("launch")


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
                    f"`make test-fast` would run it: {_started_processes[:3]}. Mark it "
                    f"(`@pytest.mark.launch`) and name what it calls in tests/test_markers.py "
                    f"(PROCESS_NAMES, LAUNCH_CALLS).", pytrace=False)
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


@pytest.fixture(scope="session")
def model_dir(cache):
    """The demo's tiny BERT classifier folder (`hfxla_nb.demo.demo_model_dir`), built once."""
    from hfxla_nb.demo import demo_model_dir

    return demo_model_dir(cache=cache)


@pytest.fixture(scope="session")
def lm_dir(cache):
    """The demo's tiny Llama folder (`hfxla_nb.demo.lm.demo_lm_model_dir`), built once."""
    from hfxla_nb.demo.lm import demo_lm_model_dir

    return demo_lm_model_dir(cache=cache)


@pytest.fixture
def no_launch(monkeypatch):
    """Any launch fails the test (`tests.helpers.refuse_launches`): bad input must be refused
    before anything is forked."""
    from tests.helpers import refuse_launches

    refuse_launches(monkeypatch)


@pytest.fixture
def no_launch_in_empty_folder(no_launch, monkeypatch, tmp_path):
    """No launch, with the working folder this test's empty `tmp_path` (where
    `output_dir="auto"` would write), so a test can check that nothing was written there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
