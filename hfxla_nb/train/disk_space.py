"""What a fine-tune writes to its output folder, estimated before the fork, against the free
space there: a full disk is refused before any training, not found at the final save.

```python
need = estimate_output(parameters=124_000_000, bytes_per_parameter=4, vocab=50_257,
                       checkpoints=2)
need.total, need.needed                 # bytes written; with the margin
check_free_space(need, "out/gpt2")      # DiskSpaceError with the numbers when it does not fit
```

Pure functions of counts, but for `free_space`, which reads the file system
(`shutil.disk_usage`). `kernel/disk.py` gathers the counts of a run; docs/fine-tune.md ("A full
disk") says what is counted.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .config import FineTuneError
from .memory_device import GIB

KIB, MIB = 1024, 1024**2

#: AdamW's two float32 moments per trainable parameter, in each checkpoint's state file.
ADAMW_BYTES = 8
#: LoRA's adapters (and the modules it trains whole) train, and are saved, in float32.
ADAPTER_BYTES = 4
#: A tokenizer's files per token of its vocabulary (tokenizer.json with its merges: GPT-2's is
#: 27 bytes a token, Llama 3's 70), and the small files besides (tokenizer_config.json, the
#: special tokens, a chat template).
TOKENIZER_BYTES_PER_TOKEN = 100
TOKENIZER_FIXED_BYTES = 64 * KIB
#: The small files of a save besides the weights: config.json, generation_config.json, the run
#: summary; for a checkpoint also the scheduler, the random states and the loss history.
SMALL_FILES_BYTES = 64 * KIB
#: What the estimate cannot see (safetensors headers, file system blocks), asked for on top.
MARGIN_FRACTION = 0.05
MARGIN_BYTES = 1 * MIB


class DiskSpaceError(FineTuneError):
    """The output folder's file system has less free space than the fine-tune would write;
    raised before anything is forked or written, with the numbers and what to change."""


@dataclass(frozen=True)
class DiskEstimate:
    """What a fine-tune writes under its output folder, in bytes.

    Attributes:
        model: the final model's weights (with LoRA: the merged model).
        adapter: LoRA's adapter in `output_dir/adapter` (0 for a full fine-tune).
        tokenizer: the tokenizer's files, saved with the model and with each checkpoint.
        checkpoint: one checkpoint: the model (with LoRA: the adapter), the tokenizer and the
            training state (AdamW's moments).
        checkpoints: how many checkpoints the run writes (every one is kept).
    """

    model: int
    adapter: int
    tokenizer: int
    checkpoint: int
    checkpoints: int

    @property
    def total(self) -> int:
        """Every byte the run writes: the final save and all its checkpoints."""
        final = self.model + self.adapter + self.tokenizer + SMALL_FILES_BYTES
        return final + self.checkpoint * self.checkpoints

    @property
    def needed(self) -> int:
        """`total` with the margin: the free space a run is started with."""
        return self.total + int(self.total * MARGIN_FRACTION) + MARGIN_BYTES

    def parts(self) -> str:
        """The estimate's parts in words: "the model 367 KiB, the tokenizer 89 KiB, ..."."""
        words = [f"the {'merged ' if self.adapter else ''}model {size(self.model)}"]
        if self.adapter:
            words.append(f"the adapter {size(self.adapter)}")
        words.append(f"the tokenizer {size(self.tokenizer)}")
        if self.checkpoints:
            plural = "s" if self.checkpoints != 1 else ""
            words.append(f"{self.checkpoints} checkpoint{plural} of {size(self.checkpoint)}")
        return ", ".join(words)


def estimate_output(parameters: int, bytes_per_parameter: int, trainable: int | None = None,
                    lora: bool = False, vocab: int = 0, checkpoints: int = 0) -> DiskEstimate:
    """What a fine-tune writes under its output folder.

    Args:
        parameters: the model's parameters (with LoRA: the base's, adapters left out).
        bytes_per_parameter: the saved model's bytes per parameter (4 for float32, 2 for
            bfloat16).
        trainable: parameters the optimizer updates; default: every one (a full fine-tune).
        lora: whether LoRA trains `trainable` adapter parameters: then the final save holds
            the adapter and the merged model, and a checkpoint the adapter alone.
        vocab: the tokenizer's vocabulary size.
        checkpoints: checkpoints written (`checkpoints_written`).

    Returns:
        The `DiskEstimate`.
    """
    trained = parameters if trainable is None else trainable
    model = parameters * bytes_per_parameter
    adapter = trained * ADAPTER_BYTES if lora else 0
    tokenizer = tokenizer_bytes(vocab)
    weights = adapter if lora else model
    checkpoint = weights + tokenizer + trained * ADAMW_BYTES + SMALL_FILES_BYTES
    return DiskEstimate(model, adapter, tokenizer, checkpoint, checkpoints)


def tokenizer_bytes(vocab: int) -> int:
    """A tokenizer's files, from its vocabulary size (a generous estimate)."""
    return vocab * TOKENIZER_BYTES_PER_TOKEN + TOKENIZER_FIXED_BYTES


def checkpoints_written(total_steps: int, save_steps: int | None, start_step: int = 0) -> int:
    """Checkpoints a run writes from `start_step` to `total_steps`: one at every multiple of
    `save_steps` (None: none)."""
    if not save_steps:
        return 0
    return max(0, total_steps // save_steps - start_step // save_steps)


def nearest_existing(path: str | os.PathLike) -> Path:
    """`path`, or its nearest parent that exists: where a folder to be made will live."""
    folder = Path(os.fspath(path)).expanduser().absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def free_space(path: str | os.PathLike) -> tuple[Path, int]:
    """(the nearest existing folder of `path`, the bytes free there for this user)."""
    where = nearest_existing(path)
    return where, shutil.disk_usage(where).free


def check_free_space(estimate: DiskEstimate, output_dir: str | os.PathLike) -> None:
    """Refuse a run whose output would not fit the free space of `output_dir`'s file system.

    Raises:
        DiskSpaceError: with the numbers (needed, free, where) and what to change.
    """
    where, free = free_space(output_dir)
    if free < estimate.needed:
        raise DiskSpaceError(refusal(estimate, output_dir, where, free))


def refusal(estimate: DiskEstimate, output_dir: str | os.PathLike, where: Path,
            free: int) -> str:
    """The refusal's words: needed, free, where, and the changes that would make it fit."""
    fewer = (" fewer checkpoints (a larger save_steps, or save_steps=None),"
             if estimate.checkpoints else "")
    return (
        f"output_dir {os.fspath(output_dir)} needs about {size(estimate.needed)} "
        f"({estimate.parts()}, and a margin), but only {size(free)} is free on {where}'s file "
        f"system, so nothing was started. Pass another output_dir=... on a larger disk,"
        f"{fewer} or free space there (output_dir=None saves nothing)."
    )


def size(count: int) -> str:
    """Bytes for people: "512 B", "367 KiB", "1.5 MiB", "12.4 GiB"."""
    if count < KIB:
        return f"{count} B"
    if count < MIB:
        return f"{count / KIB:.0f} KiB"
    if count < GIB:
        return f"{count / MIB:.1f} MiB"
    return f"{count / GIB:.1f} GiB"
