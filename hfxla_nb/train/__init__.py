"""The train layer: one-cell fine-tuning (plan in the kernel, loop in the worker) and helpers
for `transformers.Trainer` in `train.trainer`, which imports transformers (docs/architecture.md).

Public names are resolved lazily (PEP 562), like the package's own: the worker's loop
(`hfxla_nb.train.worker.loop`) runs this file, and must not import `fine_tune`, whose
launcher draws.
"""

from __future__ import annotations

from .._lazy import lazy_exports

# public name -> module of this package that defines it (imported on first use)
_EXPORTS = {
    "FineTuneConfig": "config",
    "FineTuneError": "config",
    "FineTuneResult": "result",
    "TrainPlan": "plan",
    "compute_metrics": "worker.evaluate",
    "fine_tune": "finetune",
    "prepare_fine_tune": "prepare",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
