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
    "Alert": "alerts",
    "InputShapes": "metrics",
    "LaunchReader": "reader",
    "LiveMetrics": "reader",
    "RankMetrics": "reader",
    "ShapeTracker": "metrics",
    "XlaSummary": "metrics",
    "analyze": "alerts",
    "diff": "metrics",
    "report": "reporting",
    "summarize": "metrics",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
