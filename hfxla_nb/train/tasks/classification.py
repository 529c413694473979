"""Sequence classification: a label per row; accuracy, f1, precision, recall."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..worker.evaluate import chance_accuracy, compute_metrics, row_losses
from . import classification_data
from .base import Task
from .registry import register_task

if TYPE_CHECKING:
    import torch

    from ..batching import EncodedData, EncodedSplit
    from ..config import FineTuneConfig
    from ..kernel.preparation import Prepared, Splits, TaskContext
    from ..predict import PredictContext
    from ..worker.batch import Batch
    from ..worker.context import WorkerContext



class Classification(Task):
    """Sequence classification: a label per row; accuracy, f1, precision, recall."""

    name = "classification"
    pipeline_tag = "text-classification"
    eval_ahead = True
    auto_class = "AutoModelForSequenceClassification"
    head_suffixes = ("ForSequenceClassification",)
    peft_task_type = classification_data.PEFT_TASK_TYPE
    title = "classification"
    shows_labels = True

    def train_loss(self, ctx: WorkerContext, batch: Batch) -> torch.Tensor:
        import torch

        logits = ctx.logits(batch)
        return torch.nn.functional.cross_entropy(logits, batch.tokens[:, -1].long())

    outputs_per_batch = 3

    def eval_outputs(self, ctx: WorkerContext, batch: Batch) -> list[torch.Tensor]:
        import torch

        logits = ctx.logits(batch)
        losses = row_losses(logits, batch)
        return [logits.argmax(-1), losses, torch.softmax(logits, dim=-1)]

    def _by_row(self, split: Any, batches: list, fetched: list, index: int,
                dtype: Any) -> np.ndarray:
        """One of the eval outputs of every row of `split`, in the split's order."""
        values = None
        for (bucket_index, positions, real), outputs in self.per_batch(batches, fetched):
            array = outputs[index].float().numpy() if dtype is float else outputs[index].numpy()
            if values is None:
                values = np.empty((split.num_rows, *array.shape[1:]), dtype=array.dtype)
            values[split.buckets[bucket_index].rows[positions[:real]]] = array[:real]
        return values

    def chance_accuracy(self, split: EncodedSplit | None) -> float | None:
        """Always predicting `split`'s most frequent label (`evaluate.chance_accuracy`)."""
        return chance_accuracy(split)

    def eval_metrics(self, ctx: WorkerContext, batches: list, fetched: list) -> dict[str, float]:
        split, plan = ctx.plan.data.eval, ctx.plan
        predictions = self._by_row(split, batches, fetched, 0, int).astype(np.int64)
        row_losses = self._by_row(split, batches, fetched, 1, float).astype(np.float64)
        labels = np.empty(split.num_rows, dtype=np.int64)
        for bucket in split.buckets:
            labels[bucket.rows] = bucket.labels
        values = {"eval_loss": float(row_losses.mean())}
        values.update(compute_metrics(plan.metrics, predictions, labels,
                                      len(plan.data.label_names)))
        values["eval_rows"] = float(split.num_rows)
        return values

    def decode(self, data: Any, batches: list, fetched: list) -> list[dict[str, Any]]:
        """Each row's label, its probability, and every label's probability."""
        probabilities = self._by_row(data.eval, batches, fetched, 2, float)
        names = data.label_names
        return [{"label": names[int(p.argmax())], "score": float(p.max()),
                 "probabilities": {name: float(v) for name, v in zip(names, p, strict=True)}}
                for p in probabilities]

    # -- kernel side (classification_data.py) ------------------------------------------------

    def prepare(self, splits: Splits, config: FineTuneConfig,
                context: TaskContext) -> Prepared:
        """Texts and labels checked, tokenized into length buckets, the head sized for the
        labels; peft's SEQ_CLS settings and their memory plan with `lora=`."""
        return classification_data.prepare(splits, config, context)

    def prepare_predict(self, inputs: list[Any], context: PredictContext,
                        max_length: int | None) -> EncodedData:
        """Texts, or (text, pair) tuples, tokenized and bucketed like evaluation rows."""
        return classification_data.prepare_predict(inputs, context, max_length)



register_task(Classification())
