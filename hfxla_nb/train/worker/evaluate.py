"""Evaluation and `predict` in the worker: padded, weighted batches on the device, exact metrics,
no recompilation.

- Evaluation: the task's outputs over padded, weighted batches (one graph per bucket), and the
  metrics computed from its predictions on the host.
- `predict`'s worker side: load the model onto every device, run the task's evaluation
  outputs over padded batches (one graph per bucket), decode on the host.

Each bucket's first batch is traced; its later batches run the compiled graph on their data
(`_xla.CompiledGraph`), tracing nothing, unless the task or its data say its outputs sync
inside (`eval_ahead` False: seq2seq and Whisper decode in their own loop). The replay obeys
the training step's rules (`BatchReplay`): a graph runs again only where nothing in its
trace can differ at the next batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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

def evaluate(ctx: WorkerContext, ahead: EvalAhead | None = None,
             replayed: dict[str, str] | None = None) -> dict[str, float]:
    """Evaluate `ctx.model` on the plan's evaluation split: padded, weighted batches (one
    graph per bucket), every result fetched in one transfer at the end; the task
    (`tasks/`) says what is computed. `ahead`: the graphs compiled while training ran;
    `replayed`: gets each bucket's replay (`run_batches`)."""
    batches, fetched = run_batches(ctx, ahead, finish=False, replayed=replayed)
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
        emit(Progress(worker_rank(), 0, batches, label="eval", waiting=True,
                      starts=ctx.plan.trainer.when_evaluating()))


def run_batches(ctx: WorkerContext, ahead: EvalAhead | None = None,
                bar: str = "eval", finish: bool = True,
                replayed: dict[str, str] | None = None) -> tuple[list, list]:
    """The task's `eval_outputs` of every batch of the plan's evaluation split, on the host:
    `(batches, fetched)` (evaluation and `predict` both); `ahead`'s graphs run the buckets
    they were compiled for (after `ahead.finish()`), each other bucket's first batch is
    compiled and its later ones run by that graph where the replay's rules allow
    (`BatchReplay`); `bar` names the progress bar ("eval", or "predict"); `replayed` gets
    each bucket's batch shape -> "replayed", or "traced: <why>".

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
    replay = BatchReplay(ctx, ahead)
    with torch.no_grad():
        for i, (bucket_index, positions, real) in enumerate(batches):
            bucket = split.buckets[bucket_index]
            # Uploaded as [rows, columns]: a `[0]` on the device would be a view the sync
            # returns too, one more output (a copy of the batch) in the evaluation graph.
            batch = ctx.upload(batching.eval_batch(bucket, positions, real))
            outputs += replay.outputs(bucket_index, batch,
                                      f"{len(positions)}x{bucket.length}")
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
    if replayed is not None:
        replayed.update(replay.decisions)
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


@dataclass
class _Unproven:
    """A bucket's graph with constants made on the host while tracing: it runs the batch it
    was traced from, and the bucket's later batches only once a second trace gave the same
    graph and constants. `fresh`: compiled ahead from the bucket's first batch, not run yet."""

    graph: _xla.CompiledGraph
    fresh: bool = False


class BatchReplay:
    """Which graph runs each evaluation batch, bucket by bucket, under the rules a training
    step's replay obeys: a bucket's later batches run its first batch's compiled graph only
    where nothing in that trace can differ at the next batch. No op ran on the CPU while it was
    traced (a value read back from the device, an op XLA does not lower), no random op (no
    sync moves the seed between runs), and the constants made on the host while tracing (a
    Python number, an uploaded mask) are the same at a second trace. Otherwise the bucket's
    batches are traced and synced, as without replay. `compiled_steps=False` traces them all.

    Args:
        ctx: the worker's model and plan.
        ahead: the graphs compiled while training ran (each from its bucket's first batch).

    Attributes:
        decisions: each bucket's batch shape ("32x48") -> "replayed", or "traced: <why>"
            (a bucket of one batch has nothing to replay: none).
    """

    def __init__(self, ctx: WorkerContext, ahead: EvalAhead | None) -> None:
        self.ctx = ctx
        plan = ctx.plan
        self.why_not = (None if ctx.task.eval_ahead and plan.data.eval_ahead
                        and plan.capture_steps else
                        "compiled_steps=False" if not plan.capture_steps else
                        "the task syncs inside its evaluation")
        # bucket -> its graph; `_Unproven` until a second trace; None: traced from now on.
        self.graphs: dict[int, _xla.CompiledGraph | _Unproven | None] = {
            bucket: (_Unproven(graph, fresh=True) if graph.traced_constants else graph)
            for bucket, graph in (ahead.graphs if ahead else {}).items() if graph.key}
        self.decisions: dict[str, str] = {}

    def outputs(self, bucket: int, batch: Batch, shape: str) -> list[torch.Tensor]:
        """The evaluation outputs of `batch`, of bucket `bucket` (batch shape `shape`)."""
        state = self.graphs.get(bucket, False)
        if state is None or self.why_not is not None:
            if self.why_not is not None:
                self.decisions.setdefault(shape, f"traced: {self.why_not}")
            traced = traced_outputs(self.ctx, batch)
            _xla.sync()
            return traced
        if isinstance(state, _xla.CompiledGraph):
            self.decisions.setdefault(shape, "replayed")
            outputs = run_on(state, batch)
        elif isinstance(state, _Unproven) and state.fresh:
            state.fresh = False  # the batch it was traced from: its constants are its own
            outputs = run_on(state.graph, batch)
        else:
            outputs, synced = self._capture(bucket, batch, shape, state or None)
            if synced:
                return outputs
        # A batch run by its graph ends as the traced batch's sync would: the device's seed
        # moves on, so the training's dropout after an evaluation is the traced loop's.
        _xla.end_step()
        return outputs

    def _capture(self, bucket: int, batch: Batch, shape: str,
                 first: _Unproven | None) -> tuple[list[torch.Tensor], bool]:
        """Trace `batch` and compile its graph; run it by the graph where it can be, else
        sync the trace; decide what runs the bucket's later batches. Returns the outputs
        and whether they were synced."""
        fallbacks = _xla.fallback_counts()
        roles = batch_roles(batch)
        traced = traced_outputs(self.ctx, batch)
        ran_on_cpu = _xla.fallbacks_since(fallbacks)
        captured = (_xla.Declined(
            f"the evaluation ran {', '.join(ran_on_cpu)} on the CPU while it was traced: "
            "what it read may differ at the next batch") if ran_on_cpu else
            _xla.CompiledGraph.capture(traced, roles, weights_of(self.ctx)))
        if not isinstance(captured, _xla.Declined) and captured[0].reads_seed:
            captured = _xla.Declined("a random op (dropout in eval mode, sampling) would draw "
                                     "alike in every batch")
        if isinstance(captured, _xla.Declined):
            self.graphs[bucket] = None
            self.decisions[shape] = f"traced: {captured.reason}"
            _xla.sync()  # the graph compiled for it, if any: found in the cache
            return traced, True
        graph, inputs = captured
        del traced  # never run: the compiled graph runs instead
        if first is not None:  # the second trace: the same graph and constants, or traced
            why = _differs(first.graph, graph)
            self.graphs[bucket] = graph if why is None else None
            self.decisions[shape] = "replayed" if why is None else f"traced: {why}"
        elif graph.traced_constants:
            self.graphs[bucket] = _Unproven(graph)
        else:
            self.graphs[bucket] = graph
        return graph.run(inputs, wait=False), False


def _differs(first: _xla.CompiledGraph, second: _xla.CompiledGraph) -> str | None:
    """Why two traces of a bucket's batches are not the same graph with the same constants
    made on the host, or None when they are."""
    made = first.constants_unlike(second)
    if made is None:
        return ("its second batch traced another graph than its first (a Python branch on "
                "a value of the host)")
    if made:
        return (f"a value made on the host while tracing ({', '.join(made)}) differs between "
                "two batches")
    return None


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
        fallbacks = _xla.fallback_counts()
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
            if (any(one is None or one[0].reads_seed for one in read.values())
                    or _xla.fallbacks_since(fallbacks)):  # `BatchReplay` says why, later
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
