"""The worker side of `fine_tune`: the training loop, evaluation, checkpoints and saving.

Runs inside the worker that `notebook_launcher` forked (`_train_worker(index, plan)`), never in
the notebook kernel. What happens per training step, and why:

- one packed int32 tensor (all inputs, labels) is uploaded, sharded over the "data" axis of
  the mesh at upload in SPMD mode;
- forward, backward (over `gradient_accumulation_steps` micro-batches), gradient clipping,
  AdamW (`foreach`), scheduler, and the running loss sum are traced into one graph; one
  `torch_xla.sync()` runs it, asynchronously, so the next step is traced while it executes;
- nothing is read from the device except the running loss, once per logging interval, in a
  step closure (after the graph ran), and the panel's progress is sent with no device value.

The compile count stays fixed: a first-step graph (optimizer state created), one steady graph
per length bucket, and one evaluation graph per bucket (padded, weighted batches).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import checkpoint as ckpt
from . import data as D

#: Steps before throughput and per-step counts are measured (the first steps compile).
WARMUP_STEPS = 3
_EXECUTE = ("ExecuteTime", "ExecuteReplicatedTime")
_COUNTED = ("CompileTime", *_EXECUTE, "TransferFromDeviceTime", "TransferToDeviceTime")


# ---------------------------------------------------------------------------------------------
# The plan: everything decided in the kernel, handed to the forked worker
# ---------------------------------------------------------------------------------------------


@dataclass
class TrainPlan:
    """What the worker does. Built by `prepare_fine_tune`; crosses the fork by memory."""

    model: Any  # a name/folder (str) or a model instance
    model_kwargs: dict[str, Any]
    tokenizer: Any
    data: Any  # data.EncodedData
    batch_size: int
    gradient_accumulation_steps: int
    learning_rate: float
    weight_decay: float
    warmup_steps: int
    max_grad_norm: float | None
    total_steps: int
    steps_per_epoch: int
    precision: str  # "auto", "fp32", "bf16"
    strategy: str
    output_dir: str
    save_steps: int | None
    resume_from: str | None
    seed: int
    metrics: tuple
    log_every: int
    devices: int
    fingerprint: dict[str, Any] = field(default_factory=dict)
    save: bool = True

    @property
    def rows_per_step(self) -> int:
        return self.batch_size * self.gradient_accumulation_steps


# ---------------------------------------------------------------------------------------------
# The worker side
# ---------------------------------------------------------------------------------------------


def _train_worker(index: int, plan: TrainPlan) -> dict[str, Any]:
    """Runs in the launched worker: train, evaluate, save; returns `FineTuneResult` data."""
    from . import _xla, patches

    if plan.strategy == "spmd" and not _xla.is_spmd():
        _xla.use_spmd()  # before any tensor touches the device
    with patches.applied() as applied:
        run = _Run(index, plan)
        if applied:
            run.notes.append("patched for XLA: " + ", ".join(applied) + " (see hfxla_nb.patches)")
        return run.train_evaluate_save()


class _Run:
    """One worker's training run. Split into methods only for readability."""

    def __init__(self, index: int, plan: TrainPlan) -> None:
        import torch

        from . import _xla

        self.plan = plan
        self.torch = torch
        self.xla = _xla
        self.device = _xla.device()
        self.spmd = plan.strategy == "spmd"
        self.rank = 0 if self.spmd else _xla.global_ordinal()
        self.world = 1 if self.spmd else _xla.world_size()
        self.devices = _xla.global_device_count() if self.spmd else self.world
        self.mesh = _xla.data_parallel_mesh() if self.spmd else None
        if plan.precision == "auto":
            self.precision = "bf16" if _xla.device_type() == "TPU" else "fp32"
        else:
            self.precision = plan.precision
        if plan.rows_per_step % self.world:
            raise ValueError(
                f"batch_size x gradient_accumulation_steps = {plan.rows_per_step} does not "
                f"split over the {self.world} replicas; use a multiple of {self.world}."
            )
        self.history: list[tuple[int, float]] = []
        self.notes: list[str] = list(plan.data.notes)
        self.checkpoints: list[str] = []
        self._logged = (0, 0.0)  # (step, cumulative loss) at the previous log
        self._steady_since: float | None = None
        self._checkpoint_marks: list[tuple[float, float, dict[str, int]]] = []

    # -- setup ---------------------------------------------------------------------------------

    def _load_model(self):
        torch = self.torch
        from transformers import AutoModelForSequenceClassification
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        torch.manual_seed(self.plan.seed)  # the new head's initialization
        source = self.plan.resume_from or self.plan.model
        if isinstance(source, str):
            model = AutoModelForSequenceClassification.from_pretrained(
                source, **self.plan.model_kwargs
            )
        else:
            model = source
        return model

    def _optimizer(self, model):
        torch = self.torch
        plan = self.plan
        decay, no_decay = [], []
        for name, parameter in model.named_parameters():
            if not parameter.requires_grad:
                continue
            skip = parameter.ndim < 2 or "LayerNorm" in name or "layer_norm" in name
            (no_decay if skip else decay).append(parameter)
        groups = [{"params": decay, "weight_decay": plan.weight_decay}]
        if no_decay:
            groups.append({"params": no_decay, "weight_decay": 0.0})
        # foreach: the multi-tensor update traces far fewer ops per step than the per-parameter
        # loop torch picks for XLA by default (same arithmetic, same results).
        optimizer = torch.optim.AdamW(groups, lr=plan.learning_rate, foreach=True)
        total, warmup = plan.total_steps, plan.warmup_steps

        def schedule(step: int) -> float:
            # transformers' "linear": warm up, then decay to 0 at the last step.
            if step < warmup:
                return (step + 1) / (warmup + 1)
            return max(0.0, (total - step) / max(1, total - warmup))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return optimizer, scheduler

    def _counts(self) -> dict[str, int]:
        return self.xla.metric_counts(_COUNTED)

    # -- the batches ---------------------------------------------------------------------------

    def _upload(self, array: np.ndarray):
        tensor = self.torch.from_numpy(np.ascontiguousarray(array))
        if self.spmd:
            spec = (None, "data", None)
            return self.xla.send_to_device(tensor, self.device, self.mesh, spec)
        return self.xla.send_to_device(tensor, self.device)

    def _inputs(self, x, length: int) -> dict[str, Any]:
        names = self.plan.data.input_names
        return {name: x[:, k * length:(k + 1) * length] for k, name in enumerate(names)}

    def _logits(self, x, length: int):
        autocast = (
            self.torch.autocast("xla", dtype=self.torch.bfloat16)
            if self.precision == "bf16"
            else nullcontext()
        )
        with autocast:
            output = self.model(**self._inputs(x, length))
        return output.logits.float()

    # -- train ---------------------------------------------------------------------------------

    def train_evaluate_save(self) -> dict[str, Any]:
        torch = self.torch
        plan = self.plan
        start_time = time.perf_counter()
        self.model = self._load_model()
        self.model.to(self.device)
        if not self.spmd and self.world > 1:
            # Replicas must start equal: rank threads share torch's random generator, so a
            # freshly initialized head can differ between them. Rank 0's weights win.
            self.xla.broadcast_master_param(self.model)
        self.model.train()
        self.optimizer, self.scheduler = self._optimizer(self.model)
        start_step, loss_total = 0, 0.0
        random.seed(plan.seed)
        np.random.seed(plan.seed % 2**32)
        seed = plan.seed * 1_000_003 + 17
        if plan.resume_from:
            state = ckpt.load_state(plan.resume_from)
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            start_step = int(state["step"])
            loss_total = float(state["loss_total"])
            self.history = [tuple(pair) for pair in state["history"]]
            random.setstate(state["python_rng"])
            np.random.set_state(state["numpy_rng"])
            torch.set_rng_state(state["torch_rng"])
            seed = int(state["xla_rng"])
        self._logged = (start_step, loss_total)
        self.xla.set_rng_state(seed)
        # The running loss stays on the device; it is read once per logging interval.
        self.loss_total = torch.tensor(loss_total, dtype=torch.float32).to(self.device)
        counts_start = self._counts()
        train_start = time.perf_counter()
        steady = self._train(start_step)
        self.xla.sync()  # runs the last step closures
        self.xla.wait_device_ops()
        train_end = time.perf_counter()
        counts_end = self._counts()
        train_seconds = train_end - train_start - self._checkpoint_time_after(train_start)

        metrics, eval_compiles, eval_seconds = {}, 0, 0.0
        if plan.data.eval is not None:
            before = self._counts()
            eval_start = time.perf_counter()
            metrics = self._evaluate()
            eval_seconds = time.perf_counter() - eval_start
            eval_compiles = self._counts()["CompileTime"] - before["CompileTime"]

        compiles = counts_end["CompileTime"] - counts_start["CompileTime"]
        samples_per_second = executions = transfers = None
        if steady is not None:
            steady_counts, steady_time, steady_steps = steady
            elapsed = train_end - steady_time - self._checkpoint_time_after(steady_time)
            samples_per_second = steady_steps * plan.rows_per_step / max(elapsed, 1e-9)
            delta = {k: counts_end[k] - steady_counts[k] - self._checkpoint_counts_after(k)
                     for k in _COUNTED}
            executions = sum(delta[k] for k in _EXECUTE) / steady_steps
            transfers = delta["TransferFromDeviceTime"] / steady_steps
        result = {
            "output_dir": plan.output_dir if plan.save else None,
            "loss_history": [list(pair) for pair in self.history],
            "metrics": metrics,
            "steps": plan.total_steps,
            "epochs": plan.total_steps / plan.steps_per_epoch,
            "samples_per_second": samples_per_second,
            "train_seconds": train_seconds,
            "eval_seconds": eval_seconds,
            "compiles": compiles,
            "eval_compiles": eval_compiles,
            "executions_per_step": executions,
            "transfers_per_step": transfers,
            "label_names": list(plan.data.label_names),
            "strategy": plan.strategy,
            "devices": self.devices,
            "precision": self.precision,
            "bucket_lengths": list(plan.data.bucket_lengths),
            "batch_size": plan.batch_size,
            "checkpoints": list(self.checkpoints),
            "resumed_from": plan.resume_from,
            "notes": list(self.notes),
            "total_seconds": time.perf_counter() - start_time,
        }
        if plan.save and self.rank == 0:
            self._save_final(result)
        return result

    def _train(self, start_step: int):
        """The loop. Returns (counts, time, steps) of the steady part, or None if too short."""
        from .events import Progress, emit, worker_rank
        from .reporting import report

        torch = self.torch
        plan = self.plan
        data = plan.data
        micro = plan.gradient_accumulation_steps
        per_rank = plan.rows_per_step // self.world
        parameters = [p for p in self.model.parameters() if p.requires_grad]
        schedules: dict[int, list] = {}
        steady = None
        report_rank = worker_rank()

        def log(step: int, loss_total, lr: float) -> None:
            # Step closure: the graph that computed `loss_total` has run; one transfer.
            value = float(self.xla.to_cpu([loss_total])[0])
            last_step, last_value = self._logged
            mean = (value - last_value) / max(1, step - last_step)
            self._logged = (step, value)
            self.history.append((step, mean))
            emit(Progress(report_rank, step, plan.total_steps, {"loss": mean, "lr": lr},
                          step * plan.rows_per_step, "train"))

        for step in range(start_step, plan.total_steps):
            epoch, k = divmod(step, plan.steps_per_epoch)
            if epoch not in schedules:
                schedules = {epoch: D.epoch_schedule(data.train, plan.rows_per_step,
                                                     plan.seed, epoch)}
            bucket_index, positions = schedules[epoch][k]
            bucket = data.train.buckets[bucket_index]
            positions = positions[self.rank * per_rank:(self.rank + 1) * per_rank]
            x = self._upload(D.train_batch(bucket, positions, micro))
            step_loss = None
            for m in range(micro):
                logits = self._logits(x[m], bucket.length)
                labels = x[m][:, -1].long()
                loss = torch.nn.functional.cross_entropy(logits, labels)
                (loss / micro).backward()
                detached = loss.detach() / micro
                step_loss = detached if step_loss is None else step_loss + detached
            if plan.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(parameters, plan.max_grad_norm)
            if self.spmd:
                self.optimizer.step()
            else:
                self.xla.optimizer_step(self.optimizer)
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.loss_total = self.loss_total + step_loss
            self.xla.sync()
            done = step + 1
            report(step=done, total=plan.total_steps, samples=done * plan.rows_per_step,
                   inputs={"batch": x}, log_every=plan.log_every)
            if done % plan.log_every == 0 or done == plan.total_steps:
                lr = float(self.scheduler.get_last_lr()[0])
                self.xla.add_step_closure(log, (done, self.loss_total, lr))
            if plan.save_steps and done % plan.save_steps == 0:
                self._checkpoint(done)
            if done == start_step + WARMUP_STEPS and done < plan.total_steps:
                self.xla.wait_device_ops()  # so the warm-up's executions are counted before
                self._steady_since = time.perf_counter()
                steady = (self._counts(), self._steady_since, plan.total_steps - done)
        return steady

    def _checkpoint_time_after(self, since: float) -> float:
        return sum(end - begin for begin, end, _ in self._checkpoint_marks if begin >= since)

    def _checkpoint_counts_after(self, name: str) -> int:
        since = self._steady_since
        return sum(delta.get(name, 0) for begin, _, delta in self._checkpoint_marks
                   if since is None or begin >= since)

    # -- checkpoints ---------------------------------------------------------------------------

    def _cpu_state(self) -> tuple[dict, dict, float]:
        """Model and optimizer state on the host, with the running loss, in one transfer."""
        torch = self.torch
        model_state = self.model.state_dict()
        optimizer_state = self.optimizer.state_dict()
        names, tensors = [], []
        for name, tensor in model_state.items():
            names.append(("model", name, None))
            tensors.append(tensor)
        for pid, slots in optimizer_state["state"].items():
            for key, value in slots.items():
                if isinstance(value, torch.Tensor) and value.device.type == "xla":
                    names.append(("optimizer", pid, key))
                    tensors.append(value)
        tensors.append(self.loss_total)
        fetched = self.xla.to_cpu(tensors)
        loss_total = float(fetched.pop())
        cpu_model = {}
        cpu_optimizer = {"state": {pid: dict(slots) for pid, slots in
                                   optimizer_state["state"].items()},
                         "param_groups": optimizer_state["param_groups"]}
        for (kind, key, slot), value in zip(names, fetched, strict=True):
            if kind == "model":
                cpu_model[key] = value
            else:
                cpu_optimizer["state"][key][slot] = value
        return cpu_model, cpu_optimizer, loss_total

    def _checkpoint(self, step: int) -> None:
        # The fetch below waits for the step's execution anyway; waiting first keeps that
        # execution out of the checkpoint's own counts (subtracted from the per-step figures).
        self.xla.wait_device_ops()
        begin = time.perf_counter()
        before = self._counts()
        cpu_model, cpu_optimizer, loss_total = self._cpu_state()
        if self.rank == 0:
            # The loss history as of this step. Closures of earlier steps have run; this step's
            # log entry (its closure runs at the next sync) is computed here from the same
            # fetched total, so a resumed run's history matches an uninterrupted one.
            history = [pair for pair in self.history if pair[0] <= step]
            plan = self.plan
            if (step % plan.log_every == 0 or step == plan.total_steps) and (
                not history or history[-1][0] < step
            ):
                last_step, last_value = self._logged
                history.append((step, (loss_total - last_value) / max(1, step - last_step)))
            state = {
                "step": step,
                "optimizer": cpu_optimizer,
                "scheduler": self.scheduler.state_dict(),
                "loss_total": loss_total,
                "history": history,
                "python_rng": random.getstate(),
                "numpy_rng": np.random.get_state(),
                "torch_rng": self.torch.get_rng_state(),
                "xla_rng": self.xla.get_rng_state(),
                "fingerprint": self.plan.fingerprint,
            }

            def write_model(folder: Path) -> None:
                self.model.save_pretrained(folder, state_dict=cpu_model)
                self.plan.tokenizer.save_pretrained(folder)

            info = {"step": step, "fingerprint": self.plan.fingerprint}
            path = ckpt.save_checkpoint(self.plan.output_dir, step, write_model, state, info)
            self.checkpoints.append(str(path))
        after = self._counts()
        self._checkpoint_marks.append(
            (begin, time.perf_counter(), {k: after[k] - before[k] for k in _COUNTED})
        )

    def _save_final(self, result: dict[str, Any]) -> None:
        cpu_model, _, _ = self._cpu_state()
        with ckpt.atomic_folder(self.plan.output_dir, keep=(ckpt.CHECKPOINTS,)) as tmp:
            self.model.save_pretrained(tmp, state_dict=cpu_model)
            self.plan.tokenizer.save_pretrained(tmp)
            ckpt.write_json(tmp / ckpt.RUN_FILE, result)

    # -- evaluate ------------------------------------------------------------------------------

    def _evaluate(self) -> dict[str, float]:
        from .events import Progress, emit, worker_rank

        torch = self.torch
        plan = self.plan
        split = plan.data.eval
        last_sent = float("-inf")
        batches = D.eval_batches(split, plan.batch_size)
        self.model.eval()
        outputs = []
        with torch.no_grad():
            for i, (bucket_index, positions, real) in enumerate(batches):
                bucket = split.buckets[bucket_index]
                x = self._upload(D.eval_batch(bucket, positions, real))[0]
                logits = self._logits(x, bucket.length)
                labels = x[:, -2].long()
                weights = x[:, -1].float()
                losses = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
                # Filler rows weigh 0; `where` keeps a NaN of a filler row out of the sum.
                losses = torch.where(weights > 0, losses, torch.zeros_like(losses))
                predictions = logits.argmax(-1)
                if self.mesh is not None:
                    # Gathered in the graph: fetching sharded results would compile per tensor.
                    self.xla.replicate(predictions, self.mesh)
                    self.xla.replicate(losses, self.mesh)
                outputs += [predictions, losses]
                self.xla.sync()
                now = time.monotonic()
                if i + 1 == len(batches) or now - last_sent >= 0.2:
                    # Sent directly, not through report(): its metrics snapshots would make
                    # the panel's per-step figures count evaluation batches as steps.
                    last_sent = now
                    emit(Progress(worker_rank(), i + 1, len(batches), {}, None, "eval"))
        fetched = self.xla.to_cpu(outputs)  # one transfer for every batch
        self.model.train()
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


# ---------------------------------------------------------------------------------------------
# Metrics (host side, NumPy)
# ---------------------------------------------------------------------------------------------


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
