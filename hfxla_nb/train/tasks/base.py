"""What differs between fine-tuning tasks: `Task`, the hooks every task fills in. Each task is a
module of this package (`classification.py` is the smallest); tasks are found by name in
`registry.TASKS`.

A batch `x` is one packed int32 tensor: the inputs side by side (`run.inputs(x, length)`
splits them), then the label columns (one for a class id, `length` for a label per token,
two for a span), then (evaluation) a weight column (0 for filler rows).
"""

from __future__ import annotations

from typing import Any

from .registry import TASKS, register_task

__all__ = ["TASKS", "Task", "register_task"]


class Task:
    """One fine-tuning task. Subclass it, fill in the hooks, `register_task(MyTask())`.

    Kernel side (before the fork; may import transformers, writes nothing):
        prepare(dataset, config, context) -> TrainPlan: read and check the data (refusing
            with `FineTuneError` and what to do), tokenize it into fixed-shape buckets
            (`batching.Bucket`; labels of any width per row), keep what the host needs later
            (offsets, word ids, answers) in `EncodedData.host`, and build the plan with
            `prepare.build_plan`. None (the default) is the classification path.
        prepare_predict(inputs, context, max_length) -> EncodedData: the same for `predict`'s
            inputs (labels unknown: zeros).

    Worker side (`run` is the worker's run: `run.model`, `run.torch`, `run.inputs(x, length)`,
    `run.logits(x, length)`, `run.autocast()`, `run.plan`):
        train_loss(run, x, length) -> scalar tensor.
        eval_outputs(run, x, length) -> tensors kept on the device for one fetch at the end
            (filler rows have weight `x[:, -1] == 0`).
        eval_metrics(run, batches, fetched) -> {"eval_...": float}; `fetched` holds each
            batch's `eval_outputs`, in order, on the host.
        decode(data, batches, fetched) -> one plain-Python prediction per input row (or
            example); evaluation's metrics and `predict` both go through it.
    """

    name = ""
    #: The transformers Auto class a model name or folder is loaded with.
    auto_class = ""
    #: Model class name endings that mean this task (task="auto" and model instances).
    head_suffixes: tuple[str, ...] = ()
    #: Whether task="auto" picks this task from the model's head (False: explicit only).
    pick_by_head = True
    #: Dataset columns that mean this task (task="auto" with a model without a task head).
    columns: tuple[str, ...] = ()
    #: Outputs per batch of `eval_outputs` (to split `fetched` by batch).
    outputs_per_batch = 2

    def prepare(self, dataset: Any, config: Any, context: Any) -> Any:
        return None

    def prepare_predict(self, inputs: Any, context: Any, max_length: int | None) -> Any:
        raise NotImplementedError(f"predict is not available for task {self.name!r} yet.")

    def train_loss(self, run: Any, x: Any, length: int) -> Any:
        raise NotImplementedError

    def eval_outputs(self, run: Any, x: Any, length: int) -> list[Any]:
        raise NotImplementedError

    def eval_metrics(self, run: Any, batches: list, fetched: list) -> dict[str, float]:
        raise NotImplementedError

    def decode(self, data: Any, batches: list, fetched: list) -> list[Any]:
        raise NotImplementedError(f"predict is not available for task {self.name!r} yet.")

    def splits(self, dataset: Any, config: Any) -> tuple[dict[str, Any], str | None]:
        """For `prepare`: the splits to read, training first (`{"train": ..., name: ...}`,
        from `data.pick_splits`), and the evaluation split's name (None: no evaluation).

        Raises:
            FineTuneError: the data has no training split, or an unusable evaluation one.
        """
        from ..config import FineTuneError
        from ..kernel import data

        try:
            train, evaluation, eval_name = data.pick_splits(dataset, config.eval_dataset)
        except data.DataError as error:
            raise FineTuneError(str(error)) from None
        if evaluation is None:
            return {"train": train}, None
        return {"train": train, eval_name: evaluation}, eval_name

    def per_batch(self, batches: list, fetched: list) -> list[tuple[Any, list]]:
        """`(batch, its fetched outputs)` pairs."""
        k = self.outputs_per_batch
        return [(batch, fetched[i * k:(i + 1) * k]) for i, batch in enumerate(batches)]


class MaxLength:
    """The one field `steps.length_cap` reads."""

    def __init__(self, max_length: int | None) -> None:
        self.max_length = max_length
