"""`TrainPlan`: everything decided in the kernel, handed to the forked worker (by memory)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .flow import TrainerSettings

if TYPE_CHECKING:
    from .batching import EncodedData
    from .memory import MemoryPlan


@dataclass
class TrainPlan:
    """What the worker does, for any task (`task`: a name in `tasks.TASKS`). Built by
    `prepare_fine_tune` (and by `predict.prepare_predict`, with no training); crosses the fork
    by memory."""

    model: Any  # a name/folder (str) or a model instance
    model_kwargs: dict[str, Any]
    tokenizer: Any
    data: EncodedData  # or a task's subclass of it
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
    fallback_dir: str | None = None  # where the final save goes when output_dir fails
    augment: bool = False  # the task's `augment` on each training batch (image classification)
    task: str = "classification"  # a registered task's name (`tasks.TASKS`)
    sharding: str = "data"  # or "fsdp": FSDPv2, parameters sharded over the devices
    gradient_checkpointing: bool = False
    # The LoRA settings of a task that has them (`lora.lora_settings`' JSON, peft `LoraConfig`
    # fields; None: a full fine-tune) and the `memory.MemoryPlan` the run was checked
    # with (a causal LM's decides `sharding="auto"` and `lora="auto"`; None when not planned).
    lora: dict[str, Any] | None = None
    memory: MemoryPlan | None = None
    # Base model, data, settings, hardware: plain data for the model card (`hub.py`).
    provenance: dict[str, Any] = field(default_factory=dict)
    # The transformers Auto class the worker loads a model name or folder with
    # (`Task.auto_class_for`); "" means the task's `auto_class`.
    auto_class: str = ""
    # The Trainer-named options: schedule, evaluation during training, best model, callbacks.
    trainer: TrainerSettings = field(default_factory=TrainerSettings)
    # The worker keeps the trained model on the devices for a warm session's next jobs
    # (`worker/warm.py`): `fine_tune` in a notebook kernel.
    keep_warm: bool = False
    # Each batch shape's step traced once, then run by its compiled graph
    # (`worker/captured.py`); False traces every step (a benchmark's baseline).
    capture_steps: bool = True

    @property
    def rows_per_step(self) -> int:
        return self.batch_size * self.gradient_accumulation_steps
