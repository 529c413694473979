"""The observe layer: `report()` from inside a worker, torch_xla's counters as data, and the
analyzer that turns them into alerts (docs/architecture.md). Never draws.

Public names are resolved lazily (PEP 562), like the package's own: a worker that imports
`hfxla_nb.observe.reporting` loads only what reporting needs.
"""

from __future__ import annotations

from .._lazy import lazy_exports

# public name -> module of this package that defines it (imported on first use)
_EXPORTS = {
    "WARMUP_STEPS": "metrics",
    "Alert": "alert_words",
    "InputShapes": "shapes",
    "LaunchReader": "launch_reader",
    "LiveMetrics": "live",
    "RankMetrics": "rank_metrics",
    "ShapeTracker": "shapes",
    "XlaSummary": "metrics",
    "analyze": "analyzer",
    "diff": "metrics",
    "report": "reporting",
    "summarize": "metrics",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
