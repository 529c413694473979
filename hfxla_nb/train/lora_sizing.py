"""LoRA's size before any adapter exists: the default rank, the layers a `target_modules`
matches (as peft matches them) and the parameters the adapters train.

`lora.py` checks `lora=` with these in the kernel; `plan_memory` sizes a LoRA fine-tune with
them. Pure functions of a model's `ModelFacts` and the `lora=` argument.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .config import FineTuneError
from .model_facts import SEQUENCE_CLASSIFIER_HEADS, ModelFacts, text_config

#: `lora=True`: peft's own defaults except these (optimum-tpu's notebooks target all linear
#: layers too); the rank comes from `default_lora_rank`.
LORA_DEFAULTS = {"target_modules": "all-linear", "lora_dropout": 0.05, "bias": "none"}

#: What `target_modules` may be: "all-linear", a regular expression, or module names.
TargetModules = str | tuple[str, ...]


def default_lora_rank(config: Any) -> int:
    """The LoRA rank `lora=True` uses: 16 for models with a hidden size of 2048 or more (the 1B
    to 7B LLMs people fine-tune on one chip), 8 below (BERT-sized and tiny models, where 8 is
    peft's own default). Both train well under 1% of a model's parameters."""
    return 16 if int(text_config(config).hidden_size) >= 2048 else 8


def targeted_layers(facts: ModelFacts, target_modules: Any) -> list[tuple[str, int, int]]:
    """The linear layers (name, in, out) of `facts` that `target_modules` matches."""
    return [layer for layer in facts.linear_layers if is_targeted(layer[0], target_modules)]


def lora_parameter_count(facts: ModelFacts, rank: int, target_modules: Any = "all-linear",
                         modules_to_save: Any = ()) -> int:
    """Adapter parameters: rank x (in + out) per targeted linear layer (peft's lora_A and
    lora_B, no bias), plus what peft trains whole: a classifier head and the modules named
    in `modules_to_save` (matched as peft does: the name or its last parts).

    Raises:
        FineTuneError: when `target_modules` matches no linear layer.
    """
    targeted = targeted_layers(facts, target_modules)
    if not targeted:
        raise FineTuneError(
            f"LoRA target_modules={target_modules!r} match no linear layer of {facts.name}. "
            "Pass target_modules='all-linear', or names of its linear layers such as "
            f"{sorted({name.rsplit('.', 1)[-1] for name, _, _ in facts.linear_layers})[:6]}.")
    saved = {modules_to_save} if isinstance(modules_to_save, str) else set(modules_to_save or ())
    if not saved:
        whole = facts.head_parameters
    else:  # the head and the named modules, each counted once
        saved |= set(SEQUENCE_CLASSIFIER_HEADS) if facts.head_parameters else set()
        whole = sum(count for name, count in facts.own_parameters if _under(name, saved))
    return rank * sum(fan_in + fan_out for _, fan_in, fan_out in targeted) + whole


def _under(name: str, modules: set[str]) -> bool:
    """Whether module `name` is, or is inside, a module named by one of `modules`."""
    parts = name.split(".")
    prefixes = [".".join(parts[:end]) for end in range(1, len(parts) + 1)]
    return any(prefix == key or prefix.endswith("." + key)
               for prefix in prefixes for key in modules)


def is_targeted(name: str, target_modules: Any) -> bool:
    """peft's matching: "all-linear"; a string is a regular expression over the whole name; a
    list matches a name equal to an entry or ending in "." + entry."""
    if isinstance(target_modules, str):
        if target_modules.lower() == "all-linear":
            return True
        return re.fullmatch(target_modules, name) is not None
    return any(name == target or name.endswith("." + target) for target in target_modules)


def lora_choice(lora: Any, default_rank: int) -> tuple[int | None, TargetModules]:
    """(rank or None, target_modules) from `lora=`; "auto" starts without LoRA.

    Raises:
        FineTuneError: for a `lora=` that is none of the accepted forms, or a bad rank.
    """
    if lora is False or lora is None or lora == "auto":
        return None, "all-linear"
    if lora is True:
        return default_rank, "all-linear"
    if isinstance(lora, Mapping):
        rank, targets = lora.get("r", default_rank), lora.get("target_modules", "all-linear")
    elif hasattr(lora, "r"):
        rank, targets = lora.r, getattr(lora, "target_modules", None) or "all-linear"
    else:
        raise FineTuneError(f"lora must be True, False, 'auto', a peft.LoraConfig or a dict "
                            f"with 'r' and 'target_modules'; got {type(lora).__name__}.")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        raise FineTuneError(f"LoRA r must be a positive integer (8 or 16 are usual), got "
                            f"{rank!r}.")
    if isinstance(targets, str):
        return rank, targets
    return rank, tuple(targets)


def lora_modules_to_save(lora: Any) -> tuple[str, ...]:
    """The modules a LoRA config trains whole besides its adapters (peft's modules_to_save)."""
    names = (lora.get("modules_to_save") if isinstance(lora, Mapping)
             else getattr(lora, "modules_to_save", None))
    if not names or lora is True:
        return ()
    return (names,) if isinstance(names, str) else tuple(names)


def lora_dropout(lora: Any) -> float:
    """The adapters' dropout: fine_tune's default (`LORA_DEFAULTS`) unless set."""
    if isinstance(lora, Mapping):
        return float(lora.get("lora_dropout", LORA_DEFAULTS["lora_dropout"]))
    value = getattr(lora, "lora_dropout", None)  # a peft LoraConfig; True/"auto": defaults
    return float(LORA_DEFAULTS["lora_dropout"] if value is None else value)
