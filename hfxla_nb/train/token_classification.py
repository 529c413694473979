"""`fine_tune(task="token-classification")` (being built)."""

from __future__ import annotations

from typing import Any

from .config import FineTuneError
from .registry import register_task
from .tasks import Task


class TokenClassification(Task):
    name = "token-classification"
    auto_class = "AutoModelForTokenClassification"
    head_suffixes = ("ForTokenClassification",)

    def prepare(self, dataset: Any, config: Any, context: Any) -> Any:
        raise FineTuneError("task='token-classification' is not available yet.")


register_task(TokenClassification())
