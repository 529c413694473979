"""`hx.plan_memory`: what a fine-tune needs per device, against what the device has, before any
fork.

```python
plan = hx.plan_memory("google/gemma-2b", batch_size=8, max_length=1024, hardware="v5e-1")
plan.fits, plan.total_gib, plan.changes     # the changes that would make it fit, cheapest first
plan.check()                                # raises MemoryPlanError with the numbers when not
```

Parameters are counted exactly on a model built on the `meta` device (no memory); LoRA's
adapters by walking its linear layers as peft's `target_modules="all-linear"` does. Activations
are an estimate (docs/memory.md gives the formulas and what is verified where). torch and
transformers are imported inside the functions that need them: `import hfxla_nb` stays cheap.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..runtime.hardware import TPU_GENERATIONS, cpu_device_count, detect_accelerator
from .config import FineTuneError
from .plan import resolve_precision

#: `lora=True`: peft's own defaults except these (optimum-tpu's notebooks target all linear
#: layers too); the rank comes from `default_lora_rank`.
LORA_DEFAULTS = {"target_modules": "all-linear", "lora_dropout": 0.05, "bias": "none"}

GIB = 2**30
# What a TPU device's runtime keeps for itself: "reserved 530.00M" in XLA's own HBM reports
# (pytorch/xla #1735, LargeWorldModel/LWM #60; tests/data/hbm).
TPU_RESERVED_BYTES = 530 * 2**20
# Hosts by their usual names: (generation, chips). v2-8, v3-8 and v4-8 count TensorCores.
HOSTS = {
    "v2-8": ("v2", 4),
    "v3-8": ("v3", 4),
    "v4-8": ("v4", 4),
    "v5e-1": ("v5e", 1),
    "v5e-4": ("v5e", 4),
    "v5e-8": ("v5e", 8),
    "v6e-1": ("v6e", 1),
    "v6e-8": ("v6e", 8),
}
TRAINED_BYTES = {"weights": 4, "gradients": 4, "optimizer": 8}  # fp32 master, grad, AdamW m+v
FROZEN_BYTES = {"fp32": 4, "bf16": 2}
ACTIVATION_BYTES = {"fp32": 4, "bf16": 2}
SEQUENCE_CLASSIFIER_HEADS = ("classifier", "score")  # what peft leaves out for SEQ_CLS


class MemoryPlanError(FineTuneError):
    """A fine-tune that cannot fit the device's memory; the message has the numbers and the
    changes that would make it fit, cheapest first."""


@dataclass(frozen=True)
class MemoryChange:
    """One change to a plan that does not fit, applied on top of the changes before it.

    Attributes:
        change: what changes, for people ("LoRA r=16 on all linear layers").
        argument: how to ask for it ("lora=True").
        total_gib: GiB per device once it and the changes before it are made.
        fits: whether that total fits the device.
    """

    change: str
    argument: str
    total_gib: float
    fits: bool


@dataclass(frozen=True)
class MemoryPlan:
    """What a fine-tune needs per device, in GiB, against what one device has (plain data).

    Attributes:
        model: the model's name (or type).
        hardware: where it would run ("v5e-1", "TPU v5e x 4 chips", "CPU").
        devices: XLA devices the batch (and with "fsdp" the state) is split over.
        device_memory_gib: memory one device can use: its HBM less what the TPU runtime
            reserves, or on the CPU the host memory over the virtual devices.
        batch_size, max_length: the global batch (split over the devices) and tokens per row.
        precision: "fp32" or "bf16" (bfloat16 autocast; a LoRA's frozen base stored in it).
        lora_rank: the adapters' rank, or None for a full fine-tune.
        sharding: "data" (state replicated on every device) or "fsdp" (split over them).
        gradient_checkpointing: whether activations are recomputed in the backward pass.
        parameters, trainable_parameters: counts, exact.
        parameters_gib, gradients_gib, optimizer_gib: state per device (AdamW: 2 fp32 states
            per trainable parameter).
        activations_gib: what the chosen setting keeps for the backward pass (estimate), with
            `activations_full_gib` and `activations_checkpointed_gib` for both settings.
        total_gib: the sum per device; `fits` when it is at most `device_memory_gib`.
        changes: when it does not fit, the changes that would make it fit, cheapest first.
        notes: what "auto" settings chose and why.
    """

    model: str
    hardware: str
    devices: int
    device_memory_gib: float
    batch_size: int
    max_length: int
    precision: str
    lora_rank: int | None
    sharding: str
    gradient_checkpointing: bool
    parameters: int
    trainable_parameters: int
    parameters_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    activations_full_gib: float
    activations_checkpointed_gib: float
    total_gib: float
    fits: bool
    changes: tuple[MemoryChange, ...] = ()
    notes: tuple[str, ...] = ()

    def check(self) -> MemoryPlan:
        """This plan when it fits; otherwise raises `MemoryPlanError` with the numbers and the
        changes that would make it fit."""
        if not self.fits:
            raise MemoryPlanError(f"this fine-tune does not fit: {self}")
        return self

    def __str__(self) -> str:
        settings = [f"batch {self.batch_size} x {self.max_length} tokens", self.precision,
                    f"LoRA r={self.lora_rank}" if self.lora_rank else "full fine-tune",
                    f"{self.sharding} sharding",
                    "gradient checkpointing" if self.gradient_checkpointing
                    else "no gradient checkpointing"]
        verdict = "fits" if self.fits else "does not fit"
        lines = [
            f"{self.model} on {self.hardware} ({self.devices} device"
            f"{'s' if self.devices != 1 else ''}, {self.device_memory_gib:.2f} GiB each): "
            f"{self.total_gib:.2f} GiB per device, {verdict}",
            "  " + ", ".join(settings),
            f"  {'parameters':<18}{_count(self.parameters):>8}  {self.parameters_gib:8.2f} GiB",
            f"  {'trainable':<18}{_count(self.trainable_parameters):>8}",
            f"  {'gradients':<18}{'':>8}  {self.gradients_gib:8.2f} GiB",
            f"  {'optimizer state':<18}{'AdamW':>8}  {self.optimizer_gib:8.2f} GiB",
            f"  {'activations':<18}{'':>8}  {self.activations_gib:8.2f} GiB  (estimate; "
            f"{self.activations_full_gib:.2f} without, {self.activations_checkpointed_gib:.2f}"
            " with gradient checkpointing)",
            f"  {'total per device':<18}{'':>8}  {self.total_gib:8.2f} GiB  of "
            f"{self.device_memory_gib:.2f}",
        ]
        lines += [f"  note: {note}" for note in self.notes]
        if self.changes:
            lines.append("What would make it fit, cheapest first (each on top of the ones "
                         "before):")
            lines += [f"  {number}. {change.change} ({change.argument}): "
                      f"{change.total_gib:.2f} GiB per device"
                      f"{', fits' if change.fits else ''}"
                      for number, change in enumerate(self.changes, start=1)]
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's plain-text display: the table (no IPython import needed)."""
        printer.text(str(self))


# ---------------------------------------------------------------------------------------------
# The model: exact counts from a meta-device build
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ModelFacts:
    name: str
    parameters: int
    linear_layers: tuple[tuple[str, int, int], ...]  # (name, in, out) LoRA may target
    head_parameters: int  # a classifier head peft trains whole (modules_to_save)
    own_parameters: tuple[tuple[str, int], ...]  # (module name, its own parameters), for
    # the modules a LoRA config's modules_to_save trains whole
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int  # 0 for models without a language-model head
    gated_mlp: bool


def load_model_config(model: Any) -> Any:
    """The transformers config of `model`: a config, a model name or folder (through
    `AutoConfig.from_pretrained`, the real loading path), or a model instance's `.config`."""
    if isinstance(model, (str, os.PathLike)):
        from transformers import AutoConfig

        source = os.path.expanduser(os.fspath(model))
        try:
            return AutoConfig.from_pretrained(source)
        except Exception as error:  # noqa: BLE001 - say what to do, whatever failed
            raise FineTuneError(
                f"plan_memory could not load the config of {source!r}: {error}. Pass a folder "
                "with a config.json, a transformers config, or a model instance.") from None
    config = getattr(model, "config", model)
    if not hasattr(config, "to_dict") or not hasattr(config, "model_type"):
        raise FineTuneError(
            f"plan_memory needs a transformers model, config, name or folder; got "
            f"{type(model).__name__}. A plain nn.Module has no config to estimate activations "
            "from: pass its transformers config instead.")
    return config


def meta_model(config: Any) -> Any:
    """The model a config describes, built on the `meta` device: exact shapes, no memory."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM

    with torch.device("meta"):
        try:
            return AutoModelForCausalLM.from_config(config)
        except ValueError:  # no causal-LM class for this architecture (BERT-style encoders)
            return AutoModel.from_config(config)


def meta_classifier(config: Any, num_labels: int) -> Any:
    """The sequence classifier a config describes with a head for `num_labels` labels, built
    on the `meta` device (what `fine_tune` loads for task="classification")."""
    import copy

    import torch
    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(config)
    config.num_labels = int(num_labels)
    with torch.device("meta"):
        return AutoModelForSequenceClassification.from_config(config)


def _model_facts(model: Any, config: Any) -> _ModelFacts:
    import torch

    module = model if isinstance(model, torch.nn.Module) else meta_model(config)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(text_config.hidden_size)
    heads = int(text_config.num_attention_heads)
    head_dim = int(getattr(text_config, "head_dim", None) or hidden // heads)
    output = module.get_output_embeddings() if hasattr(module, "get_output_embeddings") else None
    excluded, head_parameters = _excluded_heads(module, output)
    names = [name for name, _ in module.named_modules()]
    return _ModelFacts(
        name=_model_name(config),
        parameters=sum(parameter.numel() for parameter in module.parameters()),
        linear_layers=tuple(layer for layer in _linear_layers(module) if layer[0] not in excluded),
        head_parameters=head_parameters,
        own_parameters=tuple(
            (name, count) for name, child in module.named_modules()
            if (count := sum(p.numel() for p in child.parameters(recurse=False)))),
        hidden=hidden,
        layers=int(text_config.num_hidden_layers),
        intermediate=int(getattr(text_config, "intermediate_size", None) or 4 * hidden),
        heads=heads,
        kv_heads=int(getattr(text_config, "num_key_value_heads", None) or heads),
        head_dim=head_dim,
        vocab=int(text_config.vocab_size) if output is not None else 0,
        gated_mlp=any(name.endswith(("gate_proj", "gate_up_proj")) for name in names),
    )


def _model_name(config: Any) -> str:
    path = getattr(config, "name_or_path", "") or ""
    return os.path.basename(path.rstrip("/")) or config.__class__.__name__.removesuffix("Config")


def _linear_layers(module: Any) -> list[tuple[str, int, int]]:
    """(name, in, out) of every nn.Linear and transformers Conv1D: what "all-linear" targets."""
    import torch

    layers = []
    for name, child in module.named_modules():
        if isinstance(child, torch.nn.Linear):
            layers.append((name, child.in_features, child.out_features))
        elif type(child).__name__ == "Conv1D" and hasattr(child, "weight"):
            fan_in, fan_out = child.weight.shape  # GPT-2's Conv1D stores (in, out)
            layers.append((name, int(fan_in), int(fan_out)))
    return layers


def _excluded_heads(module: Any, output: Any) -> tuple[set[str], int]:
    """What peft's "all-linear" leaves out: the output embeddings (a language-model head), or
    else a sequence classifier's head, which peft trains whole instead."""
    if output is not None:
        return {name for name, child in module.named_modules() if child is output}, 0
    for head_name in SEQUENCE_CLASSIFIER_HEADS:
        head = getattr(module, head_name, None)
        if head is not None:
            names = {name for name, child in module.named_modules() if child is head}
            names |= {f"{prefix}.{sub}" for prefix in names
                      for sub, _ in head.named_modules() if sub}
            return names, sum(parameter.numel() for parameter in head.parameters())
    return set(), 0


def default_lora_rank(config: Any) -> int:
    """The LoRA rank `lora=True` uses: 16 for models with a hidden size of 2048 or more (the 1B
    to 7B LLMs people fine-tune on one chip), 8 below (BERT-sized and tiny models, where 8 is
    peft's own default). Both train well under 1% of a model's parameters."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return 16 if int(text_config.hidden_size) >= 2048 else 8


def lora_parameter_count(facts: _ModelFacts, rank: int, target_modules: Any = "all-linear",
                         modules_to_save: Any = ()) -> int:
    """Adapter parameters: rank x (in + out) per targeted linear layer (peft's lora_A and
    lora_B, no bias), plus what peft trains whole: a classifier head and the modules named
    in `modules_to_save` (matched as peft does: the name or its last parts)."""
    targeted = [layer for layer in facts.linear_layers if _targets(layer[0], target_modules)]
    if not targeted:
        raise FineTuneError(
            f"LoRA target_modules={target_modules!r} match no linear layer of {facts.name}. "
            "Pass target_modules='all-linear', or names of its linear layers such as "
            f"{sorted({name.rsplit('.', 1)[-1] for name, _, _ in facts.linear_layers})[:6]}.")
    saved = {modules_to_save} if isinstance(modules_to_save, str) else set(modules_to_save or ())
    if not saved:
        whole = facts.head_parameters
    else:  # the head and the named modules, each counted once
        saved |= set(SEQUENCE_CLASSIFIER_HEADS) if facts.head_parameters else set()
        whole = sum(count for name, count in facts.own_parameters if _under(name, saved))
    return rank * sum(fan_in + fan_out for _, fan_in, fan_out in targeted) + whole


def _under(name: str, modules: set[str]) -> bool:
    """Whether module `name` is, or is inside, a module named by one of `modules`."""
    parts = name.split(".")
    prefixes = [".".join(parts[:end]) for end in range(1, len(parts) + 1)]
    return any(prefix == key or prefix.endswith("." + key)
               for prefix in prefixes for key in modules)


def _targets(name: str, target_modules: Any) -> bool:
    """peft's matching: "all-linear"; a string is a regular expression over the whole name; a
    list matches a name equal to an entry or ending in "." + entry."""
    if isinstance(target_modules, str):
        if target_modules.lower() == "all-linear":
            return True
        return re.fullmatch(target_modules, name) is not None
    return any(name == target or name.endswith("." + target) for target in target_modules)


# ---------------------------------------------------------------------------------------------
# The device
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Device:
    name: str
    kind: str  # "tpu" or "cpu"
    devices: int  # all the host has
    usable_bytes: int  # per device


def _device(hardware: str | None, environ: Mapping[str, str] | None = None) -> _Device:
    environ = os.environ if environ is None else environ
    if hardware is None:
        accelerator = detect_accelerator(environ=environ)
        if accelerator.kind == "tpu" and accelerator.generation in _GENERATIONS:
            return _tpu(accelerator.generation, accelerator.chips,
                        f"TPU {accelerator.generation} x {accelerator.chips}")
        hardware = "cpu"
    key = hardware.strip().lower()
    if key in HOSTS:
        generation, chips = HOSTS[key]
        return _tpu(generation, chips, key)
    if key == "cpu":
        devices = cpu_device_count(environ) or 1
        return _Device("CPU", "cpu", devices, _host_memory() // devices)
    raise FineTuneError(f"hardware={hardware!r} is not one plan_memory knows: pass one of "
                        f"{sorted(HOSTS)}, 'cpu', or None (this machine).")


_GENERATIONS = {generation.name: generation for generation in TPU_GENERATIONS}


def _tpu(generation_name: str, chips: int, name: str) -> _Device:
    generation = _GENERATIONS[generation_name]
    per_device = round(generation.hbm_per_device_gib * GIB) - TPU_RESERVED_BYTES
    return _Device(name, "tpu", chips * generation.cores_per_chip, per_device)


def _host_memory() -> int:
    """The host's memory: a CPU's virtual XLA devices share it."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# ---------------------------------------------------------------------------------------------
# The sums
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Settings:
    batch_size: int
    max_length: int
    precision: str
    lora_rank: int | None
    target_modules: Any
    sharding: str
    gradient_checkpointing: bool
    devices: int
    modules_to_save: tuple[str, ...] = ()
    lora_dropout: float = 0.0


def _sizes(facts: _ModelFacts, settings: _Settings) -> dict[str, int]:
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
    full, checkpointed = _activations(facts, settings)
    return {
        "trainable": trainable,
        "weights": math.ceil(weights / shards),
        "gradients": math.ceil(trainable * TRAINED_BYTES["gradients"] / shards),
        "optimizer": math.ceil(trainable * TRAINED_BYTES["optimizer"] / shards),
        "activations_full": full,
        "activations_checkpointed": checkpointed,
    }


def _activations(facts: _ModelFacts, settings: _Settings) -> tuple[int, int]:
    """(without, with gradient checkpointing) bytes one device keeps for the backward pass.

    Per token and layer: the two norms' inputs and outputs (4 h), queries and attention output
    (2 x heads x head_dim), keys and values (2 x kv_heads x head_dim), the attention
    probabilities (heads x sequence length), and the MLP's intermediate values (3 x
    intermediate for a gated MLP: gate, up and their product, the down projection's input;
    2 x otherwise: the first projection's output and its activation). Checkpointing
    keeps only each layer's input (h) and recomputes one layer at a time. The language-model
    head adds its logits and their float32 copy for the loss. LoRA's adapters add what they
    keep (`_adapter_activations`). Either way the backward pass holds, beside what was kept,
    the gradients of one layer's activations (as large as what the layer kept) and the
    float32 gradient of the logits while it works through them (docs/memory.md)."""
    tokens = math.ceil(settings.batch_size / settings.devices) * settings.max_length
    element = ACTIVATION_BYTES[settings.precision]
    per_layer = (4 * facts.hidden + 2 * facts.heads * facts.head_dim
                 + 2 * facts.kv_heads * facts.head_dim + facts.heads * settings.max_length
                 + (3 if facts.gated_mlp else 2) * facts.intermediate)
    logits = tokens * facts.vocab * (element + 4)
    adapters = tokens * _adapter_activations(facts, settings)
    working = tokens * (per_layer * element + facts.vocab * 4)
    full = tokens * facts.layers * per_layer * element + adapters + logits + working
    checkpointed = (tokens * (facts.layers * facts.hidden + per_layer) * element
                    + adapters // max(facts.layers, 1) + logits + working)
    return full, checkpointed


def _adapter_activations(facts: _ModelFacts, settings: _Settings) -> int:
    """Bytes per token LoRA's adapters keep for the backward pass, over the whole model: each
    targeted layer's `x @ A` (rank values, for lora_B's gradient) and, with lora_dropout > 0,
    its own dropped-out copy of the layer's input and the dropout mask (torch_xla multiplies
    by a mask in the input's type), for lora_A's gradient; 0 for a full fine-tune."""
    if not settings.lora_rank:
        return 0
    element = ACTIVATION_BYTES[settings.precision]
    targeted = [layer for layer in facts.linear_layers
                if _targets(layer[0], settings.target_modules)]
    kept = settings.lora_rank * len(targeted) * element
    if settings.lora_dropout:
        kept += sum(fan_in for _, fan_in, _ in targeted) * 2 * element
    return kept


def _plan(facts: _ModelFacts, settings: _Settings, device: _Device,
          notes: tuple[str, ...] = ()) -> MemoryPlan:
    sizes = _sizes(facts, settings)
    activations = sizes["activations_checkpointed" if settings.gradient_checkpointing
                         else "activations_full"]
    total = sizes["weights"] + sizes["gradients"] + sizes["optimizer"] + activations
    return MemoryPlan(
        model=facts.name, hardware=device.name, devices=settings.devices,
        device_memory_gib=device.usable_bytes / GIB,
        batch_size=settings.batch_size, max_length=settings.max_length,
        precision=settings.precision, lora_rank=settings.lora_rank, sharding=settings.sharding,
        gradient_checkpointing=settings.gradient_checkpointing,
        parameters=facts.parameters, trainable_parameters=sizes["trainable"],
        parameters_gib=sizes["weights"] / GIB, gradients_gib=sizes["gradients"] / GIB,
        optimizer_gib=sizes["optimizer"] / GIB, activations_gib=activations / GIB,
        activations_full_gib=sizes["activations_full"] / GIB,
        activations_checkpointed_gib=sizes["activations_checkpointed"] / GIB,
        total_gib=total / GIB, fits=total <= device.usable_bytes, notes=notes,
    )


def _changes(facts: _ModelFacts, settings: _Settings, device: _Device,
             default_rank: int) -> tuple[MemoryChange, ...]:
    """The changes that make a plan fit, cheapest first, each on top of the ones before; it
    stops at the first that fits (or after a batch of one row per device)."""
    steps = []
    if not settings.lora_rank:
        steps.append((f"LoRA r={default_rank} on all linear layers", "lora=True",
                      {"lora_rank": default_rank, "target_modules": "all-linear"}))
    if settings.precision != "bf16":
        steps.append(("bfloat16", "precision='bf16'", {"precision": "bf16"}))
    if not settings.gradient_checkpointing:
        steps.append(("gradient checkpointing", "gradient_checkpointing=True",
                      {"gradient_checkpointing": True}))
    changes: list[MemoryChange] = []
    for change, argument, fields in steps:
        settings = dataclasses.replace(settings, **fields)
        changes.append(_change(facts, settings, device, change, argument))
        if changes[-1].fits:
            return tuple(changes)
    settings, sharded = _shard(facts, settings, device)
    if sharded is not None:
        changes.append(sharded)
        if sharded.fits:
            return tuple(changes)
    smaller = _smaller_batch(facts, settings, device)
    if smaller is not None:
        changes.append(smaller)
    return tuple(changes)


def _change(facts: _ModelFacts, settings: _Settings, device: _Device, change: str,
            argument: str) -> MemoryChange:
    plan = _plan(facts, settings, device)
    return MemoryChange(change, argument, round(plan.total_gib, 2), plan.fits)


def _shard(facts: _ModelFacts, settings: _Settings, device: _Device
           ) -> tuple[_Settings, MemoryChange | None]:
    """FSDP over this host's devices; on a one-chip TPU host, over the 8 chips of the same
    kind's 8-chip host (v5e-1 -> v5e-8), the cheapest step up."""
    if device.devices > 1:
        count, where = device.devices, "this host's"
    elif device.kind == "tpu":
        generation = HOSTS.get(device.name, (None,))[0]
        bigger = [name for name, (kind, chips) in HOSTS.items()
                  if kind == generation and chips == 8]
        count, where = 8, (f"a {bigger[0]}" if bigger else "an 8-chip host")
    else:
        return settings, None
    if settings.sharding == "fsdp" and settings.devices >= count:
        return settings, None
    sharded = dataclasses.replace(settings, sharding="fsdp", devices=count)
    return sharded, _change(facts, sharded, device, f"FSDP over {count} devices ({where})",
                            "sharding='fsdp'")


def _smaller_batch(facts: _ModelFacts, settings: _Settings, device: _Device
                   ) -> MemoryChange | None:
    """The largest batch (halving, at least one row per device) that fits, else one row per
    device."""
    batch = settings.batch_size
    while batch > settings.devices:
        batch = max(batch // 2, settings.devices)
        smaller = dataclasses.replace(settings, batch_size=batch)
        if _plan(facts, smaller, device).fits or batch == settings.devices:
            steps = math.ceil(settings.batch_size / batch)
            return _change(facts, smaller, device, f"batch_size={batch}",
                           f"batch_size={batch}, gradient_accumulation_steps={steps}")
    return None


# ---------------------------------------------------------------------------------------------
# The entry
# ---------------------------------------------------------------------------------------------


def plan_memory(
    model: Any,
    *,
    batch_size: int = 8,
    max_length: int = 1024,
    precision: str = "auto",
    lora: Any = False,
    sharding: str = "data",
    gradient_checkpointing: bool = False,
    devices: int | None = None,
    hardware: str | None = None,
) -> MemoryPlan:
    """What fine-tuning `model` needs per device, against one device's memory, without training
    or loading any weights.

    Args:
        model: a transformers config, a model name or folder (its config is read with
            `AutoConfig.from_pretrained`), or a transformers model instance.
        batch_size: rows per step over all devices (split over them), as in `fine_tune`.
        max_length: tokens per row.
        precision: "auto" (bfloat16 on a TPU, float32 elsewhere), "bf16" or "fp32". bfloat16
            is autocast: trained weights keep float32 masters, activations and a LoRA's frozen
            base take 2 bytes.
        lora: False (full fine-tune), True (rank from `default_lora_rank`, all linear layers),
            "auto" (LoRA only when the full fine-tune does not fit), or a `peft.LoraConfig` or
            dict with `r` and `target_modules`.
        sharding: "data" (every device holds the whole state), "fsdp" (state split over the
            devices) or "auto" ("fsdp" only when "data" does not fit and there are devices to
            split over).
        gradient_checkpointing: recompute activations in the backward pass.
        devices: XLA devices to use; default all of `hardware`'s.
        hardware: "v5e-1", "v5e-8", "v6e-1", "v4-8", "v3-8", "v2-8" (and "v5e-4", "v6e-8"),
            "cpu" (the host's memory over its virtual devices), or None: this machine.

    Returns:
        A `MemoryPlan`; when it does not fit, its `changes` say what would, cheapest first,
        and `check()` raises `MemoryPlanError` with them.

    Raises:
        FineTuneError: for arguments that cannot work (the message says what to pass).
    """
    _check_positive("batch_size", batch_size)
    _check_positive("max_length", max_length)
    if precision not in ("auto", "fp32", "bf16"):
        raise FineTuneError(f"precision must be 'auto', 'fp32' or 'bf16', got {precision!r}.")
    if sharding not in ("auto", "data", "fsdp"):
        raise FineTuneError(f"sharding must be 'auto', 'data' or 'fsdp', got {sharding!r}.")
    device = _device(hardware)
    count = device.devices if devices is None else devices
    _check_positive("devices", count)
    if device.kind == "cpu" and count != device.devices:
        # Virtual CPU devices are as many as asked for (num_processes=), sharing the memory.
        device = _Device("CPU", "cpu", count, _host_memory() // count)
    if count > device.devices:
        raise FineTuneError(f"devices={count}, but {device.name} has {device.devices}: pass at "
                            f"most {device.devices}, or the hardware you mean (hardware=...).")
    config = load_model_config(model)
    facts = _model_facts(model, config)
    default_rank = default_lora_rank(config)
    rank, target_modules = _lora_choice(lora, default_rank)
    settings = _Settings(
        batch_size, max_length,
        resolve_precision(precision, device.kind.upper()),
        rank, target_modules, "data" if sharding == "auto" else sharding,
        bool(gradient_checkpointing), count, _modules_to_save(lora), _lora_dropout(lora))
    settings, notes = _decide_auto(facts, settings, device, lora, sharding, default_rank)
    plan = _plan(facts, settings, device, notes)
    if plan.fits:
        return plan
    return dataclasses.replace(plan, changes=_changes(facts, settings, device, default_rank))


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FineTuneError(f"{name} must be an integer >= 1, got {value!r}.")


def _lora_choice(lora: Any, default_rank: int) -> tuple[int | None, Any]:
    """(rank or None, target_modules) from `lora=`; "auto" starts without LoRA."""
    if lora is False or lora is None or lora == "auto":
        return None, "all-linear"
    if lora is True:
        return default_rank, "all-linear"
    if isinstance(lora, Mapping):
        rank, targets = lora.get("r", default_rank), lora.get("target_modules", "all-linear")
    elif hasattr(lora, "r"):
        rank, targets = lora.r, getattr(lora, "target_modules", None) or "all-linear"
    else:
        raise FineTuneError(f"lora must be True, False, 'auto', a peft.LoraConfig or a dict "
                            f"with 'r' and 'target_modules'; got {type(lora).__name__}.")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        raise FineTuneError(f"LoRA r must be a positive integer (8 or 16 are usual), got "
                            f"{rank!r}.")
    if isinstance(targets, str):
        return rank, targets
    return rank, tuple(targets)


def _modules_to_save(lora: Any) -> tuple[str, ...]:
    """The modules a LoRA config trains whole besides its adapters (peft's modules_to_save)."""
    names = (lora.get("modules_to_save") if isinstance(lora, Mapping)
             else getattr(lora, "modules_to_save", None))
    if not names or lora is True:
        return ()
    return (names,) if isinstance(names, str) else tuple(names)


def _lora_dropout(lora: Any) -> float:
    """The adapters' dropout: fine_tune's default (`LORA_DEFAULTS`) unless set."""
    if isinstance(lora, Mapping):
        return float(lora.get("lora_dropout", LORA_DEFAULTS["lora_dropout"]))
    value = getattr(lora, "lora_dropout", None)  # a peft LoraConfig; True/"auto": defaults
    return float(LORA_DEFAULTS["lora_dropout"] if value is None else value)


def _decide_auto(facts: _ModelFacts, settings: _Settings, device: _Device, lora: Any,
                 sharding: str, default_rank: int) -> tuple[_Settings, tuple[str, ...]]:
    """Resolve lora="auto" and sharding="auto" from the plan, and say why."""
    notes = []
    if lora == "auto":
        if _plan(facts, settings, device).fits:
            notes.append("lora='auto' chose a full fine-tune: it fits")
        else:
            settings = dataclasses.replace(settings, lora_rank=default_rank)
            notes.append(f"lora='auto' chose LoRA r={default_rank}: the full fine-tune does "
                         "not fit")
    if sharding == "auto" and settings.devices > 1:
        if _plan(facts, settings, device).fits:
            notes.append("sharding='auto' chose 'data': the state fits every device")
        else:
            settings = dataclasses.replace(settings, sharding="fsdp")
            notes.append(f"sharding='auto' chose 'fsdp': the state does not fit one device, "
                         f"so it is split over {settings.devices}")
    return settings, tuple(notes)


def _count(number: int) -> str:
    """6738415616 -> "6.74B", 4194304 -> "4.19M"."""
    for suffix, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if number >= scale:
            return f"{number / scale:.2f}{suffix}"
    return str(number)
