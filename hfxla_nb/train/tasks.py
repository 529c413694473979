"""What differs between fine-tuning tasks, in the worker: which model class, the training loss,
and what evaluation computes on the device and then on the host.

A batch `x` is one packed int32 tensor: the inputs side by side (`run.inputs(x, length)`
splits them), then a label column, then (evaluation) a weight column (0 for filler rows).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .evaluate import compute_metrics


class Classification:
    """Sequence classification: a label per row; accuracy, f1, precision, recall."""

    name = "classification"
    auto_class = "AutoModelForSequenceClassification"

    def train_loss(self, run: Any, x: Any, length: int) -> Any:
        logits = run.logits(x, length)
        return run.torch.nn.functional.cross_entropy(logits, x[:, -1].long())

    def eval_outputs(self, run: Any, x: Any, length: int) -> list[Any]:
        torch = run.torch
        logits = run.logits(x, length)
        weights = x[:, -1].float()
        losses = torch.nn.functional.cross_entropy(logits, x[:, -2].long(), reduction="none")
        # Filler rows weigh 0; `where` keeps a NaN of a filler row out of the sum.
        losses = torch.where(weights > 0, losses, torch.zeros_like(losses))
        return [logits.argmax(-1), losses]

    def eval_metrics(self, run: Any, batches: list, fetched: list) -> dict[str, float]:
        split, plan = run.plan.data.eval, run.plan
        predictions = np.empty(split.num_rows, dtype=np.int64)
        row_losses = np.empty(split.num_rows, dtype=np.float64)
        for (bucket_index, positions, real), prediction, loss in zip(
            batches, fetched[0::2], fetched[1::2], strict=True
        ):
            rows = split.buckets[bucket_index].rows[positions[:real]]
            predictions[rows] = prediction.numpy()[:real]
            row_losses[rows] = loss.float().numpy()[:real]
        labels = np.empty(split.num_rows, dtype=np.int64)
        for bucket in split.buckets:
            labels[bucket.rows] = bucket.labels
        values = {"eval_loss": float(row_losses.mean())}
        values.update(compute_metrics(plan.metrics, predictions, labels,
                                      len(plan.data.label_names)))
        values["eval_rows"] = float(split.num_rows)
        return values


class CausalLM:
    """Next-token prediction: labels in the row (-100 where nothing is learned); the loss is
    the mean over learned tokens, evaluation reports it and its perplexity."""

    name = "causal-lm"
    auto_class = "AutoModelForCausalLM"

    def _output(self, run: Any, x: Any, length: int, with_labels: bool) -> Any:
        inputs = run.inputs(x, length)
        labels = inputs.pop("labels").long()
        with run.autocast():
            # No key/value cache while training: nothing reads it, and a layer recomputed by
            # gradient checkpointing would append to it a second time.
            output = run.model(**inputs, labels=labels if with_labels else None, use_cache=False)
        return output, labels

    def train_loss(self, run: Any, x: Any, length: int) -> Any:
        output, _ = self._output(run, x, length, with_labels=True)
        return output.loss.float()

    def eval_outputs(self, run: Any, x: Any, length: int) -> list[Any]:
        torch = run.torch
        output, labels = self._output(run, x, length, with_labels=False)
        logits = output.logits.float()[:, :-1]
        targets = labels[:, 1:]
        losses = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
            reduction="none",
        ).view(targets.shape)
        weights = (targets != -100).float() * x[:, -1].float()[:, None]
        return [(losses * weights).sum(-1), weights.sum(-1)]

    def eval_metrics(self, run: Any, batches: list, fetched: list) -> dict[str, float]:
        total = tokens = 0.0
        for (_, _, real), sums, counts in zip(batches, fetched[0::2], fetched[1::2],
                                              strict=True):
            total += float(sums.double().numpy()[:real].sum())
            tokens += float(counts.double().numpy()[:real].sum())
        loss = total / max(tokens, 1.0)
        return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 50.0)),
                "eval_tokens": tokens, "eval_rows": float(run.plan.data.eval.num_rows)}


TASKS = {task.name: task for task in (Classification(), CausalLM())}
