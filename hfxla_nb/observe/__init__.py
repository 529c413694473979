"""The observe layer: `report()` from inside a worker, torch_xla's counters as data, and the
analyzer that turns them into alerts (docs/architecture.md). Never draws."""

from .analyzer import Alert, analyze
from .live import LiveMetrics
from .metrics import WARMUP_STEPS, InputShapes, ShapeTracker, XlaSummary, diff, summarize
from .reporting import report

__all__ = ["WARMUP_STEPS", "Alert", "InputShapes", "LiveMetrics", "ShapeTracker", "XlaSummary",
           "analyze", "diff", "report", "summarize"]
