"""The worker side of `fine_tune`: the training loop, evaluation, checkpoints and saving.

Runs inside the worker that `notebook_launcher` forked (`train_worker(index, plan)`), never in
the notebook kernel. What happens per training step, and why:

- one packed int32 tensor (all inputs, labels) is uploaded, sharded over the "data" axis of
  the mesh at upload in SPMD mode;
- forward, backward (over `gradient_accumulation_steps` micro-batches), gradient clipping,
  AdamW (`foreach`), scheduler, and the running loss sum are traced into one graph; one
  `torch_xla.sync()` runs it, asynchronously, so the next step is traced while it executes;
- nothing is read from the device except the running loss, once per logging interval, queued
  by a step closure (after the graph ran) and fetched on a thread of its own, so the loop
  goes on tracing; the panel's progress is sent with no device value.

The compile count stays fixed: one training graph per length bucket (the optimizer state is
made before step 1, so step 1 is already the steady graph) and one evaluation graph per bucket
(padded, weighted batches).
"""

from __future__ import annotations

import random
import time
from contextlib import nullcontext
from typing import Any

import numpy as np

from ... import _xla
from ...events import Progress, emit, worker_rank
from ...observe.reporting import MIN_INTERVAL, report
from .. import batching, lora, patches
from ..counts import COUNTED, EXECUTE
from ..learning import learning_warnings
from ..plan import TrainPlan, resolve_precision
from ..tasks.registry import TASKS
from . import checkpoint as ckpt
from .evaluate import EvalAhead, chance_accuracy, evaluate
from .saving import save_checkpoint, save_final

#: Seconds between the loop's progress reports (besides logging points and new buckets): the
#: bar moves twice a second; each report costs the step about 1 ms of host time (bench
#: figure 12), more often it would be most of the loop's own work.
BAR_INTERVAL = max(0.5, MIN_INTERVAL)

#: Steps left out of the steady-state figures (samples/s, executions and transfers per step):
#: the first two compile, the third still waits for them.
STEADY_AFTER_STEPS = 3


# ---------------------------------------------------------------------------------------------
# The plan: everything decided in the kernel, handed to the forked worker
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# The worker side
# ---------------------------------------------------------------------------------------------


def train_worker(index: int, plan: TrainPlan) -> dict[str, Any]:
    """Runs in the launched worker: train, evaluate, save; returns `FineTuneResult` data."""
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

        self.plan = plan
        self.torch = torch
        self.xla = _xla
        self.device = _xla.device()
        self.spmd = plan.strategy == "spmd"
        self.rank = 0 if self.spmd else _xla.global_ordinal()
        self.world = 1 if self.spmd else _xla.world_size()
        self.devices = _xla.global_device_count() if self.spmd else self.world
        self.task = TASKS[plan.task]
        # FSDPv2 shards parameters over the axis that also splits the batch.
        self.axis = "fsdp" if plan.sharding == "fsdp" else "data"
        self.mesh = _xla.data_parallel_mesh(self.axis) if self.spmd else None
        self.precision = resolve_precision(plan.precision, _xla.device_type())
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
        self.checkpoint_marks: list[tuple[float, float, dict[str, int]]] = []
        # Set by `train_evaluate_save` (evaluate.py); `predict` evaluates without one.
        self.eval_ahead: EvalAhead | None = None

    # -- setup ---------------------------------------------------------------------------------

    def _load_model(self):
        import transformers
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.torch.manual_seed(self.plan.seed)  # the new head's initialization
        # A LoRA run resumes from the plan's base; the checkpoint holds only the adapter.
        resume = None if self.plan.lora else self.plan.resume_from
        source = resume or self.plan.model
        if not isinstance(source, str):
            return source
        auto_class = getattr(transformers, self.task.auto_class)
        return auto_class.from_pretrained(source, **self.plan.model_kwargs)

    def _shard(self, model):
        """FSDPv2 (parameters sharded) or plain; torch_xla's checkpoint on each layer when
        asked. Returns the module to call; `self.base_model` stays the one to save."""
        layers = {type(module) for module in model.modules()
                  if type(module).__name__ in set(getattr(model, "_no_split_modules", None) or ())}
        if self.plan.gradient_checkpointing:
            names = ", ".join(sorted(layer.__name__ for layer in layers)) or "none found"
            self.notes.append(f"gradient checkpointing with torch_xla's checkpoint on each "
                              f"layer ({names})")
        if self.plan.sharding == "fsdp":
            return self.xla.fsdp_v2(model, self.mesh, layers, self.plan.gradient_checkpointing)
        if self.plan.gradient_checkpointing and layers:
            self.xla.checkpoint_layers(model, layers)
        return model

    def _optimizer(self, model):
        from .adamw import AdamW  # imports torch: only in the worker

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
        # loop torch picks for XLA by default (same arithmetic, same results); adamw.AdamW
        # traces it out of place, skipping torch's Python shape checks (~4x less host time).
        optimizer = AdamW(groups, lr=plan.learning_rate, foreach=True)
        total, warmup = plan.total_steps, plan.warmup_steps

        def schedule(step: int) -> float:
            # transformers' "linear": warm up, then decay to 0 at the last step.
            if step < warmup:
                return (step + 1) / (warmup + 1)
            return max(0.0, (total - step) / max(1, total - warmup))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return optimizer, scheduler

    def counts(self) -> dict[str, int]:
        return self.xla.metric_counts(COUNTED)

    # -- the batches ---------------------------------------------------------------------------

    def upload(self, array: np.ndarray):
        """A `[..., rows, columns]` batch on the device; under SPMD, the rows split over the
        mesh's batch axis."""
        tensor = self.torch.from_numpy(np.ascontiguousarray(array))
        if self.spmd:
            spec = (None,) * (tensor.dim() - 2) + (self.axis, None)
            return self.xla.send_to_device(tensor, self.device, self.mesh, spec)
        return self.xla.send_to_device(tensor, self.device)

    def inputs(self, x, length: int) -> dict[str, Any]:
        names = self.plan.data.input_names
        return {name: x[:, k * length:(k + 1) * length] for k, name in enumerate(names)}

    def autocast(self):
        if self.precision == "bf16":
            return self.torch.autocast("xla", dtype=self.torch.bfloat16)
        return nullcontext()

    def logits(self, x, length: int):
        with self.autocast():
            output = self.model(**self.inputs(x, length))
        return output.logits.float()

    # -- train ---------------------------------------------------------------------------------

    def train_evaluate_save(self) -> dict[str, Any]:
        """The worker's whole job: set up, train, evaluate, save; returns the result's fields."""
        plan = self.plan
        start_time = time.perf_counter()
        self._set_up()
        start_step = self._restore()
        counts_start = self.counts()
        # The evaluation's graphs compile beside the first step's (evaluate.py).
        self.eval_ahead = EvalAhead(self).start()
        train_start = time.perf_counter()
        steady = self._train(start_step)
        self.xla.sync()  # runs the last step closures
        self.xla.wait_device_ops()
        train_end = time.perf_counter()
        ahead_compiles = self.eval_ahead.finish()
        counts_end = self.counts()
        train_seconds = train_end - train_start - self._checkpoint_time_after(train_start)

        metrics, eval_compiles, eval_seconds = {}, 0, 0.0
        if plan.data.eval is not None:
            before = self.counts()
            eval_start = time.perf_counter()
            metrics = evaluate(self)
            eval_seconds = time.perf_counter() - eval_start
            eval_compiles = (ahead_compiles + self.counts()[_xla.COMPILE_TIME]
                             - before[_xla.COMPILE_TIME])

        trained = (plan.total_steps - start_step) * plan.rows_per_step
        result = {
            **self._described(),
            **self._steady_figures(steady, counts_end, train_end),
            "metrics": metrics,
            "loss_history": [list(pair) for pair in self.history],
            "train_seconds": train_seconds,
            "eval_seconds": eval_seconds,
            # Training graphs only: gathering an FSDP checkpoint's shards compiles its own.
            "compiles": counts_end[_xla.COMPILE_TIME] - counts_start[_xla.COMPILE_TIME]
            - sum(delta.get(_xla.COMPILE_TIME, 0) for _, _, delta in self.checkpoint_marks)
            - ahead_compiles,
            "eval_compiles": eval_compiles,
            "eval_compiled_ahead": ahead_compiles,
            "checkpoints": list(self.checkpoints),
            "notes": list(self.notes),
            "samples_per_second_overall": trained / max(train_seconds, 1e-9),
            "total_seconds": time.perf_counter() - start_time,
        }
        result["chance_accuracy"] = (chance_accuracy(plan.data.eval)
                                     if plan.task == "classification" else None)
        result["warnings"] = learning_warnings(self.history, metrics,
                                               result["chance_accuracy"])
        if plan.save and self.rank == 0:
            save_final(self, result)
        return result

    def _set_up(self) -> None:
        """The model on the device (sharded when SPMD), its optimizer and scheduler."""
        self.base_model = lora.worker_model(self._load_model(), self.plan, self.precision)
        self.base_model.to(self.device)
        self.model = self._shard(self.base_model)
        if not self.spmd and self.world > 1:
            # Replicas must start equal: rank threads share torch's random generator, so a
            # freshly initialized head can differ between them. Rank 0's weights win.
            self.xla.broadcast_master_param(self.base_model)
        self.model.train()
        self.optimizer, self.scheduler = self._optimizer(self.model)

    def _restore(self) -> int:
        """Seeds every generator, or restores them, the optimizer and the history from the
        checkpoint to resume from, and makes the first step's state; returns the step to
        start at."""
        torch, plan = self.torch, self.plan
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
        # The running loss stays on the device; it is read once per logging interval.
        self.loss_total = torch.tensor(loss_total, dtype=torch.float32).to(self.device)
        self._make_first_step_steady()
        # After the sync above: each sync moves XLA's random seed on, so seeding before it
        # would give a resumed run other dropout masks than the uninterrupted one.
        self.xla.set_rng_state(seed)
        return start_step

    def _make_first_step_steady(self) -> None:
        """Make on the device, before step 1, everything that step 1 would otherwise create,
        so that step 1 traces the steady graph and training compiles one graph per bucket.

        AdamW's state (`step` on the host, `exp_avg` and `exp_avg_sq` zeros like each
        parameter, with its sharding) is what torch creates lazily in the first
        `optimizer.step()`; a resumed run brings its own, loaded from the checkpoint. Under
        SPMD every tensor the step reads gets an explicit sharding, as a graph's outputs have.
        The zeros are made by one small graph here, outside the training's compile count."""
        torch, optimizer = self.torch, self.optimizer
        states = []
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                state = optimizer.state[parameter]
                if not state:
                    state.update(step=torch.tensor(0.0, dtype=torch.float32),
                                 exp_avg=torch.zeros_like(parameter),
                                 exp_avg_sq=torch.zeros_like(parameter))
                for name in ("exp_avg", "exp_avg_sq"):
                    if self.spmd and self.xla.sharding_spec(state[name]) == "":
                        self.xla.share_sharding(state[name], parameter)
                    states.append(state[name])
        if self.spmd:
            self.xla.replicate_unsharded([*self.model.parameters(), *states, self.loss_total],
                                         self.mesh)
        self.xla.sync()

    def _steady_figures(self, steady, counts_end: dict[str, float],
                        train_end: float) -> dict[str, float | None]:
        """Throughput, executions and transfers per step over the steps after warm-up
        (checkpoint writing excluded); None when the run was too short to have any."""
        if steady is None:
            return {"samples_per_second": None, "executions_per_step": None,
                    "transfers_per_step": None}
        steady_counts, steady_time, steady_steps = steady
        elapsed = train_end - steady_time - self._checkpoint_time_after(steady_time)
        delta = {k: counts_end[k] - steady_counts[k] - self._checkpoint_counts_after(k)
                 for k in COUNTED}
        return {
            "samples_per_second": steady_steps * self.plan.rows_per_step / max(elapsed, 1e-9),
            "executions_per_step": sum(delta[k] for k in EXECUTE) / steady_steps,
            "transfers_per_step": delta[_xla.TRANSFER_FROM_DEVICE_TIME] / steady_steps,
        }

    def _described(self) -> dict[str, Any]:
        """What the run was: task, layout, sizes, where it saved."""
        plan = self.plan
        return {
            "output_dir": plan.output_dir if plan.save else None,
            "steps": plan.total_steps,
            "epochs": plan.total_steps / plan.steps_per_epoch,
            "label_names": list(plan.data.label_names),
            "task": plan.task,
            "sharding": plan.sharding,
            "gradient_checkpointing": plan.gradient_checkpointing,
            "parameter_sharding": self._parameter_sharding(),
            "strategy": plan.strategy,
            "devices": self.devices,
            "precision": self.precision,
            "bucket_lengths": list(plan.data.bucket_lengths),
            "batch_size": plan.batch_size,
            "resumed_from": plan.resume_from,
            **lora.described(self),
        }

    def _train(self, start_step: int):
        """The loop. Returns (counts, time, steps) of the steady part, or None if too short."""
        plan = self.plan
        data = plan.data
        micro = plan.gradient_accumulation_steps
        per_rank = plan.rows_per_step // self.world
        parameters = [p for p in self.model.parameters() if p.requires_grad]
        from .clipping import GradientClipper  # imports torch: only in the worker

        # torch_xla's clip_grad_norm_, same ops, less host work per step (train/clipping.py).
        clip = (GradientClipper(parameters, plan.max_grad_norm)
                if plan.max_grad_norm is not None else None)
        schedules: dict[int, list] = {}
        steady = None
        report_rank = worker_rank()

        # The bar's clock starts here, with the loop (step 0: nothing done yet).
        emit(Progress(report_rank, start_step, plan.total_steps, {},
                      start_step * plan.rows_per_step, "train"))

        def log(step: int, loss_total, lr: float) -> None:
            # The graph that computed `loss_total` ran while the next step was traced; the
            # fetch (one transfer) still waits for the execution just launched (torch_xla's
            # device lock), so it runs on the fetcher's thread, not the training loop's.
            value = float(self.xla.to_cpu([loss_total])[0])
            last_step, last_value = self._logged
            mean = (value - last_value) / max(1, step - last_step)
            self._logged = (step, value)
            self.history.append((step, mean))
            emit(Progress(report_rank, step, plan.total_steps, {"loss": mean, "lr": lr},
                          step * plan.rows_per_step, "train"))

        fetcher = _Fetcher(log)

        # What of ours runs per step is kept to a few lines (bench figure 12): `report` is
        # called every BAR_INTERVAL seconds (its bar moves twice a second), at a new bucket
        # (its input shapes) and at the last step; a logging point's loss is fetched one step
        # later on the fetcher's thread (`log`), whose event moves the bar to that step.
        pending_log = None
        last_report, last_length = float("-inf"), None
        # Replicas all-reduce their gradients (xm.optimizer_step); one device has none to.
        replicas = not self.spmd and self.world > 1
        for step in range(start_step, plan.total_steps):
            epoch, k = divmod(step, plan.steps_per_epoch)
            if epoch not in schedules:
                schedules = {epoch: batching.epoch_schedule(data.train, plan.rows_per_step,
                                                     plan.seed, epoch)}
            bucket_index, positions = schedules[epoch][k]
            bucket = data.train.buckets[bucket_index]
            positions = positions[self.rank * per_rank:(self.rank + 1) * per_rank]
            packed = batching.train_batch(bucket, positions, micro)
            # One micro-batch: uploaded as [rows, columns], no slicing op traced per step.
            x = self.upload(packed[0] if micro == 1 else packed)
            step_loss = None
            for m in range(micro):
                loss = self.task.train_loss(self, x if micro == 1 else x[m], bucket.length)
                scaled = loss / micro if micro > 1 else loss  # fewer ops to trace per step
                scaled.backward()
                detached = scaled.detach()
                step_loss = detached if step_loss is None else step_loss + detached
            if clip is not None:
                clip()
            if replicas:
                self.xla.optimizer_step(self.optimizer)  # all-reduces the gradients first
            else:
                self.optimizer.step()
            lr = float(self.scheduler.get_last_lr()[0])  # the rate this step used (never 0)
            self.scheduler.step()
            for parameter in parameters:  # zero_grad(set_to_none=True), minus its wrapper
                parameter.grad = None
            self.loss_total = self.loss_total + step_loss
            if pending_log is not None:  # the previous logging point's: after this launch
                self.xla.add_step_closure(fetcher.submit, pending_log)
                pending_log = None
            self.xla.sync()
            done = step + 1
            logging_point = done % plan.log_every == 0 or done == plan.total_steps
            now = time.monotonic()
            if (done == plan.total_steps or now - last_report >= BAR_INTERVAL
                    or bucket.length != last_length):
                last_report, last_length = now, bucket.length
                report(step=done, total=plan.total_steps, samples=done * plan.rows_per_step,
                       inputs={"batch": x}, log_every=plan.log_every)
            if logging_point:
                pending_log = (done, self.loss_total, lr)
            if plan.save_steps and done % plan.save_steps == 0:
                fetcher.drain()  # the history as of the earlier logging points
                save_checkpoint(self, done)
            if done == start_step + STEADY_AFTER_STEPS and done < plan.total_steps:
                self.xla.wait_device_ops()  # so the warm-up's executions are counted before
                self._steady_since = time.perf_counter()
                steady = (self.counts(), self._steady_since, plan.total_steps - done)
        # The last step's loss: at the sync after the loop, after every earlier fetch.
        self.xla.add_step_closure(fetcher.close, (pending_log,))
        return steady

    def _parameter_sharding(self) -> dict[str, str]:
        """How the first few parameters are laid out over the devices (SPMD sharding specs)."""
        if not self.spmd:
            return {}
        named = list(self.base_model.named_parameters())[:3]
        return {name.replace("._orig_module", ""): self.xla.sharding_spec(parameter)
                or "{replicated}" for name, parameter in named}

    def _checkpoint_time_after(self, since: float) -> float:
        return sum(end - begin for begin, end, _ in self.checkpoint_marks if begin >= since)

    def _checkpoint_counts_after(self, name: str) -> int:
        since = self._steady_since
        return sum(delta.get(name, 0) for begin, _, delta in self.checkpoint_marks
                   if since is None or begin >= since)

    # -- checkpoints ---------------------------------------------------------------------------


class _Fetcher:
    """Runs the loop's loss fetches (`log`) one at a time on a thread of their own, in order.

    A fetch in a step closure would wait there for the execution the closure's sync just
    launched, and the next step could not be traced meanwhile. `drain` waits for the fetches
    queued so far (and raises what one raised); `close` drains, then runs the last fetch, if
    any, on the calling thread (after the final sync: nothing is left to overlap)."""

    def __init__(self, log) -> None:  # noqa: ANN001 - the loop's closure
        from concurrent.futures import ThreadPoolExecutor

        self.log = log
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hfxla_nb-fetch")
        self.pending: list = []

    def submit(self, step: int, loss_total, lr: float) -> None:  # noqa: ANN001 - a tensor
        self.pending.append(self.pool.submit(self.log, step, loss_total, lr))

    def drain(self) -> None:
        pending, self.pending = self.pending, []
        for future in pending:
            future.result()

    def close(self, last: tuple | None) -> None:
        try:
            self.drain()
        finally:
            self.pool.shutdown(wait=True)
        if last is not None:
            self.log(*last)
