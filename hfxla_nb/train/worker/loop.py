"""The worker side of `fine_tune`: the training loop, evaluation, checkpoints and saving.

Runs inside the worker that `notebook_launcher` forked (`train_worker(index, plan)`), never in
the notebook kernel. What happens per training step, and why:

- one packed int32 tensor (all inputs, labels) is uploaded, sharded over the "data" axis of
  the mesh at upload in SPMD mode;
- forward, backward (over `gradient_accumulation_steps` micro-batches), gradient clipping,
  AdamW (`foreach`), scheduler, and the running loss sum are traced into one graph, once per
  batch shape: every later step of the shape runs that compiled graph on its data
  (`captured.py`), asynchronously, one step in flight, so the host prepares the next batch
  while it executes, and ends with no sync (`_xla.end_step`); where a step cannot run so,
  each step is traced and one `torch_xla.sync()` runs it;
- nothing is read from the device except the running loss, once per logging interval, queued
  by a step closure (after the graph ran) and fetched by a thread of its own (`Fetcher`), so
  the loop goes on tracing; the panel's progress is sent with no device value.

The compile count stays fixed: one training graph per length bucket (the optimizer state is
made before step 1, so step 1 is already the steady graph) and one evaluation graph per bucket
(padded, weighted batches).
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import _xla, patches
from ...events import Progress, emit, worker_rank
from ...observe.reader import BAR_WARMUP_STEPS
from ...observe.reporting import BAR_INTERVAL, report
from .. import batching, lora
from ..config import EXECUTE
from ..plan import TrainPlan
from ..result import learning_warnings
from . import saving as ckpt
from . import warm
from .callbacks import TrainerRun
from .captured import Before, CapturedStep, TrainedState
from .context import HOST_CPU_NS, WorkerContext, counts
from .evaluate import EvalAhead, announce_bar, evaluate
from .optimizer import make_first_step_steady, make_optimizer
from .saving import save_checkpoint, save_final

if TYPE_CHECKING:
    import torch

    from .optimizer import GradientClipper


# -- the loss fetches, off the training thread --

class Fetcher:
    """Runs the loop's loss fetches (`log`) one at a time on a thread of their own, in order.

    A fetch in a step closure would wait there for the execution the closure's sync just
    launched, and the next step could not be traced meanwhile. `drain` waits for the fetches
    queued so far (and raises what one raised); `close` drains, then runs the last fetch, if
    any, on the calling thread (after the final sync: nothing is left to overlap).

    Args:
        log: called as `log(step, loss_total, lr)`: reads the running loss (a device tensor)
            and records it.
    """

    def __init__(self, log: Callable[[int, Any, float], None]) -> None:
        self.log = log
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hfxla_nb-fetch")
        self.pending: list[Future] = []

    def submit(self, step: int, loss_total: Any, lr: float) -> None:
        """Queues the fetch of logging point `step` (`loss_total`: the running loss tensor)."""
        self.pending.append(self.pool.submit(self.log, step, loss_total, lr))

    def drain(self) -> None:
        """Waits for the fetches queued so far; raises what one raised."""
        pending, self.pending = self.pending, []
        for future in pending:
            future.result()

    def close(self, last: tuple | None) -> None:
        """Drains, stops the thread, then runs the fetch `last` (`(step, loss_total, lr)`),
        if any, here."""
        try:
            self.drain()
        finally:
            self.pool.shutdown(wait=True)
        if last is not None:
            self.log(*last)


# -- the training loop --

__all__ = ["STEADY_AFTER_STEPS", "Fetcher", "TrainingLoop", "counts", "train_worker"]

#: Steps left out of the steady-state figures (samples/s, executions and transfers per step):
#: the first two compile, the third still waits for them. The bar's warm-up is the same one.
STEADY_AFTER_STEPS = BAR_WARMUP_STEPS

#: `(counts, time, steps left)` at the start of the steady part of the training.
Steady = tuple[dict[str, int], float, int]


#: The patches of transformers' sequence masking (`patches.py`): a model that reads no token
#: sequences (an image model) never calls them, so its result does not name them.
SEQUENCE_PATCHES = frozenset({"bidirectional_mask", "causal_mask", "packed_sequences"})


def train_worker(index: int, plan: TrainPlan) -> dict[str, Any]:
    """Runs in the launched worker: train, evaluate, save; returns `FineTuneResult` data."""
    if plan.strategy == "spmd" and not _xla.is_spmd():
        _xla.use_spmd()  # before any tensor touches the device
    with patches.applied() as applied:
        start_time = time.perf_counter()
        notes = list(plan.data.notes)
        ctx = WorkerContext.load(plan, train=True)
        noted = applied if ctx.task.reads_sequences else [
            name for name in applied if name not in SEQUENCE_PATCHES]
        if noted:
            notes.append("patched for XLA: " + ", ".join(noted) + " (see hfxla_nb.patches)")
        loop = TrainingLoop(ctx, notes + ctx.notes, start_time)
        result = loop.train_evaluate_save()
    # Warm between cells: the trained model stays on the devices for the session's next
    # jobs (`warm.py`). With `load_best_model_at_end` the devices hold the last step's
    # weights: the best evaluation's go back first, so that a warm predict predicts with
    # the result's model.
    result["warm"] = plan.keep_warm
    if result["warm"] and loop.best_model is not None:
        try:
            ckpt.restore_model_state(loop, loop.best_model)
        except Exception as error:  # noqa: BLE001 - the run and its saved model stand
            result["warm"] = False
            result["notes"].append(f"nothing stays warm: the best model could not be put back "
                                   f"on the devices ({type(error).__name__}: {error})")
    if result["warm"]:
        warm.hold(ctx)
    return result


class TrainingLoop:
    """One worker's training: the optimizer, scheduler, running loss, loss history and
    checkpoints of the run on `ctx`'s model.

    Attributes:
        ctx: the worker's context (plan, task, device, model).
        optimizer, scheduler: AdamW and its linear schedule (`optimizer.py`).
        loss_total: the running loss sum, on the device (read once per logging interval).
        history: `(step, mean loss since the previous logging point)` pairs.
        logged: `(step, running loss)` at the latest logging point read.
        checkpoints: the folders written so far.
        checkpoint_marks: `(begin, end, counter deltas)` of each checkpoint's writing, kept
            out of the throughput and per-step figures.
        notes: what the result says about the run.
    """

    def __init__(self, ctx: WorkerContext, notes: list[str], start_time: float) -> None:
        self.ctx = ctx
        self.plan = ctx.plan
        self.start_time = start_time
        self.notes = notes
        self.stop_reason: str | None = None  # why a callback stopped it early, if one did
        self.history: list[tuple[int, float]] = []
        self.checkpoints: list[str] = []
        self.checkpoint_marks: list[tuple[float, float, dict[str, int]]] = []
        # Evaluations during training, kept out of the training's figures as checkpoints are.
        self.eval_marks: list[tuple[float, float, dict[str, int]]] = []
        self.best_model: dict | None = None  # load_best_model_at_end: the best's host state
        self.end_step = ctx.plan.total_steps  # earlier when a callback stops the training
        self.logged: tuple[int, float] = (0, 0.0)
        self.steady_since: float | None = None
        self.optimizer, self.scheduler = make_optimizer(ctx.model, ctx.plan)
        self.loss_total: torch.Tensor | None = None
        self.eval_ahead: EvalAhead | None = None
        # Each batch shape's step run by its compiled graph, or None: traced (captured.py).
        self.captured: dict[tuple, CapturedStep | None] = {}
        # The trained parameters and their moments as the compiled steps leave them (set
        # by `train`).
        self.trained_state: TrainedState | None = None
        # A shape whose graph must be proven at a second trace (constants made while tracing,
        # a parameter without a gradient): its first trace's graph, compared with the second's
        # before its steps run by the graph.
        self.first_traces: dict[tuple, _xla.CompiledGraph] = {}
        # Why a shape's second trace differed from its first: what the model traces depends
        # on the host at each step, so no later shape's step is run by its graph either.
        self.unlike_traces: str | None = None
        # Each batch shape, as "<rows>x<padded length>" -> "replayed", or why its steps were
        # traced; the names of the shapes seen.
        self.compiled_steps: dict[str, str] = {}
        self.compiled_evaluation: dict[str, str] = {}  # `evaluate.BatchReplay.decisions`
        self.shape_names: dict[tuple, str] = {}
        # The constants' fetches: kept out of the per-step figures, as checkpoints are.
        self.check_marks: list[tuple[float, float, dict[str, int]]] = []
        self._schedules: dict[int, list] = {}
        self._report_rank = worker_rank()
        base_lrs = self.scheduler.base_lrs
        lambdas = self.scheduler.lr_lambdas
        self.run = TrainerRun(
            ctx.plan, {"model": ctx.base_model, "processing_class": ctx.plan.tokenizer,
                       "optimizer": self.optimizer, "lr_scheduler": self.scheduler},
            # The rate step `step` used: the scheduler's, computed as LambdaLR computes it.
            lambda step: base_lrs[0] * lambdas[0](step - 1), rank=ctx.rank)

    # -- the run -------------------------------------------------------------------------------

    def train_evaluate_save(self) -> dict[str, Any]:
        """The worker's whole job: train, evaluate, save; returns the result's fields."""
        plan, ctx = self.plan, self.ctx
        start_step = self.restore()
        counts_start = counts()
        # The evaluation's graphs compile beside the first step's (evaluate.py).
        self.eval_ahead = EvalAhead(ctx).start()
        train_start = time.perf_counter()
        steady = self.train(start_step)
        _xla.sync()  # runs the last step closures
        _xla.wait_device_ops()
        train_end = time.perf_counter()
        ahead_compiles = self.eval_ahead.finish()
        counts_end = counts()
        marks = self.checkpoint_marks + self.eval_marks
        train_seconds = (train_end - train_start - self._checkpoint_time_after(train_start)
                         - self._eval_time_after(train_start))
        during = sum(delta.get(_xla.COMPILE_TIME, 0) for _, _, delta in self.eval_marks)
        eval_seconds = sum(end - begin for begin, end, _ in self.eval_marks)
        metrics, eval_compiles = self.final_metrics(), ahead_compiles + during
        if metrics is None:  # as trainer.evaluate() after trainer.train()
            metrics = {}
            if plan.data.eval is not None:
                before = counts()
                eval_start = time.perf_counter()
                metrics = evaluate(ctx, self.eval_ahead, self.compiled_evaluation)
                eval_seconds += time.perf_counter() - eval_start
                eval_compiles += counts()[_xla.COMPILE_TIME] - before[_xla.COMPILE_TIME]
                self.run.evaluated(self.end_step, metrics, rank=False)
        trained = (self.end_step - start_step) * plan.rows_per_step
        result = {
            **self._described(),
            **self._steady_figures(steady, counts_end, train_end),
            "metrics": metrics,
            "loss_history": [list(pair) for pair in self.history],
            "log_history": list(self.run.state.log_history),
            "best_metric": self.run.state.best_metric,
            "best_step": self.run.state.best_global_step,
            "best_model_checkpoint": self.run.state.best_model_checkpoint,
            "stopped_early": self.run.stopped_early,
            "stop_reason": self.stop_reason,
            "kept_best": bool(plan.trainer.load_best_model_at_end and self.run.best is not None),
            "best_metric_name": plan.trainer.metric_for_best_model,
            "train_seconds": train_seconds,
            "eval_seconds": eval_seconds,
            # Training graphs only: gathering an FSDP checkpoint's shards compiles its own,
            # evaluations during training theirs.
            "compiles": counts_end[_xla.COMPILE_TIME] - counts_start[_xla.COMPILE_TIME]
            - sum(delta.get(_xla.COMPILE_TIME, 0) for _, _, delta in marks)
            - ahead_compiles,
            "eval_compiles": eval_compiles,
            "eval_compiled_ahead": ahead_compiles,
            # Before step 1: loading the model, AdamW's first state (make_first_step_steady);
            # counted so that the result and the XLA metrics add up.
            "setup_compiles": counts_start[_xla.COMPILE_TIME],
            "checkpoints": [path for path in self.checkpoints if os.path.isdir(path)],
            "notes": list(self.notes),
            "samples_per_second_overall": trained / max(train_seconds, 1e-9),
            "total_seconds": time.perf_counter() - self.start_time,
            "provenance": plan.provenance,  # the kernel's, for the model card
        }
        # The callbacks' state comes back to the notebook's objects (`flow.take_back`).
        result["callback_states"], sent_back = self.run.ended_states()
        result["notes"] += sent_back
        result["chance_accuracy"] = ctx.task.chance_accuracy(plan.data.eval)
        result["warnings"] = learning_warnings(self.history, metrics,
                                               result["chance_accuracy"])
        if plan.save and ctx.rank == 0:
            save_final(self, result, self.best_model)
        return result

    def final_metrics(self) -> dict[str, float] | None:
        """The result's metrics when no evaluation is needed after training: the best
        evaluation's (`load_best_model_at_end`), or the one at the last step; else None."""
        run = self.run
        if self.plan.trainer.load_best_model_at_end and run.best is not None:
            return dict(run.best[1])
        if run.evaluations and run.evaluations[-1][0] == self.end_step:
            return dict(run.evaluations[-1][1])
        return None

    def restore(self) -> int:
        """Seeds every generator, or restores them, the optimizer and the history from the
        checkpoint to resume from, and makes the first step's state; returns the step to
        start at."""
        import torch

        plan = self.plan
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
            self.run.restore(state.get("trainer"), self.history)
            random.setstate(state["python_rng"])
            np.random.set_state(state["numpy_rng"])
            torch.set_rng_state(state["torch_rng"])
            seed = int(state["xla_rng"])
        self.logged = (start_step, loss_total)
        # The running loss stays on the device; it is read once per logging interval.
        self.loss_total = torch.tensor(loss_total, dtype=torch.float32).to(self.ctx.device)
        make_first_step_steady(self.ctx, self.optimizer, self.loss_total)
        # After the sync above: each sync moves XLA's random seed on, so seeding before it
        # would give a resumed run other dropout masks than the uninterrupted one.
        _xla.set_rng_state(seed)
        return start_step

    # -- the loop ------------------------------------------------------------------------------

    def train(self, start_step: int) -> Steady | None:
        """The loop. Returns (counts, time, steps) of the steady part, or None if too short.

        What of ours runs per step is kept to a few lines (`bench/host_time.py` measures
        their host time): `report` is
        called every BAR_INTERVAL seconds (its bar moves twice a second), at a new bucket (its
        input shapes) and at the last step; a logging point's loss is fetched one step later
        on the fetcher's thread (`log`), whose event is marked late: it adds the loss, and never
        moves the bar back."""
        plan = self.plan
        parameters = [p for p in self.ctx.model.parameters() if p.requires_grad]
        from .optimizer import GradientClipper  # imports torch: only in the worker

        # torch_xla's clip_grad_norm_, same ops, less host work per step (optimizer.py).
        clip = (GradientClipper(parameters, plan.max_grad_norm)
                if plan.max_grad_norm is not None else None)
        steady = None
        run = self.run
        # The bar's clock starts here, with the loop (step 0: nothing done yet).
        emit(Progress(self._report_rank, start_step, plan.total_steps, {},
                      start_step * plan.rows_per_step, "train"))
        announce_bar(self.ctx)  # after the train bar: a rank's first bar is its main one
        fetcher = Fetcher(self.log)
        pending_log = None
        last_report, last_length = float("-inf"), None
        run.train_begin(start_step)
        train_start, loss_start = time.perf_counter(), self.logged[1]
        self.trained_state = state = TrainedState(parameters, self.optimizer)
        try:
            for step in range(start_step, plan.total_steps):
                run.step_begin()
                bucket, x, lr, replayed = self.step(step, parameters, clip)
                if pending_log is not None:  # the previous logging point's: after this launch
                    _xla.add_step_closure(fetcher.submit, pending_log)
                    pending_log = None
                if replayed:  # nothing traced: no sync's walk over the live tensors
                    _xla.end_step()
                    if run.callbacks:  # a callback may read the model or the optimizer
                        state.bind()
                else:
                    _xla.sync()
                done = step + 1
                control = run.step_end(done)
                stop = control.should_training_stop
                now = time.monotonic()
                if (stop or now - last_report >= BAR_INTERVAL or bucket.length != last_length):
                    last_report, last_length = now, bucket.length
                    report(step=done, total=plan.total_steps,
                           samples=done * plan.rows_per_step, inputs={"batch": x},
                           log_every=plan.log_every,
                           ended=run.stop_reason(done) if stop else None)
                logged_here = control.should_log or stop
                if logged_here:
                    pending_log = (done, self.loss_total, lr)
                pending_log = self.boundary(done, fetcher, pending_log)
                # The Trainer ends the epoch when it ends, or when the training stops inside it.
                if run.control.should_training_stop or done % plan.steps_per_epoch == 0:
                    run.epoch_end(done)
                    pending_log = self.boundary(done, fetcher, pending_log)
                    if not run.control.should_training_stop:
                        run.epoch_begin()
                if run.control.should_training_stop and not stop:  # a callback stopped it here
                    stop = True
                    report(step=done, total=plan.total_steps,
                           samples=done * plan.rows_per_step, inputs={"batch": x},
                           log_every=plan.log_every, ended=run.stop_reason(done))
                    if not logged_here:  # the loss since the last logging point
                        pending_log = (done, self.loss_total, lr)
                if done == start_step + STEADY_AFTER_STEPS and done < plan.total_steps:
                    _xla.wait_device_ops()  # so the warm-up's executions are counted before
                    self.steady_since = time.perf_counter()
                    steady = (counts(), self.steady_since, plan.total_steps - done)
                if stop:
                    break
        finally:  # the parameters and moments in place, whatever ends the loop
            state.bind()
        self.end_step = done = run.state.global_step
        if done < plan.total_steps:
            run.stopped_early = True
            self.stop_reason = run.stop_reason(done)
            if steady is not None:  # the steady figures cover the steps that ran
                steady = (steady[0], steady[1], steady[2] - (plan.total_steps - done))
        # The last step's loss: at the sync after the loop, after every earlier fetch.
        _xla.add_step_closure(fetcher.close, (pending_log,))
        _xla.sync()
        self.deliver()
        steps = max(done - start_step, 1)
        seconds = time.perf_counter() - train_start
        run.train_end({"train_runtime": seconds,
                       "train_samples_per_second": steps * plan.rows_per_step / seconds,
                       "train_steps_per_second": steps / seconds,
                       "train_loss": (self.logged[1] - loss_start) / steps})
        return steady

    def deliver(self) -> None:
        """The losses fetched so far into `log_history` and the callbacks' `on_log`."""
        if len(self.history) > self.run.delivered:
            self.run.deliver(self.history)

    def boundary(self, done: int, fetcher: Fetcher, pending_log: tuple | None
                 ) -> tuple | None:
        """What the control asks at the boundary after step `done`: an evaluation (the
        loss logged first, as the Trainer logs before it evaluates), a checkpoint. Returns
        the logging point still to fetch."""
        control, plan = self.run.control, self.plan
        if (control.should_evaluate and plan.data.eval is not None) or (
                control.should_save and plan.save):
            self.trained_state.bind()  # both read the parameters (saving, AdamW's state too)
        if control.should_evaluate and plan.data.eval is not None:
            if pending_log is not None:  # the evaluation waits for the device anyway
                fetcher.submit(*pending_log)
                pending_log = None
            fetcher.drain()
            self.deliver()
            self.evaluate_now(done)
        control.should_evaluate = False
        if control.should_save and plan.save:
            fetcher.drain()  # the history as of the earlier logging points
            save_checkpoint(self, done)
            self.rotate_checkpoints()
            self.run.saved(self.checkpoints[-1] if self.checkpoints else "")
        control.should_save = False
        self.deliver()
        return pending_log

    def evaluate_now(self, done: int) -> None:
        """Evaluate at step `done` with the graphs compiled ahead (no new graph), kept out of
        the training's figures; the metrics go to `log_history`, the callbacks, the panel and
        the trackers (a late value of the train bar: `eval_<name>`, TensorBoard's
        `eval/<name>`); a new best is fetched to the host for `load_best_model_at_end`."""
        ahead = self.eval_ahead
        if ahead is not None:
            ahead.finish()  # before the counts: its compilations are the training's window
        _xla.wait_device_ops()  # the step's own execution stays out of the evaluation's counts
        begin, before = time.perf_counter(), counts()
        metrics = evaluate(self.ctx, ahead, self.compiled_evaluation)
        if self.run.evaluated(done, metrics) and self.plan.trainer.load_best_model_at_end:
            self.best_model = ckpt.model_state(self)
        after = counts()
        self.eval_marks.append((begin, time.perf_counter(),
                                {k: after[k] - before[k] for k in after}))
        emit(Progress(self._report_rank, done, self.plan.total_steps,
                      {name: value for name, value in metrics.items()
                       if isinstance(value, (int, float))},
                      done * self.plan.rows_per_step, "train", late=True))

    def rotate_checkpoints(self) -> None:
        """`save_total_limit`: the newest checkpoints kept, and the best evaluation's."""
        limit = self.plan.trainer.save_total_limit
        if limit is None or self.ctx.rank != 0:
            return
        found = ckpt.list_checkpoints(self.plan.output_dir)
        best = self.run.state.best_global_step
        keep = {step for step, _ in found[-limit:]} | ({best} if best is not None else set())
        for step, folder in found:
            if step not in keep:
                shutil.rmtree(folder, ignore_errors=True)

    def batch(self, step: int) -> tuple[batching.Bucket, batching.HostBatch]:
        """Step `step`'s bucket and this replica's rows of it, packed
        (`[micro-batches, rows, columns]`; one micro-batch: `[rows, columns]`)."""
        plan = self.plan
        if isinstance(plan.data.train, batching.StreamedSplit):  # read on as steps need it
            bucket = plan.data.train.step_rows(step, plan.rows_per_step)
            positions = np.arange(plan.rows_per_step)
        else:
            epoch, k = divmod(step, plan.steps_per_epoch)
            if epoch not in self._schedules:
                self._schedules = {epoch: batching.epoch_schedule(plan.data.train,
                                                                  plan.rows_per_step,
                                                                  plan.seed, epoch)}
            bucket_index, positions = self._schedules[epoch][k]
            bucket = plan.data.train.buckets[bucket_index]
        per_rank = plan.rows_per_step // self.ctx.world
        rank = self.ctx.rank
        positions = positions[rank * per_rank:(rank + 1) * per_rank]
        transform = None
        if plan.augment:  # a pure function of (seed, step, rank): reruns see the same images
            rng = np.random.default_rng([plan.seed, step, rank])
            transform = lambda fields: self.ctx.task.augment(fields, rng)  # noqa: E731
        return bucket, batching.train_batch(bucket, positions, plan.gradient_accumulation_steps,
                                            transform)

    def step(self, step: int, parameters: list, clip: GradientClipper | None
             ) -> tuple[batching.Bucket, torch.Tensor, float, bool]:
        """Traces optimizer step `step` (forward, backward, clipping, AdamW, schedule, the
        running loss), not run yet, or runs it by its shape's compiled graph; returns its
        bucket, its batch, its learning rate and whether it ran by the graph (nothing traced)."""
        ctx = self.ctx
        micro = self.plan.gradient_accumulation_steps
        bucket, host = self.batch(step)
        # One micro-batch is uploaded as [rows, columns]: no slicing op traced per step.
        batch = ctx.upload(host)
        shape = tuple(tuple(tensor.shape) for tensor in batch.tensors)
        self.shape_names.setdefault(shape, f"{batch.tensors[0].shape[0]}x{bucket.length}")
        captured = self.captured.get(shape)
        if captured is not None:  # run by its compiled graph (captured.py)
            numbers = self.optimizer.count_step(captured.updated)
            lr = float(self.scheduler.get_last_lr()[0])
            self.scheduler.step()
            self.loss_total = captured.run(batch, numbers, self.loss_total)
            return bucket, batch.tensors[0], lr, True
        self.trained_state.bind()  # the trace reads the parameters and AdamW's state
        capture = shape not in self.captured
        if capture:
            declined = self._not_capturable()
            if declined is not None:
                self._decide(shape, None, declined)
                capture = False
        if capture:
            before = Before.take(parameters, self.optimizer, self.loss_total, batch)
            self.optimizer.new_values = {}
        step_loss = None
        for m in range(micro):
            loss = ctx.task.train_loss(ctx, batch if micro == 1 else batch.micro(m))
            scaled = loss / micro if micro > 1 else loss  # fewer ops to trace per step
            scaled.backward()
            detached = scaled.detach()
            step_loss = detached if step_loss is None else step_loss + detached
        if clip is not None:
            clip()
        if not ctx.spmd and ctx.world > 1:
            _xla.optimizer_step(self.optimizer)  # all-reduces the gradients first
        else:
            self.optimizer.step()  # one device, or SPMD: no replicas to all-reduce over
        lr = float(self.scheduler.get_last_lr()[0])  # the rate this step used (never 0)
        self.scheduler.step()
        for parameter in parameters:  # zero_grad(set_to_none=True), minus its wrapper
            parameter.grad = None
        self.loss_total = self.loss_total + step_loss
        if capture:
            self._capture(before, parameters, batch, shape)
        return bucket, batch.tensors[0], lr, False  # as uploaded: the panel reads its shape

    def _not_capturable(self) -> str | None:
        """Why no step may run by its compiled graph, or None: steps may when AdamW's own
        update is traced (not torch's step), nothing is all-reduced across processes
        (`optimizer_step`), and the model draws no LayerDrop coin on the host."""
        from .optimizer import AdamW

        if not self.plan.capture_steps:
            return "compiled_steps=False"
        if self.unlike_traces is not None:
            return f"another shape's steps: {self.unlike_traces}"
        if not isinstance(self.optimizer, AdamW):
            return "torch's own optimizer step"
        if not (self.ctx.spmd or self.ctx.world == 1):
            return "gradients all-reduced across processes (strategy='replicated')"
        config = getattr(self.ctx.base_model, "config", None)
        drawn = {name: value for name in ("layerdrop", "encoder_layerdrop", "decoder_layerdrop")
                 if isinstance(value := getattr(config, name, 0.0), (int, float)) and value > 0}
        if drawn:
            settings = ", ".join(f"{name}={value}" for name, value in drawn.items())
            return (f"LayerDrop ({settings}) drops layers by a coin drawn on the host at each "
                    "step: each draw is another graph")
        return None

    def _decide(self, shape: tuple, step: CapturedStep | None, declined: str | None) -> None:
        """Shape `shape`'s later steps run by `step`'s graph, or are traced (`declined`
        says why)."""
        self.captured[shape] = step
        self.compiled_steps[self.shape_names[shape]] = ("replayed" if declined is None
                                                   else f"traced: {declined}")

    def _capture(self, before: Before, trained: list, batch: Any, shape: tuple) -> None:
        """Compile the step just traced and run it by its graph; where it cannot be, the traced
        step is synced as always and its shape traced from now on. A graph with constants
        made while tracing runs its shape's later steps once a second trace gave the same."""
        import torch

        trained_ids = {id(p) for p in trained}
        model = self.ctx.model
        frozen = [t for t in (*model.parameters(), *model.buffers()) if id(t) not in trained_ids]
        names = {id(p): name for name, p in model.named_parameters()}
        config = getattr(self.ctx.base_model, "config", None)
        masks = any((getattr(config, name, 0) or 0) > 0
                    for name in ("mask_time_prob", "mask_feature_prob"))
        captured = CapturedStep.capture(before, self.trained_state, self.loss_total, frozen,
                                        names, masks)
        values, self.optimizer.new_values = self.optimizer.new_values or {}, None
        proving = not isinstance(captured, _xla.Declined) and bool(
            captured[0].graph.traced_constants or captured[0].unchanged)
        first_trace = proving and shape not in self.first_traces
        why = (captured.reason if isinstance(captured, _xla.Declined) else
               self._unlike_first(shape, captured[0]) if proving else None)
        if proving and why is not None and not first_trace:
            self.unlike_traces = why
        if why is not None:  # the update traced as `step` traces it, synced as always
            updated = [p for p in trained if id(p) in values]
            with torch.no_grad():
                torch._foreach_copy_(updated, [values[id(p)] for p in updated])
            self._decide(shape, None, why)
            return
        values.clear()  # the traced new values: never run
        step, inputs = captured
        self.loss_total = step.run(batch, self.optimizer.last_numbers, self.loss_total, inputs)
        if step.shardings(self.loss_total) != step.expected_shardings(before):
            # The next run would read inputs sharded otherwise than the program was compiled
            # for: this shape's later steps are traced (the sync compiles for them).
            self._decide(shape, None, "an output's sharding differs from its input's")
            return
        if not first_trace:  # a first trace with host constants is checked at its next step
            self._decide(shape, step, None)

    def _unlike_first(self, shape: tuple, step: CapturedStep) -> str | None:
        """How a shape's second trace differs from its first (another graph, or other values
        made on the host), read before the step runs; None when it is the same, or when
        this is the first trace (kept for the next)."""
        first = self.first_traces.setdefault(shape, step.graph)
        if first is step.graph:
            return None
        begin, counts_before = time.perf_counter(), counts()
        made = first.constants_unlike(step.graph)
        after = counts()
        self.check_marks.append((begin, time.perf_counter(),
                                 {k: after[k] - counts_before[k] for k in after}))
        if made is None:
            unused = (f"; {', '.join(step.unchanged[:3])} got no gradient at one of them"
                      if step.unchanged else "")
            return ("its second step traced another graph than its first (a Python branch "
                    f"on a value of the host{unused})")
        if made:
            return (f"a value made on the host while tracing ({', '.join(made)}) differs "
                    "between two steps: a host draw (SpecAugment's numpy mask, a random "
                    "number) or a number set at each step")
        return None

    def log(self, step: int, loss_total: torch.Tensor, lr: float) -> None:
        """Records logging point `step`: the mean loss since the previous one.

        The graph that computed `loss_total` ran while the next step was traced; the fetch
        (one transfer) still waits for the execution just launched (torch_xla's device lock),
        so it runs on the fetcher's thread, not the training loop's. Its event is marked
        `late`: it reaches the bar after the loop's reports of later steps, with a later time,
        and must not move the bar's step or clock (the loop's own reports do that)."""
        plan = self.plan
        value = float(_xla.to_cpu([loss_total])[0])
        last_step, last_value = self.logged
        mean = (value - last_value) / max(1, step - last_step)
        self.logged = (step, value)
        self.history.append((step, mean))
        emit(Progress(self._report_rank, step, plan.total_steps, {"loss": mean, "lr": lr},
                      step * plan.rows_per_step, "train", late=True))

    # -- the result ----------------------------------------------------------------------------

    def _steady_figures(self, steady: Steady | None, counts_end: dict[str, int],
                        train_end: float) -> dict[str, float | None]:
        """Throughput, executions and transfers per step over the steps after warm-up
        (checkpoint writing excluded); None when the run was too short to have any."""
        if steady is None:
            return {"samples_per_second": None, "executions_per_step": None,
                    "transfers_per_step": None, "uploads_per_step": None,
                    "host_ms_per_step": None}
        steady_counts, steady_time, steady_steps = steady
        elapsed = (train_end - steady_time - self._checkpoint_time_after(steady_time)
                   - self._eval_time_after(steady_time))
        delta = {k: counts_end[k] - steady_counts[k] - self._checkpoint_counts_after(k)
                 for k in counts_end}
        return {
            "samples_per_second": steady_steps * self.plan.rows_per_step / max(elapsed, 1e-9),
            "executions_per_step": sum(delta[k] for k in EXECUTE) / steady_steps,
            "transfers_per_step": delta[_xla.TRANSFER_FROM_DEVICE_TIME] / steady_steps,
            "uploads_per_step": delta[_xla.TRANSFER_TO_DEVICE_TIME] / steady_steps,
            "host_ms_per_step": delta[HOST_CPU_NS] / 1e6 / steady_steps,
        }

    def _described(self) -> dict[str, Any]:
        """What the run was: task, layout, sizes, where it saved."""
        plan, ctx = self.plan, self.ctx
        return {
            "output_dir": plan.output_dir if plan.save else None,
            "steps": self.end_step,
            "epochs": self.end_step / plan.steps_per_epoch,
            "label_names": list(plan.data.label_names),
            "task": plan.task,
            "sharding": plan.sharding,
            "gradient_checkpointing": plan.gradient_checkpointing,
            "parameter_sharding": self._parameter_sharding(),
            "strategy": plan.strategy,
            "devices": ctx.devices,
            "precision": ctx.precision,
            "bucket_lengths": list(plan.data.bucket_lengths),
            "batch_size": plan.batch_size,
            "resumed_from": plan.resume_from,
            "compiled_steps": {**dict.fromkeys(
                (self.shape_names[shape] for shape in self.first_traces
                 if shape not in self.captured),
                "run once by its compiled graph (a second step checks its constants)"),
                **self.compiled_steps},
            "compiled_evaluation": dict(self.compiled_evaluation),
            **lora.described(ctx.base_model, plan.lora),
        }

    def _parameter_sharding(self) -> dict[str, str]:
        """How the first few parameters are laid out over the devices (SPMD sharding specs)."""
        if not self.ctx.spmd:
            return {}
        named = list(self.ctx.base_model.named_parameters())[:3]
        return {name.replace("._orig_module", ""): _xla.sharding_spec(parameter)
                or "{replicated}" for name, parameter in named}

    def _checkpoint_time_after(self, since: float) -> float:
        return sum(end - begin for begin, end, _ in self.checkpoint_marks if begin >= since)

    def _eval_time_after(self, since: float) -> float:
        return sum(end - begin for begin, end, _ in self.eval_marks if begin >= since)

    def _checkpoint_counts_after(self, name: str) -> int:
        since = self.steady_since
        return sum(delta.get(name, 0) for begin, _, delta in self.checkpoint_marks
                   + self.eval_marks + self.check_marks if since is None or begin >= since)
