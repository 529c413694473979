"""Evaluation and `predict` in the worker: padded, weighted batches on the device, exact metrics,
no recompilation.

- Evaluation: the task's outputs over padded, weighted batches (one graph per bucket), and the
  metrics computed from its predictions on the host.
- `predict`'s worker side: load the model onto every device, run the task's evaluation
  outputs over padded batches (one graph per bucket), decode on the host.

Each bucket's first batch is traced; its later batches run the compiled graph on their data
(`_xla.CompiledGraph`), tracing nothing, unless the task or its data say its outputs sync
inside (`eval_ahead` False: seq2seq and Whisper decode in their own loop).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import _xla, patches
from ...events import Progress, emit, worker_rank
from ...observe.reporting import count_in_bar
from .. import batching
from ..flow import TrainerMetrics
from ..plan import TrainPlan
from .context import WorkerContext

if TYPE_CHECKING:
    import torch

    from ..batching import EncodedSplit
    from .context import Batch, WorkerContext


# -- evaluation --

def evaluate(ctx: WorkerContext, ahead: EvalAhead | None = None) -> dict[str, float]:
    """Evaluate `ctx.model` on the plan's evaluation split: padded, weighted batches (one
    graph per bucket), every result fetched in one transfer at the end; the task
    (`tasks/`) says what is computed. `ahead`: the graphs compiled while training ran."""
    batches, fetched = run_batches(ctx, ahead, finish=False)
    metrics = ctx.task.eval_metrics(ctx, batches, fetched)
    # The bar ends with the evaluation, as the result's `eval_seconds` does: the batches' graphs
    # run while their results are fetched and the metrics computed, after the last batch was
    # traced, which took a tenth of the time.
    if batches:
        emit(Progress(worker_rank(), len(batches), len(batches), {}, None, "eval"))
    return metrics


def announce_bar(ctx: WorkerContext) -> None:
    """Announce the evaluation's bar before training (`Progress.waiting`): the panel draws it
    while training runs, so it keeps its height when the evaluation starts."""
    split = ctx.plan.data.eval
    if split is not None:
        batches = batching.eval_batch_count(split, ctx.plan.batch_size)
        emit(Progress(worker_rank(), 0, batches, label="eval", waiting=True))


def run_batches(ctx: WorkerContext, ahead: EvalAhead | None = None,
                bar: str = "eval", finish: bool = True) -> tuple[list, list]:
    """The task's `eval_outputs` of every batch of the plan's evaluation split, on the host:
    `(batches, fetched)` (evaluation and `predict` both); `ahead`'s graphs run the buckets
    they were compiled for (after `ahead.finish()`), each other bucket's first batch is
    compiled and its later ones run by that graph (`captured_outputs`); `bar` names the
    progress bar ("eval", or "predict").

    The bar reaches its total once every result is on the host (the graphs run until then),
    or, with `finish=False`, where the caller says its work ends."""
    import torch

    plan = ctx.plan
    split = plan.data.eval
    last_sent = float("-inf")
    batches = batching.eval_batches(split, plan.batch_size)
    ctx.model.eval()
    outputs = []
    # The bar's clock starts with the evaluation (step 0: no batch done yet).
    emit(Progress(worker_rank(), 0, len(batches), {}, None, bar))
    # Each bucket's graph: compiled while training ran, or captured from its first batch.
    graphs: dict[int, _xla.CompiledGraph | None] = {
        bucket: graph for bucket, graph in (ahead.graphs if ahead else {}).items() if graph.key}
    with torch.no_grad():
        for i, (bucket_index, positions, real) in enumerate(batches):
            bucket = split.buckets[bucket_index]
            # Uploaded as [rows, columns]: a `[0]` on the device would be a view the sync
            # returns too, one more output (a copy of the batch) in the evaluation graph.
            batch = ctx.upload(batching.eval_batch(bucket, positions, real))
            graph = graphs.get(bucket_index)
            if graph is not None:
                outputs += run_on(graph, batch)
            elif (bucket_index not in graphs and ctx.task.eval_ahead  # no sync of its own
                  and plan.data.eval_ahead and plan.capture_steps):
                outputs += captured_outputs(ctx, batch, graphs, bucket_index)
            else:
                outputs += traced_outputs(ctx, batch)
                _xla.sync()
            now = time.monotonic()
            if i + 1 < len(batches) and now - last_sent >= 0.2:
                # Sent directly, not through report(): its metrics snapshots would make
                # the panel's per-step figures count evaluation batches as steps.
                last_sent = now
                emit(Progress(worker_rank(), i + 1, len(batches), {}, None, bar))
            if bar != "eval":  # predict: its bar is all its process does, the metrics count it
                count_in_bar(bar, i + 1)
    fetched = _xla.to_cpu(outputs)  # one transfer for every batch
    ctx.model.train()
    if finish and batches:
        emit(Progress(worker_rank(), len(batches), len(batches), {}, None, bar))
    return batches, fetched


def traced_outputs(ctx: WorkerContext, batch: Batch) -> list[torch.Tensor]:
    """The task's evaluation outputs of `batch` (traced, not run), replicated over the mesh
    under SPMD: gathered in the graph, as fetching sharded results would compile per tensor."""
    tensors = ctx.task.eval_outputs(ctx, batch)
    ctx.replicate(tensors)
    return tensors


def batch_roles(batch: Batch) -> dict[int, _xla.Slot]:
    """The roles of a batch's tensors in an evaluation graph: ("batch", column group)."""
    return {_xla.tensor_id(tensor): ("batch", j) for j, tensor in enumerate(batch.tensors)}


def run_on(graph: _xla.CompiledGraph, batch: Batch) -> list[torch.Tensor]:
    """The outputs of an evaluation graph run on `batch` and the current weights."""
    return graph.run(graph.inputs({"batch": batch.tensors}), wait=False)


def weights_of(ctx: WorkerContext) -> list[torch.Tensor]:
    """The model's parameters and buffers: an evaluation graph reads their current values."""
    return [*ctx.model.parameters(), *ctx.model.buffers()]


def captured_outputs(ctx: WorkerContext, batch: Batch,
                     graphs: dict[int, _xla.CompiledGraph | None],
                     bucket_index: int) -> list[torch.Tensor]:
    """The evaluation outputs of a bucket's first batch, by its graph compiled from their
    trace (kept in `graphs` for the bucket's later batches: no trace for them), or traced and
    synced as always where the graph cannot run again (kept as None)."""
    roles = batch_roles(batch)
    traced = traced_outputs(ctx, batch)
    captured = _xla.CompiledGraph.capture(traced, roles, weights_of(ctx))
    # A random op would draw alike in every batch: no sync moves the seed between runs.
    if isinstance(captured, _xla.Declined) or captured[0].reads_seed:
        graphs[bucket_index] = None
        _xla.sync()  # the graph compiled for it, if any: found in the cache
        return traced
    graph, inputs = captured
    graphs[bucket_index] = graph
    del traced  # never run: the compiled graph runs instead
    return graph.run(inputs, wait=False)


class EvalAhead:
    """The evaluation's graphs (one per bucket), compiled while the training compiles its
    first step: on XLA:CPU on the second core, on a TPU host beside the training's compile.

    Before the first training step, each bucket's first evaluation batch is traced (the model
    in eval mode), the graph's inputs are read (`_xla.CompiledGraph.read`), and one thread
    per graph compiles it. Once the threads have taken the traced graphs, the traced tensors
    are cleared (`_xla.clear_pending`), so the training's syncs never see them. Evaluation
    then runs each graph by its key on the trained weights (`run_batches`): same graph, no
    compilation. A `sync()` cannot do this: a sync in progress leaves its tensors with
    neither graph nor value, which fails the training's next sync, and pending outputs would
    be swept into the training's graph. Any failure here leaves evaluation to compile when
    it starts.
    """

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.graphs: dict[int, _xla.CompiledGraph] = {}  # bucket -> its graph
        self.error: BaseException | None = None
        self._compiled: list[int] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> EvalAhead:
        """Trace and hand over the graphs; call it when nothing else is pending, just before
        the training's first step."""
        ctx = self.ctx
        split = ctx.plan.data.eval
        if (split is None or not split.num_rows or not ctx.task.eval_ahead
                or not ctx.plan.data.eval_ahead):
            return self
        try:
            self._start(split)
        except Exception as error:  # noqa: BLE001 - evaluation then compiles its graphs
            self.error = error
            self.graphs.clear()
            _xla.clear_pending()
        return self

    def _start(self, split: EncodedSplit) -> None:
        import torch

        ctx = self.ctx
        first: dict[int, tuple] = {}
        for batch in batching.eval_batches(split, ctx.plan.batch_size):
            first.setdefault(batch[0], batch)
        traced = []
        ctx.model.eval()
        try:
            with torch.no_grad():
                for bucket_index, positions, real in first.values():
                    bucket = split.buckets[bucket_index]
                    batch = ctx.upload(batching.eval_batch(bucket, positions, real))
                    traced.append((bucket_index, batch_roles(batch), traced_outputs(ctx, batch)))
        finally:
            ctx.model.train()
        lookups = _xla.graph_lookups()
        try:
            # Every graph read before any compiles: a failure then leaves no thread to
            # compile a graph the clearing below voids.
            read = {bucket_index: _xla.CompiledGraph.read(outputs, roles, weights_of(ctx))
                    for bucket_index, roles, outputs in traced}
            if any(one is None or one[0].reads_seed for one in read.values()):
                raise RuntimeError("an evaluation output is not computed by its graph alone")
            for bucket_index, _, outputs in traced:
                graph = read[bucket_index][0]
                thread = threading.Thread(target=self._compile, args=(graph, outputs),
                                          name="hfxla_nb-eval-compile", daemon=True)
                thread.start()
                self._threads.append(thread)
                self.graphs[bucket_index] = graph
            # Each compilation looks its graph up once it has taken it.
            while (_xla.graph_lookups() < lookups + len(self._threads)
                   and any(t.is_alive() for t in self._threads)):
                time.sleep(0.001)
        finally:
            del traced
            _xla.clear_pending()  # the traced outputs: never run, never synced

    def _compile(self, graph: _xla.CompiledGraph, outputs: list) -> None:
        try:
            graph.key = _xla.compile_graph(outputs)
            self._compiled.append(1)
        except Exception as error:  # noqa: BLE001 - evaluation then compiles its graphs
            self.error = error

    def finish(self) -> int:
        """Wait for the compilations; returns how many graphs were compiled ahead (after a
        failure evaluation compiles its graphs itself)."""
        for thread in self._threads:
            thread.join()
        if self.error is not None:
            self.graphs.clear()
        return len(self._compiled)


def chance_accuracy(split: EncodedSplit | None) -> float | None:
    """The accuracy of always predicting the most frequent label of `split` (an evaluation
    split of `EncodedData`), or None without one."""
    if split is None or not split.num_rows:
        return None
    labels = np.concatenate([np.asarray(bucket.labels) for bucket in split.buckets])
    return float(np.bincount(labels).max() / len(labels))


def compute_metrics(
    metrics: Sequence[str | Callable], predictions: np.ndarray, labels: np.ndarray,
    num_labels: int, probabilities: np.ndarray | None = None,
) -> dict[str, float]:
    """`eval_<name>` for each metric: accuracy, or macro-averaged f1/precision/recall, or what a
    function `f(predictions, labels)` returns (a float, or a dict of floats), or what a
    Trainer-style `compute_metrics` (`flow.TrainerMetrics`) returns for each row's
    log-probabilities (from `probabilities`) and the labels."""
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
        if isinstance(metric, TrainerMetrics):
            with np.errstate(divide="ignore"):  # a probability of 0 is a log of -inf
                values.update(metric(np.log(probabilities), labels))
        elif callable(metric):
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


def row_losses(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Each row's cross-entropy against its class id (the batch's last label column before
    the weights), 0 for filler rows: a NaN of a filler row stays out of the sum."""
    import torch

    weights = batch.weights.float()
    losses = torch.nn.functional.cross_entropy(logits, batch.tokens[:, -2].long(),
                                               reduction="none")
    return torch.where(weights > 0, losses, torch.zeros_like(losses))


# -- predict's worker side --

def predict_worker(index: int, plan: TrainPlan) -> dict[str, Any]:
    """Runs in the launched worker: returns the predictions (plain Python), the graphs
    compiled, the seconds taken and the seconds of them spent compiling."""
    if not _xla.is_spmd():
        _xla.use_spmd()  # before any tensor touches the device
    with patches.applied():
        return predictions(WorkerContext.load(plan, train=False))


def predictions(ctx: WorkerContext) -> dict[str, Any]:
    """The predictions of `ctx`'s model on its plan's inputs (plain Python), the graphs
    compiled, the seconds taken and the seconds of them spent compiling (`predict_worker`,
    and a warm model's predict: `worker.warm`)."""
    before, _ = _xla.compile_times()
    start = time.perf_counter()
    batches, fetched = run_batches(ctx, bar="predict")  # the bar says what runs
    decoded = ctx.task.decode(ctx.plan.data, batches, fetched)
    seconds = time.perf_counter() - start
    count, times = _xla.compile_times()
    compiles = count - before
    return {"predictions": decoded, "seconds": seconds, "compiles": compiles,
            "compile_seconds": sum(times[len(times) - compiles:]) if compiles else 0.0}
