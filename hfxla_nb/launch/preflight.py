"""Checks that run in the notebook before anything is forked.

Every refusal says what to do. Nothing here starts the XLA runtime or writes a file; the
checks take what they need (a `RuntimeInfo`, a function) as arguments so tests can drive
each case.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import _xla
from ..runtime.environment import cpu_device_count, for_this_call

STRATEGIES = ("replicated", "spmd", "debug")
MIXED_PRECISIONS = ("no", "bf16", "fp16")
# More forked CPU processes than this only thrashes a notebook machine.
MAX_DEBUG_PROCESSES = 64
MAX_CPU_VIRTUAL_DEVICES = 256


class LaunchRefusedError(RuntimeError):
    """Raised before forking when a launch cannot work; the message says how to fix it."""


@dataclass(frozen=True)
class LaunchPlan:
    """What the launcher will do, decided in the notebook before forking.

    Attributes:
        strategy: "replicated", "spmd" or "debug".
        world: number of ranks that will report (devices for replicated, 1 for spmd,
            processes for debug).
        env: variables set (None: removed) in the worker processes only; the kernel's own
            environment is untouched.
        warnings: things that will work but deserve a word.
        collective_notes: what explains a failure of XLA collectives (XLA:CPU's replicated
            ranks are threads of one process), said only when a launch fails that way
            (`supervision.involves_collectives`): not under a failure of one rank's own.
    """

    strategy: str
    world: int
    env: dict[str, str | None] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    collective_notes: tuple[str, ...] = ()


def check_timeout(timeout: float | None) -> None:
    """Refuse a `timeout=` that is not a positive number of seconds (None: no timeout)."""
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise LaunchRefusedError(f"timeout must be a positive number of seconds, got {timeout!r}.")


def check_function(function: Callable, args: Sequence) -> bool:
    """Check that `function(index, *args)` or `function(*args)` can be called.

    Returns:
        True when the function takes the rank index first (xmp.spawn style), False when it
        takes exactly `args` (accelerate's notebook_launcher style). The index is passed when the
        function needs one more positional argument than `args` gives.
    """
    if not callable(function):
        raise LaunchRefusedError(
            f"`function` must be callable, got {type(function).__name__}. Pass the training "
            "function itself: notebook_launcher(train, args=(...)), not train(...)."
        )
    if not isinstance(args, (tuple, list)):
        raise LaunchRefusedError(
            f"`args` must be a tuple, got {type(args).__name__}. For one argument write "
            "args=(value,) with the trailing comma."
        )
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return True  # builtins without a signature: xmp.spawn's convention
    try:
        signature.bind(*args)
        return False
    except TypeError:
        pass
    try:
        signature.bind(0, *args)
        return True
    except TypeError as error:
        name = getattr(function, "__name__", repr(function))
        raise LaunchRefusedError(
            f"{name}{signature} cannot be called with args={tuple(args)!r}: {error}. The "
            f"launcher calls {name}(index, *args) or, accelerate-style, {name}(*args)."
        ) from None


def check_runtime_not_started() -> None:
    """Refuse to fork from a process whose XLA runtime (or CUDA) is already initialized."""
    if _xla.runtime_is_initialized():
        raise LaunchRefusedError(
            "The XLA runtime is already initialized in this kernel, and processes forked from "
            "it hang forever as soon as they use XLA. Something in an earlier cell touched the "
            "device: usually torch_xla.device() / xm.xla_device(), creating "
            "transformers.TrainingArguments(...), or met.metrics_report(). Restart the kernel, "
            "and move all device code into the function you launch."
        )
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        raise LaunchRefusedError(
            "CUDA is already initialized in this kernel, and forked processes cannot use it. "
            "Restart the kernel and keep every `.cuda()` / `.to('cuda')` inside the launched "
            "function."
        )


def check_backend(strategy: str) -> None:
    """Refuse, before anything is read or forked, work that needs torch_xla where it is not
    installed or does not match torch, saying what to install; on a host with TorchTPU
    instead, what of hfxla_nb works there. `strategy="debug"` runs on the CPU with gloo: it
    needs no torch_xla.

    Checked once per `fine_tune` / `notebook_launcher` / `predict` call (`one_call()`):
    `fine_tune` asks before preparing the data, its launch asks again.
    """
    if strategy == "debug":
        return
    for_this_call("check_backend", _check_backend)


def _check_backend() -> None:
    """`check_backend`'s checks (every strategy but "debug" needs the same torch_xla)."""
    from ..runtime.environment import package_versions
    from ..runtime.info import (
        TORCH_TPU_FIX,
        TORCH_TPU_ONLY,
        major_minor,
        matching_pair,
        mismatch_problem,
    )

    versions = package_versions()
    if _xla.is_installed():
        # pip pairs the newest torch with the newest torch_xla, which is built for an older
        # torch: every worker would fail at `import torch_xla` with an undefined symbol.
        problem = mismatch_problem(versions)
        if problem is not None:
            raise LaunchRefusedError(f"{problem.title} {problem.fix}")
        return
    torch_tpu = versions.get("torch_tpu")
    if torch_tpu is not None:
        raise LaunchRefusedError(f"{TORCH_TPU_ONLY.format(version=torch_tpu)} {TORCH_TPU_FIX}")
    fix = matching_pair(major_minor(versions.get("torch")), None)
    raise LaunchRefusedError(
        f"torch_xla is not installed, and every worker needs it: {fix} (on a TPU VM, "
        "torch_xla[tpu]), or launch with strategy='debug' to run on the CPU with gloo.")


def check_environment(accelerator: Any, environ: Mapping[str, str]) -> None:
    """Refuse environments in which every worker would fail, before anything is forked.

    Args:
        accelerator: `RuntimeInfo.accelerator` (kind, device files' holders).
        environ: the variables the workers inherit.
    """
    if "CPU_NUM_DEVICES" in environ and cpu_device_count(environ) is None:
        raise LaunchRefusedError(
            f"CPU_NUM_DEVICES={environ['CPU_NUM_DEVICES']!r} is not a positive integer, and "
            "torch_xla would fail in every worker. Call hx.configure(device='cpu', cores=N), or "
            "pass num_processes=N."
        )
    pjrt = environ.get("PJRT_DEVICE", "").strip().upper()
    if pjrt == "TPU" and accelerator.kind != "tpu":
        raise LaunchRefusedError(
            "PJRT_DEVICE=TPU, but this machine has no TPU (no Google device on the PCI bus, no "
            "/dev/accel* or /dev/vfio/*). On Colab or Kaggle pick a TPU runtime; to rehearse on "
            "the CPU call hx.configure(device='cpu', cores=8) before launching."
        )
    if accelerator.kind == "tpu" and accelerator.holders:
        holders = "; ".join(f"pid {pid}: {command}"
                            for pid, command in sorted(accelerator.holders.items()))
        pids = " ".join(str(pid) for pid in sorted(accelerator.holders))
        raise LaunchRefusedError(
            f"The TPU is held by another process ({holders}), and only one process can open "
            "it: every worker would fail to start. Shut down that notebook's kernel (Kernel > "
            f"Shut Down) or stop the stale worker (`kill {pids}`), then launch again."
        )


def plan_launch(
    strategy: str,
    num_processes: int | None,
    mixed_precision: str,
    accelerator_kind: str,
    device_count: int,
    environment: str = "terminal",
) -> LaunchPlan:
    """Decide the world size and worker environment for a strategy on this hardware.

    Args:
        strategy: "replicated", "spmd" or "debug".
        num_processes: what the user asked for; on a CPU it is the number of virtual devices.
        mixed_precision: "no", "bf16" or "fp16".
        accelerator_kind: "tpu", "cpu" or "gpu" (from `RuntimeInfo.accelerator.kind`).
        device_count: devices found on this host (TPU cores; CPU virtual devices).
        environment: where this runs (`RuntimeInfo.environment`): "kaggle" needs a fix.

    Returns:
        The `LaunchPlan`.
    """
    _check_plan_arguments(strategy, num_processes, mixed_precision, accelerator_kind)
    # A value of None removes the variable in the workers.
    env: dict[str, str | None] = {"ACCELERATE_MIXED_PRECISION": mixed_precision}
    warnings: list[str] = []
    if strategy == "debug":
        count = num_processes or 2
        if count > MAX_DEBUG_PROCESSES:
            raise LaunchRefusedError(
                f"num_processes={count} CPU processes is more than this launcher allows "
                f"({MAX_DEBUG_PROCESSES}) on this machine's {_host_cores()}; the debug "
                "strategy is for rehearsing multi-process code with a few processes: pass "
                "num_processes=2 to 8."
            )
        env.update(PJRT_DEVICE="CPU", ACCELERATE_USE_CPU="true")
        return LaunchPlan(strategy, count, env, tuple(warnings))
    # The world size first: everything after it (the CPU's replicated note) depends on it.
    count = launch_devices(num_processes, accelerator_kind, device_count)
    collective_notes: list[str] = []
    if accelerator_kind == "tpu":
        _tpu_env(environment, env)
    else:
        _cpu_env(strategy, count, env, collective_notes)
    world = 1 if strategy == "spmd" else count
    return LaunchPlan(strategy, world, env, tuple(warnings), tuple(collective_notes))


def launch_devices(num_processes: int | None, accelerator_kind: str, device_count: int) -> int:
    """The XLA devices a launch of `num_processes` gets on this host, refused when that is
    more devices than the host has (on a TPU host, any other number than all of them).

    The one decision of the world size, for `notebook_launcher`, `fine_tune` and `predict`:
    checked before anything that depends on it (a batch split over the devices). Nothing is
    started: the devices are counted from the hardware scan and the environment.

    Args:
        num_processes: what the user asked for: None (every TPU device; on the CPU,
            `CPU_NUM_DEVICES`, default 1) or a positive integer.
        accelerator_kind: "tpu", "cpu" or "gpu" (`Accelerator.kind`).
        device_count: a TPU host's XLA devices (`Accelerator.devices`: chips x cores per chip).
            Without a TPU, XLA runs on the CPU with `num_processes` virtual devices.

    Returns:
        The number of XLA devices.

    Raises:
        LaunchRefusedError: `num_processes` is not a positive integer, or asks for more
            devices than this host has.
    """
    _check_num_processes(num_processes)
    if accelerator_kind == "tpu":
        if num_processes not in (None, device_count):
            asked = ("asks for more devices than this TPU host has"
                     if num_processes > device_count else "is not possible here")
            raise LaunchRefusedError(
                f"num_processes={num_processes} {asked}: this TPU host has {device_count} "
                "cores, and PyTorch/XLA always uses all of them (xmp.spawn accepts only all "
                f"devices). Pass num_processes=None or {device_count}."
            )
        return device_count
    configured = cpu_device_count(os.environ) or 1
    count = num_processes or configured
    if count > MAX_CPU_VIRTUAL_DEVICES:
        setting = os.environ.get("CPU_NUM_DEVICES")
        now = f"CPU_NUM_DEVICES={setting}" if setting else "CPU_NUM_DEVICES is unset"
        raise LaunchRefusedError(
            f"num_processes={count} asks for more XLA devices than this machine has: "
            f"without a TPU, XLA runs on its {_host_cores()} as virtual devices ({configured} "
            f"now: {now}), at most {MAX_CPU_VIRTUAL_DEVICES} of them. Pass num_processes=8 "
            "or fewer (4 or 8 rehearse a TPU host), or run on a TPU."
        )
    return count


def _host_cores() -> str:
    """This host's CPU cores, for a message ("2 CPU cores")."""
    cores = os.cpu_count()
    return f"{cores} CPU core{'s' if cores != 1 else ''}" if cores else "CPU cores"


def _check_plan_arguments(strategy: str, num_processes: int | None, mixed_precision: str,
                          accelerator_kind: str) -> None:
    """Refuse a strategy, precision or process count that no hardware takes."""
    if strategy not in STRATEGIES:
        raise LaunchRefusedError(
            f"strategy={strategy!r} is not one of {', '.join(map(repr, STRATEGIES))}. Use "
            "'spmd' for data parallel training over every core (recommended), 'replicated' "
            "for xmp.spawn-style code, 'debug' for multi-process code on the CPU."
        )
    if mixed_precision not in MIXED_PRECISIONS:
        raise LaunchRefusedError(
            f"mixed_precision={mixed_precision!r} is not one of "
            f"{', '.join(map(repr, MIXED_PRECISIONS))}."
        )
    _check_num_processes(num_processes)
    if mixed_precision == "fp16" and accelerator_kind == "tpu":
        raise LaunchRefusedError(
            "TPUs have no fast float16; use mixed_precision='bf16' (bfloat16) instead."
        )


def _check_num_processes(num_processes: int | None) -> None:
    if num_processes is not None and (
        isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1
    ):
        raise LaunchRefusedError(
            "num_processes must be a positive integer or None (all devices), "
            f"got {num_processes!r}."
        )


def _tpu_env(environment: str, env: dict[str, str | None]) -> None:
    """A TPU host's variables, added to `env`."""
    env["PJRT_DEVICE"] = "TPU"
    if environment == "kaggle":
        # Kaggle's TPU VM presets these for a multi-host setup it does not have; pytorch/xla's
        # own Kaggle notebook removes them before xmp.spawn.
        env.update(TPU_PROCESS_ADDRESSES=None, CLOUD_TPU_TASK_ID=None)


def _cpu_env(strategy: str, count: int, env: dict[str, str | None],
             collective_notes: list[str]) -> None:
    """XLA:CPU's variables for `count` virtual devices, added to `env` (and a word in
    `collective_notes` where replicated ranks cannot reduce)."""
    env["PJRT_DEVICE"] = "CPU"
    env["CPU_NUM_DEVICES"] = str(count)
    if strategy == "replicated" and count > 1:
        collective_notes.append(
            f"XLA on the CPU runs the {count} replicated ranks as threads of one process, "
            "and XLA collectives between them (all_reduce, xm.optimizer_step's gradient "
            "reduction) hang or abort upstream (pytorch/xla#5005, pytorch/xla#9089). Code without "
            "collectives runs; for data-parallel training use strategy='spmd'."
        )
