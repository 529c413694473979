"""`hx.plan_memory`: what a fine-tune needs per device, against what the device has, before any
fork.

```python
plan = hx.plan_memory("google/gemma-2b", batch_size=8, max_length=1024, hardware="v5e-1")
plan.fits, plan.total_gib, plan.changes     # the changes that would make it fit, cheapest first
plan.check()                                # raises MemoryPlanError with the numbers when not
plan                                        # in a notebook: the table (ui/plan_panel.py)
```

Parameters are counted exactly on a model built on the `meta` device (`model_facts.py`);
LoRA's adapters by walking its linear layers as peft's `target_modules="all-linear"` does
(`lora_sizing.py`); the device's memory comes from `memory_device.py`. Activations are an
estimate (docs/memory.md gives the formulas and what is verified where). torch and
transformers are imported inside the functions that need them: `import hfxla_nb` stays cheap.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from .config import FineTuneError
from .lora_sizing import default_lora_rank, lora_choice, lora_dropout, lora_modules_to_save
from .memory_device import GIB, PlanDevice, cpu_devices, eight_chip_host, plan_device
from .memory_sums import PlanSettings, part_sizes
from .model_facts import ModelFacts, load_model_config, model_facts
from .precision import resolve_precision


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
        """The plan in words, for messages and `print()`: the total against the device, the
        parts, and the changes that would make it fit. A notebook draws it as a table
        (`ui/plan_panel.py`, registered by `ui/formatters.py`)."""
        verdict = "fits" if self.fits else "does not fit"
        lines = [
            f"{self.model} on {self.hardware} ({self.devices} device"
            f"{'s' if self.devices != 1 else ''}): {self.total_gib:.2f} GiB per device of "
            f"{self.device_memory_gib:.2f}, {verdict}",
            f"  parameters {self.parameters_gib:.2f} GiB, gradients {self.gradients_gib:.2f} "
            f"GiB, optimizer state {self.optimizer_gib:.2f} GiB, activations "
            f"{self.activations_gib:.2f} GiB (estimate)",
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


def _plan(facts: ModelFacts, settings: PlanSettings, device: PlanDevice,
          notes: tuple[str, ...] = ()) -> MemoryPlan:
    sizes = part_sizes(facts, settings)
    activations = (sizes.activations_checkpointed if settings.gradient_checkpointing
                   else sizes.activations_full)
    total = sizes.weights + sizes.gradients + sizes.optimizer + activations
    return MemoryPlan(
        model=facts.name, hardware=device.name, devices=settings.devices,
        device_memory_gib=device.usable_bytes / GIB,
        batch_size=settings.batch_size, max_length=settings.max_length,
        precision=settings.precision, lora_rank=settings.lora_rank, sharding=settings.sharding,
        gradient_checkpointing=settings.gradient_checkpointing,
        parameters=facts.parameters, trainable_parameters=sizes.trainable,
        parameters_gib=sizes.weights / GIB, gradients_gib=sizes.gradients / GIB,
        optimizer_gib=sizes.optimizer / GIB, activations_gib=activations / GIB,
        activations_full_gib=sizes.activations_full / GIB,
        activations_checkpointed_gib=sizes.activations_checkpointed / GIB,
        total_gib=total / GIB, fits=total <= device.usable_bytes, notes=notes,
    )


def _changes(facts: ModelFacts, settings: PlanSettings, device: PlanDevice,
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


def _change(facts: ModelFacts, settings: PlanSettings, device: PlanDevice, change: str,
            argument: str) -> MemoryChange:
    plan = _plan(facts, settings, device)
    return MemoryChange(change, argument, round(plan.total_gib, 2), plan.fits)


def _shard(facts: ModelFacts, settings: PlanSettings, device: PlanDevice
           ) -> tuple[PlanSettings, MemoryChange | None]:
    """FSDP over this host's devices; on a one-chip TPU host, over the 8 chips of the same
    kind's 8-chip host (v5e-1 -> v5e-8), the cheapest step up."""
    if device.devices > 1:
        count, where = device.devices, "this host's"
    elif device.kind == "tpu":
        bigger = eight_chip_host(device)
        count, where = 8, (f"a {bigger}" if bigger else "an 8-chip host")
    else:
        return settings, None
    if settings.sharding == "fsdp" and settings.devices >= count:
        return settings, None
    sharded = dataclasses.replace(settings, sharding="fsdp", devices=count)
    return sharded, _change(facts, sharded, device, f"FSDP over {count} devices ({where})",
                            "sharding='fsdp'")


def _smaller_batch(facts: ModelFacts, settings: PlanSettings, device: PlanDevice
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
    device = plan_device(hardware)
    count = device.devices if devices is None else devices
    _check_positive("devices", count)
    if device.kind == "cpu" and count != device.devices:
        # Virtual CPU devices are as many as asked for (num_processes=), sharing the memory.
        device = cpu_devices(count)
    if count > device.devices:
        raise FineTuneError(f"devices={count}, but {device.name} has {device.devices}: pass at "
                            f"most {device.devices}, or the hardware you mean (hardware=...).")
    config = load_model_config(model)
    facts = model_facts(model, config)
    default_rank = default_lora_rank(config)
    rank, target_modules = lora_choice(lora, default_rank)
    settings = PlanSettings(
        batch_size, max_length,
        resolve_precision(precision, device.kind.upper()),
        rank, target_modules, "data" if sharding == "auto" else sharding,
        bool(gradient_checkpointing), count, lora_modules_to_save(lora), lora_dropout(lora))
    settings, notes = _decide_auto(facts, settings, device, lora, sharding, default_rank)
    plan = _plan(facts, settings, device, notes)
    if plan.fits:
        return plan
    return dataclasses.replace(plan, changes=_changes(facts, settings, device, default_rank))


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FineTuneError(f"{name} must be an integer >= 1, got {value!r}.")


def _decide_auto(facts: ModelFacts, settings: PlanSettings, device: PlanDevice, lora: Any,
                 sharding: str, default_rank: int) -> tuple[PlanSettings, tuple[str, ...]]:
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
