"""The output folder's free space, checked in the kernel before the fork: the counts of this
run (the memory plan's parameters when there is one) estimated by `disk_space.py`."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from ..disk_space import DiskEstimate, check_free_space, checkpoints_written, estimate_output
from ..model_facts import on_meta
from ..tasks.base import Task
from ..worker import checkpoint as ckpt
from .preparation import Prepared, TaskContext

if TYPE_CHECKING:
    import torch

#: Bytes per parameter of the dtype names a config may give (`config.dtype`).
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
               "float64": 8, "double": 8}


def check_output_space(context: TaskContext, task: Task, prepared: Prepared,
                       output_dir: str | None, total_steps: int, save_steps: int | None,
                       resume: Any) -> DiskEstimate | None:
    """Refuse the run when its output would not fit the free space of `output_dir`.

    Args:
        context, task, prepared: the run as prepared in the kernel.
        output_dir: the checked output folder (None: nothing is saved, nothing checked).
        total_steps, save_steps: the run's length and its checkpoint interval.
        resume: the checkpoint the run continues from, or None.

    Returns:
        The estimate checked, or None when nothing is saved.

    Raises:
        DiskSpaceError: the free space is smaller than the estimate (and its margin).
    """
    if output_dir is None:
        return None
    memory = prepared.memory
    if memory is not None:  # counted once, exactly, for the memory plan
        parameters, trainable = memory.parameters, memory.trainable_parameters
    else:
        parameters = trainable = parameter_count(context, task, prepared)
    per_parameter = saved_bytes_per_parameter(context)
    if prepared.lora and memory is not None and memory.precision == "bf16":
        per_parameter = 2  # the frozen base is stored in bfloat16, so is the merged model
    start = int(ckpt.read_checkpoint_info(resume).get("step", 0)) if resume else 0
    checkpoints = checkpoints_written(total_steps, save_steps, start)
    estimate = estimate_output(parameters, per_parameter, trainable, lora=bool(prepared.lora),
                               vocab=vocab_size(context.tokenizer), checkpoints=checkpoints)
    check_free_space(estimate, output_dir)
    return estimate


def parameter_count(context: TaskContext, task: Task, prepared: Prepared) -> int:
    """The parameters of the model the worker trains: the instance's, else those of the task's
    model built from the config on the `meta` device (exact shapes, no memory), with the
    head the worker gives it."""
    if context.instance is not None:
        return _unique_count(context.instance)
    import transformers

    config = copy.deepcopy(context.model_config)
    for key, value in prepared.model_kwargs.items():
        if key != "ignore_mismatched_sizes":  # a loading option, not a config field
            setattr(config, key, value)
    auto_class = getattr(transformers, task.auto_class_for(context.model_config))
    return _unique_count(on_meta(auto_class, config))


def saved_bytes_per_parameter(context: TaskContext) -> int:
    """Bytes per parameter of the saved model: the dtype the worker loads it in (the
    instance's, else the config's, which `from_pretrained` keeps), float32 when unsaid."""
    instance = context.instance
    if instance is not None:
        first = next(iter(instance.parameters()), None)
        return first.element_size() if first is not None else 4
    dtype = (getattr(context.model_config, "dtype", None)
             or getattr(context.model_config, "torch_dtype", None))
    name = str(dtype).removeprefix("torch.") if dtype is not None else "float32"
    return DTYPE_BYTES.get(name, 4)


def vocab_size(tokenizer: Any) -> int:
    """The tokenizer's vocabulary with its added tokens (0 for a callable without one)."""
    try:
        return len(tokenizer)
    except TypeError:
        return int(getattr(tokenizer, "vocab_size", 0) or 0)


def _unique_count(model: torch.nn.Module) -> int:
    # parameters() yields a tied weight (embeddings and LM head) once, as it is saved.
    return sum(parameter.numel() for parameter in model.parameters())
