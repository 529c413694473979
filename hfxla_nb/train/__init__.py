"""The train layer: one-cell fine-tuning (plan in the kernel, loop in the worker) and helpers
for `transformers.Trainer` in `train.trainer`, which imports transformers (docs/architecture.md).
"""

from .config import FineTuneConfig, FineTuneError
from .evaluate import compute_metrics
from .finetune import fine_tune
from .plan import TrainPlan
from .prepare import prepare_fine_tune
from .result import FineTuneResult

__all__ = ["FineTuneConfig", "FineTuneError", "FineTuneResult", "TrainPlan", "compute_metrics",
           "fine_tune", "prepare_fine_tune"]
