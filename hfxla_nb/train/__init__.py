"""The train layer: one-cell fine-tuning (plan in the kernel, loop in the worker) and helpers
for `transformers.Trainer` in `train.trainer`, which imports transformers (docs/architecture.md).

Public names are resolved lazily (PEP 562), like the package's own: the worker's loop
(`hfxla_nb.train.loop`) runs this file, and must not import `fine_tune`, whose launcher draws.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module of this package that defines it (imported on first use)
_EXPORTS = {
    "FineTuneConfig": "config",
    "FineTuneError": "config",
    "FineTuneResult": "result",
    "TrainPlan": "plan",
    "compute_metrics": "evaluate",
    "fine_tune": "finetune",
    "prepare_fine_tune": "prepare",
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
