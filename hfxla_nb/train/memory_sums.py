"""The sums of a memory plan: bytes per device of the weights, gradients, optimizer state and
activations for one setting (docs/memory.md gives the formulas and what is verified where).
Pure functions of a model's `ModelFacts` and the `PlanSettings`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .lora_sizing import TargetModules, lora_parameter_count, targeted_layers
from .model_facts import ModelFacts

TRAINED_BYTES = {"weights": 4, "gradients": 4, "optimizer": 8}  # fp32 master, grad, AdamW m+v
FROZEN_BYTES = {"fp32": 4, "bf16": 2}
ACTIVATION_BYTES = {"fp32": 4, "bf16": 2}


@dataclass(frozen=True)
class PartSizes:
    """Bytes per device of each part of a plan, and the trainable parameters.

    Attributes:
        trainable: parameters the optimizer updates.
        weights, gradients, optimizer: the state per device (split over the devices with
            "fsdp").
        activations_full, activations_checkpointed: what the backward pass keeps, without and
            with gradient checkpointing.
    """

    trainable: int
    weights: int
    gradients: int
    optimizer: int
    activations_full: int
    activations_checkpointed: int


@dataclass(frozen=True)
class PlanSettings:
    """The settings a plan is summed for: `plan_memory`'s arguments once "auto" is decided.

    Attributes:
        batch_size, max_length: the global batch (split over `devices`) and tokens per row.
        precision: "fp32" or "bf16".
        lora_rank: the adapters' rank, or None for a full fine-tune.
        target_modules: the layers the adapters go on (peft's matching).
        sharding: "data" or "fsdp".
        gradient_checkpointing: whether activations are recomputed in the backward pass.
        devices: the XLA devices used.
        modules_to_save: what a LoRA config trains whole besides its adapters.
        lora_dropout: the adapters' dropout.
    """

    batch_size: int
    max_length: int
    precision: str
    lora_rank: int | None
    target_modules: TargetModules
    sharding: str
    gradient_checkpointing: bool
    devices: int
    modules_to_save: tuple[str, ...] = ()
    lora_dropout: float = 0.0


def part_sizes(facts: ModelFacts, settings: PlanSettings) -> PartSizes:
    """Bytes per device of each part (docs/memory.md: the formulas)."""
    if settings.lora_rank:
        trainable = lora_parameter_count(facts, settings.lora_rank, settings.target_modules,
                                         settings.modules_to_save)
        weights = (facts.parameters * FROZEN_BYTES[settings.precision]
                   + trainable * TRAINED_BYTES["weights"])
    else:
        trainable = facts.parameters
        weights = trainable * TRAINED_BYTES["weights"]  # autocast keeps fp32 master weights
    shards = settings.devices if settings.sharding == "fsdp" else 1
    full, checkpointed = activation_bytes(facts, settings)
    return PartSizes(
        trainable=trainable,
        weights=math.ceil(weights / shards),
        gradients=math.ceil(trainable * TRAINED_BYTES["gradients"] / shards),
        optimizer=math.ceil(trainable * TRAINED_BYTES["optimizer"] / shards),
        activations_full=full,
        activations_checkpointed=checkpointed,
    )


def activation_bytes(facts: ModelFacts, settings: PlanSettings) -> tuple[int, int]:
    """(without, with gradient checkpointing) bytes one device keeps for the backward pass.

    Per token and layer: the two norms' inputs and outputs (4 h), queries and attention output
    (2 x heads x head_dim), keys and values (2 x kv_heads x head_dim), the attention
    probabilities (heads x sequence length), and the MLP's intermediate values (3 x
    intermediate for a gated MLP: gate, up and their product, the down projection's input;
    2 x otherwise: the first projection's output and its activation). Checkpointing
    keeps only each layer's input (h) and recomputes one layer at a time. The language-model
    head adds its logits and their float32 copy for the loss. LoRA's adapters add what they
    keep (`adapter_activation_bytes`). Either way the backward pass holds, beside what was kept,
    the gradients of one layer's activations (as large as what the layer kept) and the
    float32 gradient of the logits while it works through them (docs/memory.md)."""
    tokens = math.ceil(settings.batch_size / settings.devices) * settings.max_length
    element = ACTIVATION_BYTES[settings.precision]
    per_layer = (4 * facts.hidden + 2 * facts.heads * facts.head_dim
                 + 2 * facts.kv_heads * facts.head_dim + facts.heads * settings.max_length
                 + (3 if facts.gated_mlp else 2) * facts.intermediate)
    logits = tokens * facts.vocab * (element + 4)
    adapters = tokens * adapter_activation_bytes(facts, settings)
    working = tokens * (per_layer * element + facts.vocab * 4)
    full = tokens * facts.layers * per_layer * element + adapters + logits + working
    checkpointed = (tokens * (facts.layers * facts.hidden + per_layer) * element
                    + adapters // max(facts.layers, 1) + logits + working)
    return full, checkpointed


def adapter_activation_bytes(facts: ModelFacts, settings: PlanSettings) -> int:
    """Bytes per token LoRA's adapters keep for the backward pass, over the whole model: each
    targeted layer's `x @ A` (rank values, for lora_B's gradient) and, with lora_dropout > 0,
    its own dropped-out copy of the layer's input and the dropout mask (torch_xla multiplies
    by a mask in the input's type), for lora_A's gradient; 0 for a full fine-tune."""
    if not settings.lora_rank:
        return 0
    element = ACTIVATION_BYTES[settings.precision]
    targeted = targeted_layers(facts, settings.target_modules)
    kept = settings.lora_rank * len(targeted) * element
    if settings.lora_dropout:
        kept += sum(fan_in for _, fan_in, _ in targeted) * 2 * element
    return kept
