"""Renderers: the same data drawn as ipywidgets, HTML (display_id) or console text.

Logic never renders: `observe` and the launcher hand plain data to these renderers. The
notebook process calls them from the cell's main thread only (ipykernel 7 drops display
updates sent from background threads).

Modules: `state` (events -> `LaunchView`, the data every renderer draws, and the units, words
and styles every panel shares), `text` and `html` (plain functions that format that data;
`html` also holds the static `%%xla_metrics` panel), `live` (the three live renderers:
widgets, HTML and console), `panels` (the result, predictions, memory plan, doctor and
runtime panels, and their IPython formatters).

This module holds what the launcher draws a launch with (`LaunchDisplay`, `launch_display`),
and which renderer that is, chosen like `tqdm.auto`: widgets in a notebook, else console
(`select_mode`).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Protocol

from .._words import PROGRESS_MODES
from ..runtime.environment import in_notebook

if TYPE_CHECKING:
    from ..events import Event
    from ..observe.reader import LaunchReader


# -- what the launcher draws a launch with --

class LaunchDisplay(Protocol):
    """What the launcher draws a launch with. Every method runs on the cell's main thread.

    The launcher applies every event to the launch's one reader (`LaunchReader`), which the
    panels it makes draw; it prints `Log` events itself (they are output, not a panel) and
    passes every other event to `handle` too (a panel drawing the launcher's reader ignores
    it; a stand-in that records events sees them). `refresh` is called a few times a second
    even when nothing arrived (to move clocks and ETAs); `close` once, with the launch's final
    record. `draws_generations`: whether it draws streamed generations (`Generated` events)
    itself; where it does not, the launcher prints their text as it comes.
    """

    draws_generations: bool

    def handle(self, event: Event) -> None: ...

    def refresh(self) -> None: ...

    def close(self, record) -> None: ...


class NullDisplay:
    """Draws nothing (``progress=False``)."""

    draws_generations = False

    def handle(self, event: Event) -> None:
        pass

    def refresh(self) -> None:
        pass

    def close(self, record) -> None:
        pass


def launch_display(world: int, mode: str | bool = "auto", attempt: str = "",
                   reader: LaunchReader | None = None) -> LaunchDisplay:
    """The display for a launch of `world` ranks.

    Args:
        world: number of ranks.
        mode: "auto" (widgets in a notebook with ipywidgets, else HTML in a notebook, else
            console), "widgets", "html", "console", or False/"none" for no display; True
            means "auto".
        attempt: "attempt 2 of 4" (`LaunchRecord.attempt_text`) for an attempt of a call
            with `max_restarts=`, said in the status line; "" otherwise.
        reader: the launch's reader: the panel draws its record, bars and metrics (None:
            the panel reads the events it is handed itself).

    Returns:
        A `LaunchDisplay`; the widget, HTML and console ones show it in the cell right away
        and have a readable `repr()` of their state.

    Raises:
        ImportError: `mode="widgets"` without a usable ipywidgets ("auto" falls back to HTML
            with a warning instead).
        ValueError: an unknown mode.
    """
    chosen = select_mode(mode)
    if chosen == "widgets":
        from .live import WidgetDisplay

        return WidgetDisplay(world, attempt=attempt, reader=reader)
    if chosen == "html":
        from .live import HtmlDisplay

        return HtmlDisplay(world, attempt=attempt, reader=reader)
    if chosen == "console":
        from .live import ConsoleDisplay

        return ConsoleDisplay(world, attempt=attempt, reader=reader)
    return NullDisplay()


# -- which renderer, chosen like tqdm.auto --

MODES = PROGRESS_MODES
MIN_IPYWIDGETS = (7, 6)


def widgets_problem() -> str | None:
    """Why ipywidgets cannot be used (not installed, too old), or None when it can."""
    try:
        import ipywidgets
    except ImportError:
        return "ipywidgets is not installed (pip install 'ipywidgets>=7.6')"
    version = getattr(ipywidgets, "__version__", "0")
    try:
        parts = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return None
    if parts < MIN_IPYWIDGETS:
        return f"ipywidgets {version} is too old (need 7.6 or later)"
    return None


def select_mode(mode: str | bool | None = "auto", *, notebook: bool | None = None) -> str:
    """Resolve `mode` to "widgets", "html", "console" or "none".

    Args:
        mode: "auto", "widgets", "html", "console", "none"; True means "auto", False and None
            mean "none".
        notebook: whether this is a notebook kernel (default: detect).

    Raises:
        ImportError: `mode="widgets"` and ipywidgets is missing or too old.
        ValueError: an unknown mode.
    """
    if mode is True:
        mode = "auto"
    if mode is False or mode is None:
        mode = "none"
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: use one of {', '.join(MODES)}")
    if mode == "widgets":
        problem = widgets_problem()
        if problem is not None:
            raise ImportError(f"mode='widgets' needs ipywidgets: {problem}. Or use mode='html'.")
        return mode
    if mode != "auto":
        return mode
    if not (in_notebook() if notebook is None else notebook):
        return "console"
    problem = widgets_problem()
    if problem is not None:
        warnings.warn(f"{problem}; showing HTML panels instead of widgets.", stacklevel=3)
        return "html"
    return "widgets"
