"""Test collection: the browser suite (tests/browser) and the Binder build (tests/binder) run
only when asked for by path (`make test-browser`, `make test-binder`, `pytest tests/browser`),
never in a plain `pytest` / `make test`."""

from __future__ import annotations

from pathlib import Path

OPT_IN = (Path(__file__).parent / "browser", Path(__file__).parent / "binder")


def _asks_for(folder: Path, arg: str) -> bool:
    path = Path(arg.split("::")[0]).resolve()
    return path == folder or folder in path.parents


def pytest_ignore_collect(collection_path, config):
    for folder in OPT_IN:
        if collection_path == folder and not any(_asks_for(folder, a) for a in config.args):
            return True
    return None
