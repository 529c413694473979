"""`fine_tune(task="question-answering")` (being built)."""

from __future__ import annotations

from typing import Any

from .config import FineTuneError
from .registry import register_task
from .tasks import Task


class QuestionAnswering(Task):
    name = "question-answering"
    auto_class = "AutoModelForQuestionAnswering"
    head_suffixes = ("ForQuestionAnswering",)

    def prepare(self, dataset: Any, config: Any, context: Any) -> Any:
        raise FineTuneError("task='question-answering' is not available yet.")


register_task(QuestionAnswering())
