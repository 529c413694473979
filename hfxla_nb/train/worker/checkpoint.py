"""Folders written atomically, and the checkpoints of `fine_tune`.

A folder is first written under a temporary name next to its target, then renamed: a crash,
a full disk or a kernel interrupt during the write leaves the previous folder as it was and
no half-written folder under the real name. Layout of a `fine_tune` output folder:

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
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
