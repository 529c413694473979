"""Test collection: the browser suite (tests/browser) runs only when asked for by path
(`make test-browser`, `pytest tests/browser`), never in a plain `pytest` / `make test`."""

from __future__ import annotations

from pathlib import Path

BROWSER = Path(__file__).parent / "browser"


def _asks_for_browser(arg: str) -> bool:
    path = Path(arg.split("::")[0]).resolve()
    return path == BROWSER or BROWSER in path.parents


def pytest_ignore_collect(collection_path, config):
    if collection_path == BROWSER and not any(_asks_for_browser(a) for a in config.args):
        return True
    return None
