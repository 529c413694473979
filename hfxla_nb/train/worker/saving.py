"""Checkpoints and the final save, from the worker, written so that the trained model is never
lost.

State is fetched to the host in one transfer, then written to a folder under a temporary name
next to its target and renamed: a crash, a full disk or a kernel interrupt during the write
leaves the previous folder as it was, and no half-written folder under the real name. With
LoRA a checkpoint holds the adapter (`PeftModel.save_pretrained`), and the final save the
adapter and the merged model. A final save that cannot be written (a full disk) goes to a
fallback folder, else stays in the result.

Layout of a `fine_tune` output folder:

```
output_dir/
    config.json, model.safetensors, tokenizer files    the final model (from_pretrained-ready)
    hfxla_nb_run.json                                  what the run did (FineTuneResult)
    checkpoints/checkpoint-<step>/                     model + tokenizer + hfxla_nb_state.pt
    adapter/                                           LoRA: the adapter (the top is merged)
```

The checkpoint state file holds the optimizer, the scheduler, the step, the random states
(Python, NumPy, torch, XLA) and the loss bookkeeping, so a resumed run continues exactly where
the saved one stopped.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ... import _xla
from ..lora import host_copy, merged_state, save_adapter, save_final_lora
from ..plan import TrainPlan
from .context import counts

if TYPE_CHECKING:
    import torch

    from .callbacks import TrainerRun
    from .context import WorkerContext


# -- folders written atomically, and the checkpoints' layout --

RUN_FILE = "hfxla_nb_run.json"
STATE_FILE = "hfxla_nb_state.pt"
INFO_FILE = "hfxla_nb_checkpoint.json"  # step and settings, readable without loading the state
CHECKPOINTS = "checkpoints"
# TensorBoard's default folder (`report_to=`): kept when the final save replaces output_dir.
RUNS = "runs"
_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


@contextmanager
def atomic_folder(target: str | os.PathLike, keep: tuple[str, ...] = ()) -> Iterator[Path]:
    """Write a folder under a temporary name, then put it in place of `target`.

    Args:
        target: the folder to create or replace.
        keep: names inside an existing `target` to carry over into the new folder (moved,
            not copied), e.g. its `checkpoints` subfolder.

    Yields:
        The temporary folder to write into. If the block raises, it is deleted and `target`
        is left untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        publish(tmp, target, keep)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def publish(tmp: Path, target: Path, keep: tuple[str, ...] = ()) -> None:
    """Rename the finished folder `tmp` to `target`, replacing an existing `target`."""
    if not target.exists():
        os.rename(tmp, target)
        return
    for name in keep:
        if (target / name).exists() and not (tmp / name).exists():
            os.rename(target / name, tmp / name)
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.rmdir(old)
    os.rename(target, old)  # from here until the next rename, `target` does not exist
    os.rename(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def checkpoint_dir(output_dir: str | os.PathLike, step: int) -> Path:
    return Path(output_dir) / CHECKPOINTS / f"checkpoint-{step}"


def list_checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints in `output_dir`, oldest first (half-written ones never match)."""
    folder = Path(output_dir) / CHECKPOINTS
    found = []
    if folder.is_dir():
        for entry in folder.iterdir():
            match = _CHECKPOINT_NAME.match(entry.name)
            if match and (entry / STATE_FILE).is_file():
                found.append((int(match.group(1)), entry))
    return sorted(found)


def is_checkpoint(path: str | os.PathLike) -> bool:
    # A full fine-tune's checkpoint holds the model (config.json), a LoRA run's the adapter.
    return (Path(path) / STATE_FILE).is_file() and any(
        (Path(path) / name).is_file() for name in ("config.json", "adapter_config.json"))


def resolve_checkpoint(resume: Any, output_dir: str | os.PathLike) -> Path | None:
    """The checkpoint folder `resume_from_checkpoint` designates, or None.

    Args:
        resume: None/False (start fresh), True (the latest checkpoint in `output_dir`), a
            checkpoint folder, or an earlier run's output folder (its latest checkpoint).

    Raises:
        ValueError: when nothing resumable is there; the message says what was looked for.
    """
    if resume is None or resume is False:
        return None
    if resume is True:
        found = list_checkpoints(output_dir)
        if not found:
            raise ValueError(
                f"resume_from_checkpoint=True, but {output_dir} has no checkpoint (looked for "
                f"{Path(output_dir) / CHECKPOINTS}/checkpoint-<step>/{STATE_FILE}). Pass the "
                "checkpoint folder itself, or train with save_steps=... to write checkpoints."
            )
        return found[-1][1]
    path = Path(os.fspath(resume)).expanduser()
    if is_checkpoint(path):
        return path
    found = list_checkpoints(path)
    if found:
        return found[-1][1]
    raise ValueError(
        f"resume_from_checkpoint={os.fspath(resume)!r} is not a checkpoint: a checkpoint "
        f"folder holds config.json (adapter_config.json with LoRA) and {STATE_FILE} (fine_tune "
        "writes them under "
        f"<output_dir>/{CHECKPOINTS}/checkpoint-<step> when save_steps is set)."
    )


def write_json(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as file:
        json.dump(data, file, indent=2, sort_keys=True, default=str)
        file.write("\n")


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    with open(path, encoding="utf-8") as file:
        return json.load(file)


def write_checkpoint(
    output_dir: str | os.PathLike,
    step: int,
    write_model: Callable[[Path], None],
    state: dict[str, Any],
    info: dict[str, Any] | None = None,
) -> Path:
    """Write `checkpoints/checkpoint-<step>` atomically: the model (by `write_model(folder)`),
    a small JSON `info`, and the training state, all under a temporary name first."""
    import torch

    target = checkpoint_dir(output_dir, step)
    with atomic_folder(target) as tmp:
        write_model(tmp)
        write_json(tmp / INFO_FILE, info or {"step": step})
        torch.save(state, tmp / STATE_FILE)
    return target


def read_checkpoint_info(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's small JSON (step, settings fingerprint); {} when absent."""
    path = Path(checkpoint) / INFO_FILE
    return read_json(path) if path.is_file() else {}


def load_state(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """The training state of a checkpoint (our own file: NumPy random states included)."""
    import torch

    return torch.load(Path(checkpoint) / STATE_FILE, map_location="cpu", weights_only=False)


# -- saving from the worker: checkpoints and the final save --

class TrainingState(Protocol):
    """What saving reads of the training (`loop.TrainingLoop` has it) and what it adds.

    Attributes:
        ctx, plan: the worker's context and the plan.
        optimizer, scheduler: their state is saved with each checkpoint.
        loss_total: the running loss on the device.
        history, logged: the loss history, and `(step, running loss)` at its last point.
        checkpoints, checkpoint_marks: appended to: each checkpoint's folder, and its
            `(begin, end, counter deltas)`.
    """

    ctx: WorkerContext
    plan: TrainPlan
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loss_total: torch.Tensor | None
    history: list[tuple[int, float]]
    logged: tuple[int, float]
    checkpoints: list[str]
    checkpoint_marks: list[tuple[float, float, dict[str, int]]]
    run: TrainerRun  # the evaluations and the callbacks' state a resume needs

#: The attribute under which PyTorch/XLA's FSDPv2 keeps a wrapped module.
FSDP_WRAPPED = "_orig_module"


def cpu_state(loop: TrainingState) -> tuple[dict, dict, float]:
    """Model and optimizer state on the host, with the running loss, in one transfer."""
    import torch

    model_state = loop.ctx.base_model.state_dict()
    optimizer_state = loop.optimizer.state_dict()
    names, tensors = [], []
    for name, tensor in model_state.items():
        names.append(("model", name, None))
        tensors.append(tensor)
    for pid, slots in optimizer_state["state"].items():
        for key, value in slots.items():
            if isinstance(value, torch.Tensor) and value.device.type == "xla":
                names.append(("optimizer", pid, key))
                tensors.append(value)
    tensors.append(loop.loss_total)
    fetched = _xla.to_cpu(tensors)
    loss_total = float(fetched.pop())
    cpu_model = {}
    cpu_optimizer = {"state": {pid: dict(slots) for pid, slots in
                               optimizer_state["state"].items()},
                     "param_groups": optimizer_state["param_groups"]}
    for (kind, key, slot), value in zip(names, fetched, strict=True):
        if kind == "model":
            # FSDPv2 wraps layers in place; the saved names are the model's own.
            cpu_model[key.replace(f"{FSDP_WRAPPED}.", "")] = value
        else:
            cpu_optimizer["state"][key][slot] = value
    return cpu_model, cpu_optimizer, loss_total


def save_checkpoint(loop: TrainingState, step: int) -> None:
    """Write checkpoint `step` (model, optimizer, scheduler, loss, random states) atomically."""
    import torch

    # The fetch below waits for the step's execution anyway; waiting first keeps that
    # execution out of the checkpoint's own counts (subtracted from the per-step figures).
    _xla.wait_device_ops()
    begin = time.perf_counter()
    before = counts()
    cpu_model, cpu_optimizer, loss_total = cpu_state(loop)
    ctx, plan = loop.ctx, loop.plan
    if ctx.rank == 0:
        # The loss history as of this step. Closures of earlier steps have run; this step's
        # log entry (its closure runs at the next sync) is computed here from the same
        # fetched total, so a resumed run's history matches an uninterrupted one.
        history = [pair for pair in loop.history if pair[0] <= step]
        if (step % plan.log_every == 0 or step == plan.total_steps) and (
            not history or history[-1][0] < step
        ):
            last_step, last_value = loop.logged
            history.append((step, (loss_total - last_value) / max(1, step - last_step)))
        state = {
            "step": step,
            "optimizer": cpu_optimizer,
            "scheduler": loop.scheduler.state_dict(),
            "loss_total": loss_total,
            "history": history,
            "python_rng": random.getstate(),
            "numpy_rng": np.random.get_state(),
            "torch_rng": torch.get_rng_state(),
            "xla_rng": _xla.get_rng_state(),
            "fingerprint": plan.fingerprint,
            "trainer": loop.run.saved_state(),
        }

        def write_model(folder: Path) -> None:
            if plan.lora:
                save_adapter(ctx.base_model, plan.lora, folder, cpu_model)  # the base: the plan's
            else:
                ctx.base_model.save_pretrained(folder, state_dict=cpu_model)
            plan.tokenizer.save_pretrained(folder)

        info = {"step": step, "fingerprint": plan.fingerprint}
        path = write_checkpoint(plan.output_dir, step, write_model, state, info)
        loop.checkpoints.append(str(path))
    after = counts()
    loop.checkpoint_marks.append(
        (begin, time.perf_counter(), {k: after[k] - before[k] for k in after})
    )

def model_state(loop: TrainingState) -> dict[str, Any]:
    """The model's state on the host, in one transfer (the names `save_pretrained` takes)."""
    state = loop.ctx.base_model.state_dict()
    names = list(state)
    fetched = _xla.to_cpu([state[name] for name in names])
    return {name.replace(f"{FSDP_WRAPPED}.", ""): value
            for name, value in zip(names, fetched, strict=True)}


def restore_model_state(loop: TrainingState, state: dict[str, Any]) -> None:
    """Put `state` (as `model_state` returned it) back into the model on the devices, in one
    upload; each tensor keeps its own sharding, so the graphs compiled for the model still
    fit it."""
    import torch

    own = loop.ctx.base_model.state_dict(keep_vars=True)
    names = list(own)
    uploaded = _xla.send_to_device(
        [state[name.replace(f"{FSDP_WRAPPED}.", "")] for name in names], loop.ctx.device)
    with torch.no_grad():
        for name, value in zip(names, uploaded, strict=True):
            _xla.share_sharding(value, own[name])
            own[name].copy_(value)
    _xla.sync()


def save_final(loop: TrainingState, result: dict[str, Any],
               cpu_model: dict[str, Any] | None = None) -> None:
    """The trained model, tokenizer and run summary, published atomically in `output_dir`;
    `cpu_model`: the state to save instead of the model's own (the best evaluation's, with
    `load_best_model_at_end`).

    When writing there fails (a full disk, a quota, permissions), the same files go to a
    fallback folder (`fallback_dir`, default the system's temporary folder); when that fails
    too, the model's state stays in `result` (`held_model`), which the kernel receives. Either
    way `result` says what happened (`save_error`, its first note) and the run ends normally.

    Raises:
        Exception: any failure other than a failed write (a bug), as it came.
    """
    if cpu_model is None:
        cpu_model, _, _ = cpu_state(loop)
    ctx, plan = loop.ctx, loop.plan

    def write(folder: Path) -> None:
        if plan.lora:
            save_final_lora(ctx.base_model, plan.lora, folder, cpu_model)  # and the merged model
        else:
            ctx.base_model.save_pretrained(folder, state_dict=cpu_model)
        plan.tokenizer.save_pretrained(folder)
        write_json(folder / RUN_FILE, result)

    try:
        with atomic_folder(plan.output_dir, keep=(CHECKPOINTS, RUNS)) as tmp:
            write(tmp)
    except Exception as error:  # noqa: BLE001 - a failed write must not cost the model
        reason = write_failure(error)
        if reason is None:
            raise
        save_elsewhere(loop, result, cpu_model, write, reason)


def save_elsewhere(loop: TrainingState, result: dict[str, Any], cpu_model: dict,
                   write: Callable[[Path], None], reason: str) -> None:
    """After `output_dir` failed: `write` into a new fallback folder, else keep the model's
    state (merged with LoRA) and config in `result["held_model"]`; says so in `result`."""
    plan = loop.plan
    where = f"could not save to {plan.output_dir}: {reason}"
    notes = list(result.get("notes", []))
    folder = None
    try:
        folder = rescue_folder(plan.fallback_dir, Path(plan.output_dir).name)
        said = (f"hfxla_nb: {where}; the trained model was saved to {folder} instead "
                "(result.save(folder) writes it where you want)")
        # Set before the write: the run summary written there says where the model is.
        result.update(output_dir=str(folder), save_error=said, notes=[said, *notes])
        write(folder)
    except Exception as error:  # noqa: BLE001 - the last resort must not fail either
        second = write_failure(error)
        if second is None:
            raise
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        target = folder or plan.fallback_dir or tempfile.gettempdir()
        said = (f"hfxla_nb: {where}, nor to {target}: {second}; the trained model is held in "
                "memory in the result (result.save(folder) writes it where you want)")
        result.update(output_dir=None, save_error=said, notes=[said, *notes],
                      held_model=held_model(loop, cpu_model))


def rescue_folder(fallback_dir: str | None, name: str) -> Path:
    """A new folder `hfxla_nb-rescued-<name>-<time>-<random>` in `fallback_dir` (made when
    missing), or in the system's temporary folder."""
    base = Path(fallback_dir).expanduser() if fallback_dir else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.mkdtemp(prefix=f"hfxla_nb-rescued-{name}-{stamp}-", dir=base))


def held_model(loop: TrainingState, cpu_model: dict) -> dict[str, Any]:
    """What the kernel needs to write the model later (`FineTuneResult.save`): the model's
    CPU state (LoRA's merged into the base), its config, and the tokenizer."""
    ctx, plan = loop.ctx, loop.plan
    if plan.lora:
        state = merged_state(host_copy(ctx.base_model, plan.lora, cpu_model))
        config = ctx.base_model.get_base_model().config
    else:
        state, config = cpu_model, ctx.base_model.config
    return {"state_dict": state, "config": config, "tokenizer": plan.tokenizer}


#: safetensors reports a failed write as its own error, not an OSError ("... No space left on
#: device (os error 28) at path ...").
_OS_ERROR = re.compile(r"([^:]*\(os error \d+\))")


def write_failure(error: BaseException) -> str | None:
    """Why a write failed, in a few words ("No space left on device (os error 28)"), or None
    when `error` is no failed write."""
    if isinstance(error, OSError):
        return (f"{error.strerror} (os error {error.errno})" if error.strerror
                else str(error) or type(error).__name__)
    found = _OS_ERROR.search(str(error))
    return found.group(1).strip() if found and type(error).__name__ == "SafetensorError" else None
