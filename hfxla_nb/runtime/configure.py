"""`configure()`: the environment variables torch_xla reads once, when its runtime starts."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from .. import _xla
from . import compile_cache as cache
from .environment import Accelerator, detect_accelerator

DEVICES = ("auto", "tpu", "cpu")


class RuntimeAlreadyStartedError(RuntimeError):
    """`configure()` was called after the XLA runtime started in this process."""


class TpuNotFoundError(RuntimeError):
    """`configure(device="tpu")` on a machine where no TPU was found."""


def configure(
    device: str = "auto",
    cores: int | None = None,
    debug: bool = False,
    *,
    compile_cache: bool | str | os.PathLike | None = None,
    compile_cache_gib: float | None = None,
    environ: MutableMapping[str, str] | None = None,
    sys_root: str = "/",
) -> dict[str, str]:
    """Set the environment variables torch_xla reads when its runtime starts.

    Call it before anything touches the device: torch_xla reads these variables once, when the
    runtime starts, and ignores later changes.

    Args:
        device: "auto" (the TPU if one is found, else the CPU), "tpu" or "cpu".
        cores: on the CPU, the number of virtual XLA devices (`CPU_NUM_DEVICES`), e.g. 8 to
            rehearse a TPU host. On a TPU, all devices (the default) or those of one chip.
        debug: set `PT_XLA_DEBUG_LEVEL=2`, PyTorch/XLA's own analysis of every compilation and
            device-to-host transfer (why it happened, from which line). Launched workers
            capture it for the panel's compilations view anyway (`trace_compiles`); this
            prints it raw where nothing captures it (the kernel, scripts).
        compile_cache: the persistent compile cache of later launches: True (on, in this
            environment's folder; the default on TPU hosts), False (off), or a folder (the
            entries go in a subfolder per torch_xla/libtpu version and device kind). None
            leaves the choice as it is.
        compile_cache_gib: the most the cache folder may hold (default 10; 4 on Kaggle); the
            oldest entries are removed past it.
        environ: the mapping to change (default `os.environ`).
        sys_root: root of the file system to look for TPU hardware in (tests pass a fake tree).

    Returns:
        The variables set, name -> value.

    Raises:
        ValueError: for an unknown `device` or an invalid `cores`.
        CompileCacheRefusedError: a `compile_cache` folder that other users can write to.
        TpuNotFoundError: `device="tpu"` where no TPU was found.
        RuntimeAlreadyStartedError: the XLA runtime already started in this process.

    Example:
        ```python
        hx.configure(device="cpu", cores=8)   # {'PJRT_DEVICE': 'CPU', 'CPU_NUM_DEVICES': '8'}
        ```
    """
    if device not in DEVICES:
        raise ValueError(
            f"device={device!r} is not one of {', '.join(map(repr, DEVICES))}: use 'auto' (the "
            "TPU when there is one), 'tpu' or 'cpu'."
        )
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        raise ValueError(f"cores must be a positive integer or None, got {cores!r}.")
    if _xla.runtime_is_initialized():
        raise RuntimeAlreadyStartedError(
            "The XLA runtime has already started in this process, so hx.configure() can no "
            "longer change it: torch_xla reads PJRT_DEVICE and CPU_NUM_DEVICES only once. "
            "Restart the kernel and call hx.configure(...) first, before torch_xla.device(), "
            "transformers.TrainingArguments(...), met.metrics_report() or anything else that "
            "touches the device."
        )
    environ = os.environ if environ is None else environ
    accelerator = detect_accelerator(sys_root, environ)
    target = device if device != "auto" else ("tpu" if accelerator.kind == "tpu" else "cpu")
    values: dict[str, str] = {}
    if target == "tpu":
        values.update(_tpu_settings(accelerator, cores))
    else:
        values["PJRT_DEVICE"] = "CPU"
        if cores is not None:
            values["CPU_NUM_DEVICES"] = str(cores)
    if debug:
        values["PT_XLA_DEBUG_LEVEL"] = "2"
    values.update(_cache_settings(compile_cache, compile_cache_gib))
    environ.update(values)
    return values


def _cache_settings(setting: bool | str | os.PathLike | None,
                    gib: float | None) -> dict[str, str]:
    values = {}
    if gib is not None:
        if isinstance(gib, bool) or not isinstance(gib, (int, float)) or gib <= 0:
            raise ValueError(f"compile_cache_gib must be a positive number, got {gib!r}.")
        values[cache.LIMIT] = str(float(gib))
    if setting is None:
        return values
    if isinstance(setting, bool):
        values[cache.SETTING] = "on" if setting else "off"
        return values
    folder = os.path.abspath(os.path.expanduser(os.fspath(setting)))
    cache.check_folder(folder)
    values[cache.SETTING] = folder
    return values


def _tpu_settings(accelerator: Accelerator, cores: int | None) -> dict[str, str]:
    if accelerator.kind != "tpu":
        raise TpuNotFoundError(
            "device='tpu', but no TPU was found on this machine (no Google device on the PCI "
            "bus, no /dev/accel* or /dev/vfio/*). On Colab or Kaggle pick a TPU runtime; to "
            "rehearse on the CPU use hx.configure(device='cpu', cores=8)."
        )
    values = {"PJRT_DEVICE": "TPU"}
    if cores is None or cores == accelerator.devices:
        return values
    description = accelerator.description.split(",")[0]
    if cores > accelerator.devices:
        raise ValueError(
            f"cores={cores}, but this host has only {accelerator.devices} TPU devices "
            f"({description}). Pass cores={accelerator.devices} or leave cores=None."
        )
    if cores == accelerator.cores_per_chip:
        # torch_xla's own one-chip topology (torch_xla._internal.tpu.configure_one_chip_topology)
        values.update(
            TPU_VISIBLE_CHIPS="0", TPU_CHIPS_PER_PROCESS_BOUNDS="1,1,1", TPU_PROCESS_BOUNDS="1,1,1"
        )
        return values
    raise ValueError(
        f"cores={cores} is not a TPU topology this helper can set up ({description}): use "
        f"cores=None for all {accelerator.devices} devices, or cores={accelerator.cores_per_chip} "
        "for one chip."
    )

