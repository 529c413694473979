"""What the worker's tasks, evaluation, saving, LoRA and `predict` receive: `WorkerContext`, and
the `Batch` a task's hooks read.

`WorkerContext.load` builds it once per launched worker (training and `predict` alike): the
plan, the task, where the worker runs (device, mesh, rank), the model on the device, and the
few operations a task needs on a batch (`upload`, `logits`, `autocast`). `counts` reads what
the loop's and the checkpoints' figures are differences of (torch_xla's counters and the
thread's CPU).

A `Batch` is a set of named tensors on the device: the int32 `tokens` (model inputs side by
side, the label columns, and in evaluation a weight column), and fields of any dtype
(`pixel_values`, audio features) that the host packed into one buffer per dtype
(`batching.HostBatch`). Every array goes up in one host-to-device call, and a field is a slice
of its buffer, traced into the step's graph: a task that carries float32 pixel values compiles
the graphs a token-only task compiles. torch_xla counts that call as one transfer, except
under SPMD, where it transfers each array by itself: one more transfer per step for each dtype
the fields add.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ... import _xla
from .. import lora
from ..config import COUNTED, resolve_precision
from ..experts import use_dense_experts
from ..plan import TrainPlan
from ..tasks import TASKS

if TYPE_CHECKING:
    import torch

    from ..batching import EncodedData, EncodedSplit, FieldSlot, HostBatch


# -- what a run's figures are counted from --

#: What `counts` adds to torch_xla's counters: the calling thread's CPU, in nanoseconds.
HOST_CPU_NS = "host CPU ns"


def counts() -> dict[str, int]:
    """The figures a run's are made of: torch_xla's counters (`config.COUNTED`) and the
    calling thread's CPU time (`HOST_CPU_NS`), to take differences of."""
    return {**_xla.metric_counts(COUNTED), HOST_CPU_NS: time.thread_time_ns()}


# -- one batch on the device --

class Batch:
    """One batch on the device.

    Attributes:
        length: the bucket's padded length.
        tokens: `[rows, columns]` int32: the token inputs side by side (`inputs()` names
            them), then the label columns, then (evaluation) the weight column.
        tensors: every uploaded tensor (`tokens` first), as the graph takes them.
    """

    def __init__(self, length: int, tensors: Sequence[torch.Tensor],
                 slots: Sequence[FieldSlot], input_names: Sequence[str]) -> None:
        self.length = length
        self.tensors = list(tensors)
        self.tokens = self.tensors[0]
        self._slots = {slot.name: slot for slot in slots}
        self._input_names = list(input_names)

    def micro(self, index: int) -> Batch:
        """Micro-batch `index` of a batch uploaded as `[micro-batches, rows, columns]`."""
        return Batch(self.length, [tensor[index] for tensor in self.tensors],
                     list(self._slots.values()), self._input_names)

    def __getitem__(self, name: str) -> torch.Tensor:
        """The field `name`, `[rows, ...]` in the dtype the host gave it."""
        if name not in self._slots:
            raise KeyError(f"the batch has no field {name!r}; it has "
                           f"{', '.join(self._slots) or 'token columns only'}.")
        slot = self._slots[name]
        values = self.tensors[slot.buffer][..., slot.start:slot.stop]
        return values.reshape(*values.shape[:-1], *slot.shape)

    def __contains__(self, name: object) -> bool:
        return name in self._slots

    @property
    def weights(self) -> torch.Tensor:
        """`[rows]` int32: 1 for a real evaluation row, 0 for a filler row."""
        return self.tokens[:, -1]

    def inputs(self) -> dict[str, torch.Tensor]:
        """The model inputs by name (`plan.data.input_names`): fields as they are, token
        inputs as `[rows, length]` slices of `tokens`, in the order they were packed."""
        inputs = {}
        token_index = 0
        for name in self._input_names:
            if name in self._slots:
                inputs[name] = self[name]
                continue
            start = token_index * self.length
            inputs[name] = self.tokens[:, start:start + self.length]
            token_index += 1
        return inputs


# -- WorkerContext: what the worker's parts receive --

class WorkerTask(Protocol):
    """A task as the worker calls it: the worker-side hooks of `tasks.base.Task` (declared
    here, not imported: the tasks import this module for their hooks' `ctx`)."""

    name: str
    auto_class: str
    eval_ahead: bool
    reads_sequences: bool

    def train_loss(self, ctx: WorkerContext, batch: Batch) -> torch.Tensor: ...

    def eval_outputs(self, ctx: WorkerContext, batch: Batch) -> list[torch.Tensor]: ...

    def eval_metrics(self, ctx: WorkerContext, batches: list,
                     fetched: list) -> dict[str, float]: ...

    def decode(self, data: EncodedData, batches: list, fetched: list) -> list[Any]: ...

    def chance_accuracy(self, split: EncodedSplit | None) -> float | None: ...


class WorkerContext:
    """One worker's view of its run: where it runs, what it trains, how a batch goes in.

    Attributes:
        plan: the `TrainPlan` made in the kernel.
        task: the plan's `Task` (from `tasks.TASKS`).
        device: this worker's XLA device.
        spmd: whether one process drives every device (the batch sharded over `mesh`).
        mesh: the SPMD mesh, or None.
        axis: the mesh axis the batch's rows split over ("data", or "fsdp" under FSDPv2).
        rank: this replica's index (0 under SPMD).
        world: how many replicas share a step (1 under SPMD).
        devices: how many devices run the step.
        precision: "bf16" or "fp32", resolved for this device.
        base_model: the model as loaded (with its LoRA adapters): the one to save.
        model: the module to call (the FSDPv2 wrapper when sharded, else `base_model`).
        notes: what setting up the model wants the result to say.
    """

    def __init__(self, plan: TrainPlan, base_model: torch.nn.Module) -> None:
        self.plan = plan
        self.task: WorkerTask = TASKS[plan.task]
        self.device = _xla.device()
        self.spmd = plan.strategy == "spmd"
        self.rank = 0 if self.spmd else _xla.global_ordinal()
        self.world = 1 if self.spmd else _xla.world_size()
        self.devices = _xla.global_device_count() if self.spmd else self.world
        # FSDPv2 shards parameters over the axis that also splits the batch.
        self.axis = "fsdp" if plan.sharding == "fsdp" else "data"
        self.mesh = _xla.data_parallel_mesh(self.axis) if self.spmd else None
        self.precision = resolve_precision(plan.precision, _xla.device_type())
        self.base_model = base_model
        self.model = base_model
        self.notes: list[str] = []

    @classmethod
    def load(cls, plan: TrainPlan, *, train: bool) -> WorkerContext:
        """The context of this worker, its model loaded onto the device.

        Args:
            plan: the plan made in the kernel.
            train: True for `fine_tune` (LoRA adapters, FSDPv2 or layer checkpointing, rank
                0's weights on every replica); False for `predict` (the model as it is, its
                parameters replicated over the mesh).

        Raises:
            ValueError: the step's rows do not split over the replicas.
        """
        import torch

        world = 1 if plan.strategy == "spmd" else _xla.world_size()
        if plan.rows_per_step % world:
            raise ValueError(
                f"batch_size x gradient_accumulation_steps = {plan.rows_per_step} does not "
                f"split over the {world} replicas; use a multiple of {world}."
            )
        torch.manual_seed(plan.seed)  # the new head's initialization
        model = _loaded_model(plan)
        context = cls(plan, model)
        experts = use_dense_experts(model)  # MoE: static shapes (train/experts.py)
        if experts is not None:
            context.notes.append(experts)
        if train:
            context.base_model = lora.worker_model(model, plan, context.precision)
            context.base_model.to(context.device)
            context.model = context.shard(context.base_model)
            if not context.spmd and context.world > 1:
                # Replicas must start equal: rank threads share torch's random generator, so
                # a freshly initialized head can differ between them. Rank 0's weights win.
                _xla.broadcast_master_param(context.base_model)
            context.model.train()
        else:
            model.to(context.device)
            context.model = model
            if context.spmd:  # explicit shardings, as training gives them (the batch is sharded)
                _xla.replicate_unsharded(list(model.parameters()), context.mesh)
                _xla.sync()
        return context

    def with_plan(self, plan: TrainPlan) -> WorkerContext:
        """This worker's model, devices and precision, for another plan of the same model (a
        warm model's `predict`: its inputs, batch size and task)."""
        other = copy.copy(self)
        other.plan = plan
        other.task = TASKS[plan.task]
        other.notes = []
        return other

    def shard(self, model: torch.nn.Module) -> torch.nn.Module:
        """FSDPv2 (parameters sharded) or plain; torch_xla's checkpoint on each layer when
        asked. Returns the module to call."""
        plan = self.plan
        split = set(getattr(model, "_no_split_modules", None) or ())
        layers = {type(module) for module in model.modules() if type(module).__name__ in split}
        if plan.gradient_checkpointing:
            names = ", ".join(sorted(layer.__name__ for layer in layers)) or "none found"
            self.notes.append(f"gradient checkpointing with torch_xla's checkpoint on each "
                              f"layer ({names})")
        if plan.sharding == "fsdp":
            return _xla.fsdp_v2(model, self.mesh, layers, plan.gradient_checkpointing)
        if plan.gradient_checkpointing and layers:
            _xla.checkpoint_layers(model, layers)
        return model

    # -- the batches ---------------------------------------------------------------------------

    def upload(self, host: HostBatch) -> Batch:
        """A batch on the device, every buffer in one transfer; under SPMD, the rows split
        over the mesh's batch axis."""
        import torch

        tensors = [torch.from_numpy(np.ascontiguousarray(array))
                   for array in (host.tokens, *host.buffers)]
        if self.spmd:
            spec = (None,) * (tensors[0].dim() - 2) + (self.axis, None)
            uploaded = _xla.send_to_device(tensors, self.device, self.mesh, spec)
        else:
            uploaded = _xla.send_to_device(tensors, self.device)
        return Batch(host.length, uploaded, host.slots, self.plan.data.input_names)

    def autocast(self) -> AbstractContextManager:
        """bfloat16 autocast on XLA when the run's precision is "bf16"; else nothing."""
        import torch

        if self.precision == "bf16":
            return torch.autocast("xla", dtype=torch.bfloat16)
        return nullcontext()

    def logits(self, batch: Batch) -> torch.Tensor:
        """The model's float32 logits on the batch's inputs (under `autocast`)."""
        with self.autocast():
            output = self.model(**batch.inputs())
        return output.logits.float()

    def replicate(self, tensors: list[torch.Tensor]) -> None:
        """Under SPMD, marks `tensors` replicated over the mesh (gathered inside the graph:
        fetching sharded results would compile a gather per tensor); else does nothing."""
        if self.mesh is not None:
            for tensor in tensors:
                _xla.replicate(tensor, self.mesh)


def _loaded_model(plan: TrainPlan) -> torch.nn.Module:
    """The plan's model on the host: the instance given, or loaded by the task's Auto class."""
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # A LoRA run resumes from the plan's base; the checkpoint holds only the adapter.
    resume = None if plan.lora else plan.resume_from
    source = resume or plan.model
    if not isinstance(source, str):
        return source
    auto_class = getattr(transformers, plan.auto_class or TASKS[plan.task].auto_class)
    return auto_class.from_pretrained(source, **plan.model_kwargs)
