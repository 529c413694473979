"""Renderers: the same data drawn as ipywidgets, HTML (display_id) or console text.

Logic never renders: `metrics.py` and the launcher hand plain data to these renderers.

Modules: `state` (events -> `LaunchView`, the data every renderer draws), `text` and `html`
(plain functions that format that data), `base` (throttling), `widgets`, `html_display`,
`console` (the three live renderers), `metrics_panel` (the static `%%xla_metrics` panel),
`modes` (choosing a renderer like `tqdm.auto`). The notebook process calls them from the
cell's main thread only (ipykernel 7 drops display updates sent from background threads).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..events import Event
    from ..observe.launch_reader import LaunchReader


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
    from .modes import select_mode

    chosen = select_mode(mode)
    if chosen == "widgets":
        from .widgets import WidgetDisplay

        return WidgetDisplay(world, attempt=attempt, reader=reader)
    if chosen == "html":
        from .html_display import HtmlDisplay

        return HtmlDisplay(world, attempt=attempt, reader=reader)
    if chosen == "console":
        from .console import ConsoleDisplay

        return ConsoleDisplay(world, attempt=attempt, reader=reader)
    return NullDisplay()
