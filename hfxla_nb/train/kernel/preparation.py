"""What a task's kernel side receives and returns: `Splits` (the data's splits, picked once),
`TaskContext` (the model as loaded in the kernel) and `Prepared` (the encoded data and what
the plan needs besides). `prepare.py` builds the first two and turns the third into the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..batching import EncodedData
from ..memory_plan import MemoryPlan

if TYPE_CHECKING:
    import datasets
    import torch
    from transformers import PretrainedConfig, PreTrainedTokenizerBase


@dataclass
class Splits:
    """The data's splits, picked once by `data.pick_splits`.

    Attributes:
        named: split name -> `datasets.Dataset`, training first (`{"train": ..., name: ...}`).
        eval_name: the evaluation split's name (None: no evaluation).
    """

    named: dict[str, datasets.Dataset]
    eval_name: str | None

    @property
    def train(self) -> datasets.Dataset:
        return self.named["train"]


@dataclass
class TaskContext:
    """The model as loaded in the kernel (config and tokenizer, no weights), for a task's
    `prepare`.

    Attributes:
        source: what the worker loads: a name or folder (str), or the model instance given.
        model_config: the model's transformers config.
        fixed_labels: the head size of a model instance (it cannot change), else None.
        tokenizer: the tokenizer the data is encoded with.
        model_name: a short name (the default output folder's).
        devices: the devices the run trains on.
    """

    source: str | torch.nn.Module
    model_config: PretrainedConfig
    fixed_labels: int | None
    tokenizer: PreTrainedTokenizerBase
    model_name: str
    devices: int

    @property
    def instance(self) -> torch.nn.Module | None:
        """The model instance given, or None for a name or folder."""
        return None if isinstance(self.source, str) else self.source


@dataclass
class Prepared:
    """What a task's `prepare` returns: the encoded data and what the plan needs besides.

    Attributes:
        data: the encoded splits (`batching.EncodedData` or a task's subclass of it).
        model_kwargs: `from_pretrained` arguments for the worker (a head sized for the labels).
        lora: the LoRA settings (`lora.lora_settings`' JSON), None for a full fine-tune.
        memory: the `MemoryPlan` the run was checked with, when it was.
        sharding: the parameter layout the task decided ("data", "fsdp"); None: the config's
            (`sharding="auto"` is "data").
    """

    data: EncodedData
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    lora: dict[str, Any] | None = None
    memory: MemoryPlan | None = None
    sharding: str | None = None
