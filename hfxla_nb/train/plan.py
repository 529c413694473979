"""`TrainPlan`: everything decided in the kernel, handed to the forked worker (by memory)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    task: str = "classification"  # or "causal-lm" (tasks.py)
    sharding: str = "data"  # or "fsdp": FSDPv2, parameters sharded over the devices
    gradient_checkpointing: bool = False
    # A causal LM's: its LoRA settings (`lora.lora_settings`' JSON, peft `LoraConfig` fields;
    # None: a full fine-tune) and the `memory_plan.MemoryPlan` that `sharding="auto"` and
    # `lora="auto"` were decided from (None for the other tasks).
    lora: dict[str, Any] | None = None
    memory: Any = None

    @property
    def rows_per_step(self) -> int:
        return self.batch_size * self.gradient_accumulation_steps


def resolve_precision(requested: str, device_type: str | None) -> str:
    """The precision a run uses: "auto" is bfloat16 autocast on a TPU (its native fast
    type), float32 elsewhere (XLA on the CPU has no fast bfloat16)."""
    if requested != "auto":
        return requested
    return "bf16" if device_type == "TPU" else "fp32"
