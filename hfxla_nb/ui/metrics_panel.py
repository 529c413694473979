"""A static XLA metrics panel (what `%%xla_metrics` shows): HTML in notebooks, text elsewhere."""

from __future__ import annotations

from ..observe.analyzer import Alert
from ..observe.metrics import XlaSummary
from . import text
from .html import metrics_html, note_html
from .table_style import BLUE, panel


class MetricsPanel:
    """What a piece of XLA work compiled, executed, transferred and fell back on, with alerts.

    Displays as HTML in a notebook; `repr()` is the same content as text.
    """

    def __init__(self, summary: XlaSummary, alerts: list[Alert], title: str = "XLA metrics",
                 note: str | None = None):
        self.summary = summary
        self.alerts = list(alerts)
        self.title = title
        self.note = note  # one line under the panel (what the cell changed in the kernel)

    def _repr_html_(self) -> str:
        note = note_html(f"ℹ {self.note}", BLUE) if self.note else ""
        # The one box around the table the launch panel holds without one of its own.
        return panel(metrics_html(self.summary, self.alerts, self.title) + note,
                     "hfxla-metrics-panel")

    def __repr__(self) -> str:
        note = f"\nℹ {self.note}" if self.note else ""
        return f"{self.title}\n{text.metrics_text(self.summary, self.alerts)}{note}"
