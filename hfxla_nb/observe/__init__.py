"""The observe layer: `report()` from inside a worker, torch_xla's counters as data, and the
analyzer that turns them into alerts (docs/architecture.md). Never draws.

Public names are resolved lazily (PEP 562), like the package's own: a worker that imports
`hfxla_nb.observe.reporting` loads only what reporting needs.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module of this package that defines it (imported on first use)
_EXPORTS = {
    "WARMUP_STEPS": "metrics",
    "Alert": "analyzer",
    "InputShapes": "metrics",
    "LiveMetrics": "live",
    "ShapeTracker": "metrics",
    "XlaSummary": "metrics",
    "analyze": "analyzer",
    "diff": "metrics",
    "report": "reporting",
    "summarize": "metrics",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module_name}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
