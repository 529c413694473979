"""ipywidgets renderer (ipywidgets 7.6+ and 8: only APIs both have).

The panel is a `VBox`: a status line (HTML), one row per bar (`HBox` of an `IntProgress` and
an `HTML` with counts, timing and values), a chart (`HTML` with inline SVG sparklines) and the
XLA metrics with alerts (`HTML`). The panel object displays itself with the widget view and a
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
from .state import BarView, LaunchView

BAR_STYLES = {"running": "", "done": "success", "failed": "danger"}


class _Row:
    """The widgets of one bar."""

    def __init__(self, widgets: Any, bar: BarView) -> None:
        # A fixed share of the row that never shrinks, so every rank's bar has the same
        # width whatever the length of its stats (which wrap instead).
        self.progress = widgets.IntProgress(
            value=0, min=0, max=1, description=bar.name, bar_style="",
            style={"description_width": "initial"},
            layout=widgets.Layout(width="45%", min_width="45%", flex="0 0 45%"),
        )
        self.stats = widgets.HTML(value="", layout=widgets.Layout(flex="1 1 0%", min_width="0"))
        self.box = widgets.HBox([self.progress, self.stats])

    def close(self) -> None:
        for widget in (self.progress, self.stats, self.box):
            widget.close()

    def update(self, bar: BarView) -> None:
        if bar.total:
            self.progress.max = max(int(bar.total), 1)
            self.progress.value = min(int(bar.step), self.progress.max)
        else:  # unknown total: a full bar, like tqdm.notebook
            self.progress.max = 1
            self.progress.value = 1
        style = BAR_STYLES.get(bar.state, "")
        if not bar.total and bar.state == "running":
            style = "info"
        self.progress.bar_style = style
        self.progress.description = bar.name
        self.stats.value = html.bar_stats_html(bar)


class WidgetDisplay(PanelDisplay):
    """Draws a launch with ipywidgets, updated in place from the cell's main thread.

    Attributes:
        widget: the top `VBox` (children: status, bars, chart, metrics).
        status, bars, chart, metrics: its parts.
    """

    min_interval = 0.25

    def _open(self) -> None:
        import ipywidgets as widgets
        from IPython.display import display

        self._widgets = widgets
        self.status = widgets.HTML(value=html.status_html(self.state.view()))
        self.bars = widgets.VBox([])
        self.chart = widgets.HTML(value="")
        self.metrics = widgets.HTML(value="")
        self.widget = widgets.VBox([self.status, self.bars, self.chart, self.metrics])
        self._rows: dict[tuple, _Row] = {}
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
        self.status.value = html.status_html(view)
        keys = []
        for bar in view.bars:
            key = (bar.rank, bar.label)
            keys.append(key)
            row = self._rows.get(key)
            if row is None:
                row = self._rows[key] = _Row(self._widgets, bar)
            row.update(bar)
        children = tuple(self._rows[key].box for key in keys)
        if tuple(self.bars.children) != children:
            self.bars.children = children
        extra = "".join(html.note_html(line) for line in view.errors[1:] + view.notes)
        self.chart.value = html.chart_html(view.bars) + extra
        if view.metrics is not None:
            self.metrics.value = html.metrics_html(view.metrics, view.alerts,
                                                   text.metrics_title(view))

    def _finish(self, view: LaunchView) -> None:
        self._draw(view)  # the widgets' last state, for code that still reads them
        if self._handle is not None:
            # What the notebook keeps: static HTML and text in place of the widget view.
            self._handle.update(self._final_block())
            self._close_widgets()

    def _close_widgets(self) -> None:
        """Close the widgets' comms (their view was replaced): the kernel and the page drop
        the models, and no widget state is left for the notebook to save."""
        for row in self._rows.values():
            row.close()
        for widget in (self.status, self.chart, self.metrics, self.bars, self.widget):
            widget.close()

    def __repr__(self) -> str:
        return text.launch_text(self.state.view())


def widget_state(widget: Any) -> dict[str, Any]:
    """A widget tree as plain data (class, description, value, max, bar_style, children), for
    tests and debugging without a browser."""
    state: dict[str, Any] = {"class": type(widget).__name__}
    for name in ("description", "value", "max", "bar_style"):
        if hasattr(widget, name):
            state[name] = getattr(widget, name)
    children = getattr(widget, "children", None)
    if children is not None:
        state["children"] = [widget_state(child) for child in children]
    return state
