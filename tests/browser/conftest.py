"""Fixtures of the browser suite: one JupyterLab and one Chromium per theme, for the whole run
(pytest orders the tests so that each theme's server starts once)."""

from __future__ import annotations

import pytest

from .session import BrowserLab


@pytest.fixture(scope="session", params=["light", "dark"])
def browser_lab(request):
    """A `BrowserLab` in each theme; at the end neither Chromium, JupyterLab nor any kernel
    process of the run may be left."""
    session = BrowserLab(request.param)
    try:
        yield session
    finally:
        session.close()
    assert not session.leftovers(), f"processes left: {session.leftovers()}"
