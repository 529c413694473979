"""One browser test session: a JupyterLab server and a Chromium, in one theme.

`BrowserLab.notebook(...)` writes a notebook, opens it in a new page, runs every cell, saves
screenshots, and on the way out shuts the notebook's kernel down and checks that none of its
processes is left. `close()` ends Chromium and JupyterLab by their pids.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from . import procs
from .lab import ROOT, THEMES, JupyterLab
from .page import Chromium, NotebookPage

ARTIFACTS = ROOT / "artifacts" / "browser"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")


class BrowserLab:
    """JupyterLab in `theme` ("light" or "dark") and a headless Chromium to look at it."""

    def __init__(self, theme: str, artifacts: Path = ARTIFACTS) -> None:
        self.theme = theme
        self.artifacts = artifacts
        self.lab = JupyterLab(theme, log_dir=artifacts)
        try:
            self.chromium = Chromium()
        except BaseException:
            self.lab.stop()
            raise

    @contextlib.contextmanager
    def notebook(self, name: str, cells: list[str] | None = None, timeout: float = 120.0,
                 poll: Callable[[NotebookPage], None] | None = None,
                 source: Path | None = None) -> Iterator[NotebookPage]:
        """Run `cells` (or the notebook file `source`, such as a tutorial) as notebook `name`
        (Run > Run All Cells, bounded by `timeout`) and yield the page, every cell done.
        Screenshots go to the artifacts folder as `<name>-<theme>-page.png` and
        `-cell<N>.png`, also when running or reading fails."""
        stem = _slug(name)
        if source is not None:
            notebook = self.lab.copy_notebook(source, f"{stem}.ipynb")
        else:
            notebook = self.lab.write_notebook(f"{stem}.ipynb", cells or [])
        page = self.chromium.new_page()
        try:
            try:
                nb = NotebookPage(page, self.lab.notebook_url(notebook))
            except BaseException:
                self.artifacts.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(self.artifacts / f"{stem}-{self.theme}-open.png"))
                raise
            assert nb.theme() == THEMES[self.theme], f"page theme {nb.theme()!r}"
            nb.collapse_left_sidebar()
            def watch() -> None:
                self.lab.kernel_processes()  # note the kernel's processes (and workers) by pid
                if poll is not None:
                    poll(nb)

            try:
                nb.run_all(timeout, poll=watch)
            finally:
                self.screenshots(nb, f"{stem}-{self.theme}")
            yield nb
        finally:
            self.lab.kernel_processes()
            page.close()
            left = self.lab.shutdown_kernels()
        assert not left, f"kernel processes left after shutdown: {left}"

    def screenshots(self, nb: NotebookPage, stem: str) -> None:
        """Each cell output that shows something, then the page (scrolled to the last one)."""
        cells = [i for i in range(nb.page.locator(".jp-Notebook .jp-CodeCell").count())
                 if (nb.output(i).bounding_box() or {}).get("height", 0) > 0]
        nb.screenshot(self.artifacts, stem, cells)

    def leftovers(self) -> list[procs.Proc]:
        """Processes of this session still alive (none after `close()`)."""
        return self.lab.leftovers() + self.chromium.leftovers()

    def close(self) -> None:
        try:
            self.chromium.stop()
        finally:
            self.lab.stop()
