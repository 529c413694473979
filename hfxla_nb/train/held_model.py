"""A trained model whose final save failed twice (a full disk): held in the kernel as CPU
tensors, and written later where the user says (`FineTuneResult.save(folder)`), as is a model
saved to a fallback folder."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .model_facts import on_meta
from .quiet_loading import quiet_loading
from .worker import checkpoint as ckpt

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class HeldModel:
    """The trained model in memory, as the worker returned it.

    Attributes:
        state_dict: the model's state on the CPU (with LoRA: the adapters merged in).
        config: its transformers config.
        tokenizer: the tokenizer the run used.
    """

    state_dict: dict[str, torch.Tensor]
    config: PretrainedConfig
    tokenizer: PreTrainedTokenizerBase | None = None

    def model(self, auto_class: str, **kwargs: Any) -> PreTrainedModel:
        """The model on the CPU, built from the config by `transformers.<auto_class>` with the
        held weights (buffers that are not saved, such as position ids, made as usual).

        Args:
            auto_class: the task's Auto class name ("AutoModelForSequenceClassification").
            kwargs: passed to `from_config`.
        """
        import transformers

        model = getattr(transformers, auto_class).from_config(self.config, **kwargs)
        model.load_state_dict(self.state_dict, strict=False, assign=True)
        model.tie_weights()  # assigned one by one, tied weights are two tensors again
        return model.eval()

    def write(self, folder: Path, auto_class: str) -> None:
        """`save_pretrained` files of the model and the tokenizer into `folder`."""
        import transformers

        # only the class and the config: the weights are ours
        shell = on_meta(getattr(transformers, auto_class), self.config)
        shell.save_pretrained(folder, state_dict=self.state_dict)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(folder)


def save_model(folder: str | os.PathLike, summary: dict[str, Any], auto_class: str,
               output_dir: str | None, held: HeldModel | None) -> Path:
    """Write a run's model to `folder`, atomically: a copy of `output_dir` (a fallback
    folder), or the `held` model; with the run's `summary` (its `output_dir` the new folder).

    Args:
        folder: a new or empty folder.
        summary: the result's data (`FineTuneResult.to_dict()`).
        auto_class: the task's Auto class name.
        output_dir: the folder the model is in now, or None when it is `held`.
        held: the model in memory, or None.

    Returns:
        The folder, absolute.

    Raises:
        FileNotFoundError: there is no model to write.
        FileExistsError: `folder` exists and is not empty.
    """
    target = Path(os.fspath(folder)).expanduser().absolute()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target} exists and is not an empty folder; pass a new one.")
    if held is None and output_dir is None:
        raise FileNotFoundError("this run saved no model (output_dir was None).")
    with ckpt.atomic_folder(target) as tmp:
        if held is not None:
            with quiet_loading():  # no "Writing model shards" bar left in the cell
                held.write(tmp, auto_class)
        else:
            shutil.copytree(output_dir, tmp, dirs_exist_ok=True)
        ckpt.write_json(tmp / ckpt.RUN_FILE, {**summary, "output_dir": str(target)})
    return target
