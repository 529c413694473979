"""Which host this is (Colab's v5e-1, Kaggle's v5e-8, a TPU VM, a machine without a TPU) and
what the launcher does there, in words a person reads in `%xla_info`. Pure functions."""

from __future__ import annotations

from .._words import plural
from .hardware import Accelerator, slice_name

_HOSTED = {"colab": "Colab", "kaggle": "Kaggle"}
# Each `detect_environment()` word as a person writes it (a host without a TPU is named so).
_ENVIRONMENT_NAMES = {**_HOSTED, "tpu-vm": "TPU VM", "vscode": "VS Code", "jupyter": "Jupyter",
                      "terminal": "Terminal"}


def host_name(accelerator: Accelerator, environment: str) -> str:
    """"Colab TPU v5e-1", "Kaggle TPU v5e-8", "TPU VM v4-8", "Jupyter, no TPU"."""
    where = _HOSTED.get(environment)
    if accelerator.kind != "tpu":
        return f"{_ENVIRONMENT_NAMES.get(environment, environment)}, no TPU"
    name = slice_name(accelerator.generation or "(generation unknown)", accelerator.chips,
                      accelerator.cores_per_chip)
    return f"{where} TPU {name}" if where else f"TPU VM {name}"


def launch_plan(accelerator: Accelerator, environment: str) -> str:
    """What `notebook_launcher` and `fine_tune` will do on this host."""
    devices = accelerator.devices
    if accelerator.kind != "tpu":
        return (f"XLA on the CPU with {plural(devices, 'virtual device')} (num_processes or "
                "hx.configure(cores=N) sets more), to rehearse: strategy='spmd' and fine_tune "
                "shard over them for real; 'replicated' runs ranks as threads without "
                "collectives")
    if devices == 1:
        plan = ("one chip, one XLA device: notebook_launcher runs the function in one "
                "supervised process (output, errors, live panels, nothing left running); "
                "fine_tune trains on that device")
    elif accelerator.cores_per_chip == 1:
        processes = plural(accelerator.chips, "process", "processes")
        plan = (f"{plural(accelerator.chips, 'chip')}, one process per chip: "
                f"notebook_launcher (replicated) starts {processes}; strategy='spmd' and "
                f"fine_tune shard over all {devices} devices in one process")
    else:
        plan = (f"{plural(accelerator.chips, 'chip')} x {accelerator.cores_per_chip} cores: "
                f"notebook_launcher (replicated) starts one process per chip with one rank "
                f"thread per core ({plural(devices, 'rank')}); strategy='spmd' and fine_tune "
                f"shard over all {devices} devices in one process")
    if environment == "kaggle":
        plan += "; the workers drop Kaggle's TPU_PROCESS_ADDRESSES and CLOUD_TPU_TASK_ID"
    return plan
