"""The live launch renderers: ipywidgets, an HTML output updated in place, and console lines.

`PanelDisplay` is the base of all three: it follows events and throttles drawing, once (like
fastprogress's progress-bar base class). A renderer implements only `_open`, `_draw(view)` and
`_finish(view)`, and gets nothing but the data of a `LaunchView` to draw.

- `ConsoleDisplay`: plain, throttled lines for terminals, scripts and CI logs.
- `HtmlDisplay`: one output updated in place (`display_id`), for notebooks without widgets.
- `WidgetDisplay` (ipywidgets 7.6+ and 8: only APIs both have): a `VBox` of four `HTML`
  widgets: the status line, the bars, the chart with notes, and the XLA metrics with alerts.
  Each holds what `ui.html` builds for that part of the final panel, so the live panel and the
  final one have one geometry. When the launch ends, the output is replaced
  (`update_display_data`) by the final state as static HTML with its text form, and the
  widgets are closed: a saved notebook holds no widget view that would need the kernel's
  widget models (reopened, it would show "Error displaying widget: model not found"), and
  nbconvert, nbval and terminals read the same final state.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from ..observe.reader import LaunchReader
from ..states import PanelState
from . import html, text
from .state import BORDER, PADDING, LaunchState, LaunchView

# -- the base: follows events, throttles drawing --

class PanelDisplay:
    """A `LaunchDisplay` that draws a `LaunchState` and redraws at most every `min_interval`.

    Args:
        world: number of ranks.
        per_rank: one bar per rank (default when `world <= 4`) or one per label.
        attempt: "attempt 2 of 4" for an attempt of a call with `max_restarts=`, else "":
            the status line says it.
        reader: the launch's reader, whose record and metrics the panel draws (the launcher
            applies every event to it); None: the panel reads the events `handle` gets itself.
    """

    min_interval: float = 0.25
    # Whether the panel draws streamed generations under its bars (`LaunchDisplay`).
    draws_generations: bool = False

    def __init__(self, world: int, per_rank: bool | None = None, attempt: str = "",
                 reader: LaunchReader | None = None) -> None:
        self.state = LaunchState(world, per_rank=per_rank, attempt=attempt, reader=reader)
        self._last_draw = float("-inf")
        self._drawn_changes = -1
        self._closed = False
        self._open()

    def handle(self, event: Any) -> None:
        """Take an event (read by the panel's own reader only: the launcher's has it
        already); the next `refresh` draws it."""
        self.state.handle(event)

    def refresh(self, force: bool = False) -> None:
        """Redraw if something changed (or clocks moved) and `min_interval` has passed."""
        if self._closed:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < self.min_interval:
            return
        view = self.state.view()
        if not force and self.state.changes == self._drawn_changes and not self._moving(view):
            return
        self._last_draw = now
        self._drawn_changes = self.state.changes
        self._draw(view)

    def close(self, record: Any = None) -> None:
        """Draw the final state from the launch's record; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        self.state.close(record)
        self._finish(self.state.view())

    @property
    def view(self) -> LaunchView:
        """What the panel shows now."""
        return self.state.view()

    def __repr__(self) -> str:
        return text.launch_text(self.state.view())

    # -- for renderers --------------------------------------------------------------------------

    def _moving(self, view: LaunchView) -> bool:
        """Whether a redraw without news is worth it (elapsed times and ETAs tick)."""
        return not view.done

    def _open(self) -> None:
        """Show the empty panel."""

    def _draw(self, view: LaunchView) -> None:
        """Draw `view`."""
        raise NotImplementedError

    def _finish(self, view: LaunchView) -> None:
        """Draw the final `view`."""
        self._draw(view)


# -- console lines --

class ConsoleDisplay(PanelDisplay):
    """Prints a line per bar that moved, at most every `min_interval` seconds, and the full
    final state (status, bars, XLA metrics, alerts) at the end.

    Args:
        world: number of ranks.
        file: where to print (default: `sys.stdout` at the time of printing).
        per_rank: one bar per rank or one per label (see `LaunchState`).
    """

    min_interval = 5.0

    def __init__(self, world: int, file: TextIO | None = None,
                 per_rank: bool | None = None, attempt: str = "",
                 reader: LaunchReader | None = None) -> None:
        self._file = file
        self._printed: dict[tuple, tuple] = {}
        self._status: PanelState | None = None  # the state of the last status line printed
        self._alerts: set[str] = set()
        super().__init__(world, per_rank=per_rank, attempt=attempt, reader=reader)

    def _print(self, line: str) -> None:
        print(line, file=self._file or sys.stdout, flush=True)

    def _moving(self, view: LaunchView) -> bool:
        return False  # print on news only

    def _draw(self, view: LaunchView) -> None:
        if view.state != self._status and view.state != PanelState.STARTING:
            self._status = view.state
            self._print(text.status_line(view))
        name_width = max((len(bar.name) for bar in view.bars), default=0)
        for bar in view.bars:
            key = (bar.rank, bar.label)
            seen = (bar.step, bar.state, tuple(bar.values.items()))
            if self._printed.get(key) != seen:
                self._printed[key] = seen
                self._print(text.bar_line(bar, name_width=name_width))
        for alert in view.alerts:
            if alert.code not in self._alerts:
                self._alerts.add(alert.code)
                self._print("\n".join(text.alert_lines([alert])))

    def _finish(self, view: LaunchView) -> None:
        self._print(text.launch_text(view))


# -- one HTML output updated in place --

class HtmlBlock:
    """A displayable with an HTML form and a text form (for terminals and nbconvert)."""

    def __init__(self, html_text: str, plain: str) -> None:
        self.html = html_text
        self.plain = plain

    def _repr_html_(self) -> str:
        return self.html

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/html": self.html, "text/plain": self.plain}

    def __repr__(self) -> str:
        return self.plain


class HtmlDisplay(PanelDisplay):
    """Draws the launch as HTML in one output, replaced with `DisplayHandle.update`."""

    min_interval = 0.5
    draws_generations = True  # each prompt with its text so far, under the bars

    def _open(self) -> None:
        from IPython.display import display

        self._handle = display(self._block(self.state.view()), display_id=True)

    @staticmethod
    def _block(view: LaunchView) -> HtmlBlock:
        return HtmlBlock(html.launch_html(view), text.launch_text(view))

    def _draw(self, view: LaunchView) -> None:
        if self._handle is not None:
            self._handle.update(self._block(view))


# -- ipywidgets --

# The final panel is the one box (`table_style.BOX`: border, padding) inside JupyterLab's
# rendered HTML, which keeps 20 px free on the right. The live panel draws the same border and
# padding, 20 px of margin on its right and no other, so both lay out in the same box
# (ipywidgets' layout has no corner radius: the live panel's corners are square).
PANEL_LAYOUT = {"margin": "0px 20px 0px 0px", "padding": PADDING, "border": BORDER}
PART_LAYOUT = {"margin": "0px"}


class WidgetDisplay(PanelDisplay):
    """Draws a launch with ipywidgets, updated in place from the cell's main thread.

    Attributes:
        widget: the top `VBox` (children: status, bars, chart, metrics).
        status, bars, chart, metrics: its parts, `HTML` widgets.
    """

    min_interval = 0.25
    draws_generations = True  # each prompt with its text so far, under the bars

    def _open(self) -> None:
        import ipywidgets as widgets
        from IPython.display import display

        def part(value: str = "") -> Any:
            return widgets.HTML(value=value, layout=widgets.Layout(**PART_LAYOUT))

        self.status = part(html.status_html(self.state.view()))
        self.bars = part()
        self.chart = part()
        self.metrics = part()
        self.widget = widgets.VBox([self.status, self.bars, self.chart, self.metrics],
                                   layout=widgets.Layout(**PANEL_LAYOUT))
        self._handle = display(self, display_id=True)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """The live widget view (and a text form) while the launch runs; static HTML and text
        once it ended (the widgets are closed then)."""
        if self._closed:
            return self._final_block()._repr_mimebundle_()
        return {
            "text/plain": repr(self),
            "application/vnd.jupyter.widget-view+json": {
                "version_major": 2,
                "version_minor": 0,
                "model_id": self.widget.model_id,
            },
        }

    def _final_block(self) -> HtmlBlock:
        view = self.state.view()
        return HtmlBlock(html.launch_html(view), text.launch_text(view))

    def _draw(self, view: LaunchView) -> None:
        # Each part is the same HTML as in the final panel; unchanged parts send nothing.
        parts = (
            (self.status, html.status_html(view)),
            (self.bars, html.bars_html(view.bars) + html.generations_html(view)),
            (self.chart, html.chart_html(view.bars, view.metrics) + html.notes_html(view)),
            (self.metrics, html.view_metrics_html(view)),
        )
        for widget, value in parts:
            if widget.value != value:
                widget.value = value

    def _finish(self, view: LaunchView) -> None:
        self._draw(view)  # the widgets' last state, for code that still reads them
        if self._handle is not None:
            # What the notebook keeps: static HTML and text in place of the widget view.
            self._handle.update(self._final_block())
            self._close_widgets()

    def _close_widgets(self) -> None:
        """Close the widgets' comms (their view was replaced): the kernel and the page drop
        the models, and no widget state is left for the notebook to save."""
        for widget in (self.status, self.bars, self.chart, self.metrics, self.widget):
            widget.close()

    def __repr__(self) -> str:
        return text.launch_text(self.state.view())


def widget_state(widget: Any) -> dict[str, Any]:
    """A widget tree as plain data (class, description, value, max, bar_style, children), for
    tests and debugging without a browser. The bars' HTML names each bar's state and counts
    (`role="progressbar"`, `aria-valuenow`, `aria-valuemax`, `data-state`)."""
    state: dict[str, Any] = {"class": type(widget).__name__}
    for name in ("description", "value", "max", "bar_style"):
        if hasattr(widget, name):
            state[name] = getattr(widget, name)
    children = getattr(widget, "children", None)
    if children is not None:
        state["children"] = [widget_state(child) for child in children]
    return state
