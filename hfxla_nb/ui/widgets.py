"""ipywidgets renderer (ipywidgets 7.6+ and 8: only APIs both have).

The panel is a `VBox` of four `HTML` widgets: the status line, the bars (one grid: caption,
mark, bar, stats per row), the chart (inline SVG sparklines) with notes, and the XLA metrics
with alerts. Each holds what `ui.html` builds for that part of the final panel, so the live
panel and the final one have one geometry: bar widths, row heights and table rows stay where
they are when the launch ends. The panel object displays itself with the widget view and a
text form (one output with a `display_id`), live while the launch runs.

When the launch ends, that output is replaced (`update_display_data`) by the final state as
static HTML with its text form, and the widgets are closed: a saved notebook holds no widget
view that would need the kernel's widget models (reopened, it would show "Error displaying
widget: model not found"), and nbconvert, nbval and terminals read the same final state.
"""

from __future__ import annotations

from typing import Any

from . import html, text
from .base import PanelDisplay
from .html_display import HtmlBlock
from .state import LaunchView
from .table_style import BORDER, PADDING

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
