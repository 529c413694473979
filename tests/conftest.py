"""Test collection: the browser suite (tests/browser) and the Binder build (tests/binder) run
only when asked for by path (`make test-browser`, `make test-binder`, `pytest tests/browser`),
never in a plain `pytest` / `make test`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# tests/pods start a Ray cluster: only inside their network namespace (`make test-pods`).
OPT_IN = (Path(__file__).parent / "browser", Path(__file__).parent / "binder",
          Path(__file__).parent / "pods")


def _asks_for(folder: Path, arg: str) -> bool:
    path = Path(arg.split("::")[0]).resolve()
    return path == folder or folder in path.parents


def pytest_ignore_collect(collection_path, config):
    for folder in OPT_IN:
        if collection_path == folder and not any(_asks_for(folder, a) for a in config.args):
            return True
    return None


@pytest.fixture(autouse=True)
def _environment_restored():
    """What a test body sets in os.environ ends with the test (`demo.main()` quiets XLA's C++
    log, for one), so a later test's subprocess or kernel starts as a user's would."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)
