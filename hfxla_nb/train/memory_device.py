"""The device a memory plan is for: a TPU host by name (runtime/hardware.py's `TPU_HOSTS`),
this machine, or the CPU's virtual devices; how many XLA devices it has and what one of them
can use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..runtime.hardware import TPU_GENERATIONS, TPU_HOSTS, cpu_device_count, detect_accelerator
from .config import FineTuneError

GIB = 2**30
# What a TPU device's runtime keeps for itself: "reserved 530.00M" in XLA's own HBM reports
# (pytorch/xla #1735, LargeWorldModel/LWM #60; tests/data/hbm).
TPU_RESERVED_BYTES = 530 * 2**20
_GENERATIONS = {generation.name: generation for generation in TPU_GENERATIONS}


@dataclass(frozen=True)
class PlanDevice:
    """Where a plan would run.

    Attributes:
        name: "v5e-1", "TPU v5e x 4" (this machine) or "CPU".
        kind: "tpu" or "cpu".
        devices: the XLA devices the host has.
        usable_bytes: what one device can use: its HBM less the TPU runtime's reserve, or the
            host's memory over the CPU's virtual devices.
    """

    name: str
    kind: str
    devices: int
    usable_bytes: int


def plan_device(hardware: str | None, environ: Mapping[str, str] | None = None) -> PlanDevice:
    """The device `plan_memory(hardware=...)` names; None is this machine (never starts the
    runtime).

    Raises:
        FineTuneError: for a hardware name that is not a known host, "cpu" or None.
    """
    environ = os.environ if environ is None else environ
    if hardware is None:
        accelerator = detect_accelerator(environ=environ)
        if accelerator.kind == "tpu" and accelerator.generation in _GENERATIONS:
            return tpu_device(accelerator.generation, accelerator.chips,
                              f"TPU {accelerator.generation} x {accelerator.chips}")
        hardware = "cpu"
    key = hardware.strip().lower()
    if key in TPU_HOSTS:
        generation, chips = TPU_HOSTS[key]
        return tpu_device(generation, chips, key)
    if key == "cpu":
        return cpu_devices(cpu_device_count(environ) or 1)
    raise FineTuneError(f"hardware={hardware!r} is not one plan_memory knows: pass one of "
                        f"{sorted(TPU_HOSTS)}, 'cpu', or None (this machine).")


def tpu_device(generation_name: str, chips: int, name: str) -> PlanDevice:
    """A host of `chips` chips of one generation: every XLA device's HBM less the reserve."""
    generation = _GENERATIONS[generation_name]
    per_device = round(generation.hbm_per_device_gib * GIB) - TPU_RESERVED_BYTES
    return PlanDevice(name, "tpu", chips * generation.cores_per_chip, per_device)


def cpu_devices(count: int) -> PlanDevice:
    """`count` virtual CPU devices, sharing the host's memory."""
    return PlanDevice("CPU", "cpu", count, host_memory() // count)


def eight_chip_host(device: PlanDevice) -> str | None:
    """The 8-chip host of a one-chip TPU host's generation ("v5e-1" -> "v5e-8"), if there is
    one."""
    generation = TPU_HOSTS.get(device.name, (None,))[0]
    bigger = [name for name, (kind, chips) in TPU_HOSTS.items()
              if kind == generation and chips == 8]
    return bigger[0] if bigger else None


def host_memory() -> int:
    """The host's memory: a CPU's virtual XLA devices share it."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
