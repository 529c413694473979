"""Evaluation in the worker (padded, weighted batches: exact metrics, no recompilation) and
the metrics computed from its predictions on the host."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..events import Progress, emit, worker_rank
from . import batching


def evaluate(run: Any) -> dict[str, float]:
    """Evaluate `run.model` on the plan's evaluation split: padded, weighted batches (one
    graph per bucket), every result fetched in one transfer at the end; the task
    (`tasks.py`) says what is computed."""
    batches, fetched = run_batches(run)
    return run.task.eval_metrics(run, batches, fetched)


def run_batches(run: Any) -> tuple[list, list]:
    """The task's `eval_outputs` of every batch of the plan's evaluation split, on the host:
    `(batches, fetched)` (evaluation and `predict` both)."""
    torch = run.torch
    plan = run.plan
    split = plan.data.eval
    last_sent = float("-inf")
    batches = batching.eval_batches(split, plan.batch_size)
    run.model.eval()
    outputs = []
    # The bar's clock starts with the evaluation (step 0: no batch done yet).
    emit(Progress(worker_rank(), 0, len(batches), {}, None, "eval"))
    with torch.no_grad():
        for i, (bucket_index, positions, real) in enumerate(batches):
            bucket = split.buckets[bucket_index]
            x = run.upload(batching.eval_batch(bucket, positions, real))[0]
            tensors = run.task.eval_outputs(run, x, bucket.length)
            if run.mesh is not None:
                # Gathered in the graph: fetching sharded results would compile per tensor.
                for tensor in tensors:
                    run.xla.replicate(tensor, run.mesh)
            outputs += tensors
            run.xla.sync()
            now = time.monotonic()
            if i + 1 == len(batches) or now - last_sent >= 0.2:
                # Sent directly, not through report(): its metrics snapshots would make
                # the panel's per-step figures count evaluation batches as steps.
                last_sent = now
                emit(Progress(worker_rank(), i + 1, len(batches), {}, None, "eval"))
    fetched = run.xla.to_cpu(outputs)  # one transfer for every batch
    run.model.train()
    return batches, fetched


def chance_accuracy(split: Any) -> float | None:
    """The accuracy of always predicting the most frequent label of `split` (an evaluation
    split of `EncodedData`), or None without one."""
    if split is None or not split.num_rows:
        return None
    labels = np.concatenate([np.asarray(bucket.labels) for bucket in split.buckets])
    return float(np.bincount(labels).max() / len(labels))


def compute_metrics(
    metrics: Sequence[str | Callable], predictions: np.ndarray, labels: np.ndarray,
    num_labels: int,
) -> dict[str, float]:
    """`eval_<name>` for each metric: accuracy, or macro-averaged f1/precision/recall, or what a
    function `f(predictions, labels)` returns (a float, or a dict of floats)."""
    values: dict[str, float] = {}
    confusion = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(confusion, (labels, predictions), 1)
    true_positive = np.diag(confusion).astype(np.float64)
    predicted = confusion.sum(axis=0).astype(np.float64)
    actual = confusion.sum(axis=1).astype(np.float64)
    present = actual > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(predicted > 0, true_positive / predicted, 0.0)
        recall = np.where(actual > 0, true_positive / actual, 0.0)
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    for metric in metrics:
        if callable(metric):
            value = metric(predictions, labels)
            name = getattr(metric, "__name__", "metric")
            if isinstance(value, dict):
                values.update({f"eval_{k}": float(v) for k, v in value.items()})
            else:
                values[f"eval_{name}"] = float(value)
        elif metric == "accuracy":
            values["eval_accuracy"] = float((predictions == labels).mean())
        elif metric == "precision":
            values["eval_precision"] = float(precision[present].mean())
        elif metric == "recall":
            values["eval_recall"] = float(recall[present].mean())
        elif metric == "f1":
            values["eval_f1"] = float(f1[present].mean())
    return values
