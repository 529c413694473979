"""Test collection: the browser suite (tests/browser) and the Binder build (tests/binder) run
only when asked for by path (`make test-browser`, `make test-binder`, `pytest tests/browser`),
never in a plain `pytest` / `make test`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# tests/pods start a Ray cluster: only inside their network namespace (`make test-pods`).
# tests/xla_in_process use XLA in the test process itself, which would make every later launch
# from it refuse (its runtime started): tests/test_xla_in_process.py runs them in their own.
OPT_IN = (Path(__file__).parent / "browser", Path(__file__).parent / "binder",
          Path(__file__).parent / "pods", Path(__file__).parent / "xla_in_process")


def _asks_for(folder: Path, arg: str) -> bool:
    path = Path(arg.split("::")[0]).resolve()
    return path == folder or folder in path.parents


def pytest_ignore_collect(collection_path, config):
    for folder in OPT_IN:
        if collection_path == folder and not any(_asks_for(folder, a) for a in config.args):
            return True
    return None


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """One folder for the demo models the task and predict tests build (`..._model_dir(cache=)`),
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

    if _asks_for(Path(__file__).parent / "xla_in_process", str(request.node.path)):
        yield  # their own process: XLA in it is what they test
        return
    started = _xla.runtime_is_initialized()
    yield
    if not started and _xla.runtime_is_initialized():
        pytest.fail("this test started the XLA runtime in the test process; use XLA inside a "
                    "launched function, a subprocess (tests.kernel_helpers.run_python) or "
                    "tests/xla_in_process/")
