"""Debian's Chromium driven by Playwright, and a JupyterLab notebook page to run and read.

`Chromium` launches /usr/bin/chromium headless (no browser download: Playwright's own builds
are never installed) and finds the browser's pid, so the run can end it by pid whatever state
Playwright is in. `NotebookPage` opens a notebook, runs every cell through the Run menu, waits
for the kernel, and reads each cell's output area: text, boxes and wrapped lines.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from . import procs

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1024, "height": 900}
MAX_SHOT_HEIGHT = 6000  # px: the tallest window a screenshot of one output may use

# Geometry of the elements matching `selector` under `root`, as the page lays them out.
# An element wraps when its content box is taller than 1.5 lines of its own line-height
# ("normal" line-height is taken as 1.2 x the font size, what browsers use for most fonts).
MEASURE_JS = """(root, selector) => Array.from(root.querySelectorAll(selector)).map(el => {
    const box = el.getBoundingClientRect();
    const origin = root.getBoundingClientRect();
    const style = getComputedStyle(el);
    const fontSize = parseFloat(style.fontSize);
    const lineHeight = style.lineHeight === "normal" ? 1.2 * fontSize
                                                     : parseFloat(style.lineHeight);
    const padding = ["paddingTop", "paddingBottom", "borderTopWidth", "borderBottomWidth"]
        .reduce((sum, name) => sum + (parseFloat(style[name]) || 0), 0);
    const content = box.height - padding;
    return {tag: el.tagName.toLowerCase(), cls: el.className && String(el.className),
            text: el.innerText, x: box.x, y: box.y, width: box.width, height: box.height,
            rx: box.x - origin.x, ry: box.y - origin.y, background: style.backgroundColor,
            lineHeight: lineHeight, wraps: content > 1.5 * lineHeight};
})"""
# Positions are also given relative to the root (`rx`, `ry`): the live widget panel and the
# static panel that replaces it sit in the same output area, so the same part must have the
# same relative box in both.


class Chromium:
    """A headless Chromium through Playwright; `stop()` ends it by pid (SIGTERM, SIGKILL)."""

    def __init__(self, launch_timeout: float = 30.0) -> None:
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        self.proc: procs.Proc | None = None
        self._children: list[procs.Proc] = []
        try:
            before = set(self._browsers())
            self.browser = self._playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=FLAGS,
                timeout=launch_timeout * 1000)
            found = [p for p in self._browsers() if p not in before]
            if len(found) != 1:
                raise RuntimeError(f"expected one new Chromium browser process, found {found}")
            self.proc = found[0]
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _browsers() -> list[procs.Proc]:
        """Browser processes below this one (through Playwright's driver): running chromium,
        and not one of its helpers (those have a --type= switch)."""
        return [p for p in procs.descendants(os.getpid())
                if "chromium" in p.cmdline.split(" ")[0] and "--type=" not in p.cmdline]

    def new_page(self):
        return self.browser.new_page(viewport=VIEWPORT)

    def stop(self) -> None:
        """End Chromium by its pid, then its helpers, then Playwright's driver."""
        if self.proc is not None:
            self._children = procs.descendants(self.proc.pid)
            procs.stop(self.proc)
            for helper in procs.wait_gone(self._children, 5.0):
                procs.stop(helper)
        try:
            self._playwright.stop()
        except Exception:  # noqa: BLE001 - the driver may already have seen the browser go
            pass

    def leftovers(self) -> list[procs.Proc]:
        return [p for p in [self.proc, *self._children] if p is not None and procs.alive(p)]


class NotebookPage:
    """One notebook opened in JupyterLab in a Chromium page."""

    def __init__(self, page, url: str, open_timeout: float = 60.0) -> None:
        self.page = page
        page.set_default_timeout(open_timeout * 1000)
        page.goto(url)
        page.locator(".jp-Notebook .jp-Cell").first.wait_for()
        self.wait_kernel_idle(open_timeout)

    def collapse_left_sidebar(self) -> None:
        """Close the file browser, so the notebook takes the window's width (1024 px)."""
        tab = self.page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
        if tab.count():
            tab.first.click()
            self.page.locator("#jp-left-stack").wait_for(state="hidden")

    # -- running --------------------------------------------------------------------------------

    def kernel_idle(self) -> bool:
        """The kernel connected and idle. The toolbar's indicator alone says "idle" before
        any kernel is there (Run All then asks for a kernel), so the status bar must name
        the kernel and say Idle too."""
        idle = self.page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
        status = self.page.locator(".jp-StatusBar-Widget").inner_text()
        return idle.count() == 1 and re.search(r"\(ipykernel\)\s*\|\s*Idle", status) is not None

    def wait_kernel_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.kernel_idle():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no idle kernel after {timeout}s")
            time.sleep(0.1)

    def run_all(self, timeout: float = 120.0, poll=None) -> None:
        """Run > Run All Cells, then wait until every cell has an execution count and the
        kernel is idle. `poll()`, if given, is called between checks (to look at the page
        while cells run)."""
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Run$")).click()
        self.page.locator(".lm-Menu-itemLabel", has_text=re.compile("^Run All Cells$")).click()
        deadline = time.monotonic() + timeout
        while not self.done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"cells did not finish in {timeout}s: prompts "
                                   f"{self.prompts()}")
            if poll is not None:
                poll()
            time.sleep(0.1)

    def prompts(self) -> list[str]:
        return [p.strip() for p in self.page.locator(
            ".jp-Notebook .jp-CodeCell .jp-InputArea-prompt").all_inner_texts()]

    def done(self) -> bool:
        """Every code cell numbered ("[3]:", not "[*]:" or "[ ]:") and the kernel idle."""
        prompts = self.prompts()
        numbered = bool(prompts) and all(p[1:-2].isdigit() for p in prompts)
        return numbered and self.kernel_idle()

    # -- reading outputs ------------------------------------------------------------------------

    def output(self, cell: int):
        """The output area of code cell `cell` (0-based)."""
        return self.page.locator(".jp-Notebook .jp-CodeCell").nth(cell).locator(
            ".jp-OutputArea")

    def output_text(self, cell: int) -> str:
        return self.output(cell).inner_text()

    def measure(self, cell: int, selector: str) -> list[dict]:
        """Boxes (x, y, width, height, px), text, line-height and `wraps` of every element
        matching `selector` in cell `cell`'s output area."""
        return self.output(cell).evaluate(MEASURE_JS, selector)

    def wrapped(self, cell: int, selector: str) -> list[dict]:
        """The elements matching `selector` in the cell's output whose text wraps."""
        return [box for box in self.measure(cell, selector) if box["wraps"]]

    def theme(self) -> str:
        """The JupyterLab theme the page shows ("JupyterLab Dark", ...)."""
        return self.page.evaluate("() => document.body.dataset.jpThemeName")

    # -- screenshots ----------------------------------------------------------------------------

    def screenshot(self, folder: Path, name: str, cells: list[int] = ()) -> list[Path]:
        """Each listed cell's output as `<name>-cell<N>.png`, then the whole page (scrolled
        to the last of them) as `<name>-page.png`, in `folder`."""
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for cell in cells:
            paths.append(folder / f"{name}-cell{cell}.png")
            self._screenshot_whole(self.output(cell), paths[-1])
        paths.append(folder / f"{name}-page.png")
        self.page.screenshot(path=str(paths[-1]), full_page=True)
        return paths

    def _screenshot_whole(self, element, path: Path) -> None:
        """A screenshot of all of `element`. The notebook scrolls inside JupyterLab's panel,
        which clips an output taller than the window (a long traceback): for that one shot the
        window grows to fit it (up to MAX_SHOT_HEIGHT px), then returns to VIEWPORT."""
        box = element.bounding_box() or {"height": 0}
        grow = box["height"] > VIEWPORT["height"] - 200
        if grow:
            height = min(int(box["height"]) + 300, MAX_SHOT_HEIGHT)
            self.page.set_viewport_size({"width": VIEWPORT["width"], "height": height})
            element.scroll_into_view_if_needed()
        try:
            element.screenshot(path=str(path))
        finally:
            if grow:
                self.page.set_viewport_size(VIEWPORT)
