"""LoRA for `fine_tune(..., lora=True | peft.LoraConfig | dict)`: the settings checked in the
kernel, the adapters put on the model in the worker, and the adapter and merged saves.

In the kernel `lora_settings` turns `lora=` into plain JSON settings (they join the run's
fingerprint, so a resume with other LoRA settings is refused) after checking, before any
fork or write, that peft is installed, the rank is positive, the target modules match linear
layers of the model and the base is not quantized. In the worker `apply_lora` builds peft's
`LoraConfig` from them and wraps the model: the base frozen (bfloat16 when the run is), the
adapters in float32. `save_lora` writes `output_dir/adapter` (PEFT's format) and, at the top of
`output_dir`, the merged model (an ordinary `save_pretrained` folder), both from the state
already gathered from the devices (FSDPv2's shards included).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .config import FineTuneError
from .memory import LORA_DEFAULTS

#: Where the adapter goes inside `output_dir` (and inside each checkpoint).
ADAPTER_DIR = "adapter"
INSTALL = 'pip install "hfxla_nb[lora]"'


def require_peft() -> Any:
    """The `peft` module, or a `FineTuneError` that says how to install it."""
    try:
        import peft
    except ImportError:
        raise FineTuneError(f"lora= needs the peft package, which is not installed: {INSTALL} "
                            "(or pip install peft).") from None
    return peft


def lora_settings(lora: Any, model: Any, model_config: Any,
                  task_type: str) -> dict[str, Any] | None:
    """`lora=` checked and written as plain JSON settings for peft's `LoraConfig` (None: a
    full fine-tune). Runs in the kernel; raises `FineTuneError` for anything that cannot work.

    Args:
        lora: False/None, True (defaults), a `peft.LoraConfig`, or a dict of its fields.
        model: what `fine_tune` was given (an instance is inspected as it is).
        model_config: the model's transformers config.
        task_type: peft's task type, the task's `Task.peft_task_type` ("CAUSAL_LM"; "SEQ_CLS"
            also trains the classifier head whole).
    """
    if lora is None or lora is False:
        return None
    from .memory import default_lora_rank, lora_parameter_count
    from .memory import model_facts as _model_facts

    peft = require_peft()
    settings = _requested(lora, peft, default_lora_rank(model_config))
    settings["task_type"] = task_type
    rank = settings.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        raise FineTuneError(f"LoRA r must be a positive integer (8 or 16 are usual), got "
                            f"{rank!r}.")
    quantized = getattr(model_config, "quantization_config", None)
    if quantized is not None:
        raise FineTuneError(
            "this model's base is quantized (quantization_config in its config): fine_tune "
            "trains on XLA devices, which bitsandbytes-style quantized layers do not run on, and "
            "a merged save needs the unquantized weights. Load the unquantized model (its "
            "precision='auto' keeps the frozen base in bfloat16 on a TPU).")
    import torch

    facts = _model_facts(model if isinstance(model, torch.nn.Module) else model_config,
                         model_config)
    if not facts.linear_layers:
        raise FineTuneError(
            f"lora= found no linear layer in {facts.name} for the adapters (LoRA adapts "
            "nn.Linear and Conv1D layers): fine-tune it without lora=.")
    targets = settings.get("target_modules") or "all-linear"
    lora_parameter_count(facts, rank, targets)  # refuses targets that match nothing
    if _experts(model_config) and settings.get("lora_dropout"):
        # peft adapts a MoE model's expert weights (parameters, not layers) with its
        # ParamWrapper, which takes no dropout and raises in the worker otherwise.
        if isinstance(lora, peft.LoraConfig) or (isinstance(lora, Mapping)
                                                  and "lora_dropout" in lora):
            raise FineTuneError(
                f"{facts.name} is a mixture of experts: peft's LoRA on its expert weights takes "
                f"no dropout (lora_dropout={settings['lora_dropout']}); pass lora_dropout=0.")
        settings["lora_dropout"] = 0.0
    return _jsonable(settings)


def _experts(model_config: Any) -> int:
    """How many experts a mixture-of-experts model has per layer (0: not one)."""
    counts = [getattr(model_config, name, None) for name in ("num_local_experts", "num_experts")]
    return max((count for count in counts if isinstance(count, int) and count > 1), default=0)


def _requested(lora: Any, peft: Any, default_rank: int) -> dict[str, Any]:
    """The fields of `LoraConfig` the user asked for (defaults for `lora=True`)."""
    fields = {f.name for f in dataclasses.fields(peft.LoraConfig) if f.init}
    if lora is True:
        return {"r": default_rank, "lora_alpha": 2 * default_rank, **LORA_DEFAULTS}
    if isinstance(lora, peft.LoraConfig):
        values = {name: getattr(lora, name) for name in fields if hasattr(lora, name)}
        defaults = peft.LoraConfig()
        # Only what differs from peft's defaults, so the fingerprint stays short and stable.
        return {name: value for name, value in values.items()
                if value != getattr(defaults, name, None) or name in ("r", "target_modules")}
    if isinstance(lora, Mapping):
        unknown = sorted(str(name) for name in lora if name not in fields)
        if unknown:
            raise FineTuneError(f"lora={{...}} has {', '.join(map(repr, unknown))}, which "
                                "peft.LoraConfig does not take (r, lora_alpha, lora_dropout, "
                                "target_modules, modules_to_save, ...).")
        values = dict(lora)
        values.setdefault("r", default_rank)
        values.setdefault("lora_alpha", 2 * values["r"] if isinstance(values["r"], int) else 16)
        for name, value in LORA_DEFAULTS.items():
            values.setdefault(name, value)
        return values
    raise FineTuneError(f"lora must be True, False, 'auto', a peft.LoraConfig or a dict of its "
                        f"fields (r, target_modules, ...); got {type(lora).__name__}.")


def _jsonable(value: Any) -> Any:
    """Sets and tuples as sorted lists, enums as their values: what survives a JSON round
    trip unchanged (a checkpoint's fingerprint is compared after one)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_jsonable(item) for item in value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    return value


# ---------------------------------------------------------------------------------------------
# The worker side
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _peft_wrapping() -> Iterator[None]:
    """Around peft's building of a `PeftModel`: without transformers' FutureWarning about
    `is_gradient_checkpointing`.

    `PeftModel.__init__` reads `model.is_gradient_checkpointing` to decide whether to make the
    inputs require gradients; transformers 5 deprecated that attribute and warns on every
    read. Neither hfxla_nb nor the user reads it, and nothing they can change stops peft from
    doing so; the warning names only peft's own line.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                category=FutureWarning)
        yield


def lora_config(settings: Any) -> Any:
    """peft's `LoraConfig` from `lora_settings`' JSON (a `LoraConfig` is returned as it is)."""
    import peft

    if isinstance(settings, peft.PeftConfig):
        return settings
    # A copy: peft extends modules_to_save in place (SEQ_CLS adds the head's names), which
    # would change the plan's settings, and so the result's and the fingerprint's.
    return peft.LoraConfig(**copy.deepcopy(dict(settings)))


def apply_lora(model: Any, settings: Mapping[str, Any], precision: str) -> Any:
    """`model` with LoRA adapters (a `PeftModel`): the base frozen, stored in bfloat16 when
    `precision` is "bf16" (it is only read), the adapters and whatever peft trains whole (a
    classifier head) in float32."""
    import peft
    import torch

    with _peft_wrapping():
        wrapped = peft.get_peft_model(model, lora_config(settings))
    for parameter in wrapped.parameters():
        if parameter.requires_grad:
            parameter.data = parameter.data.float()
        elif precision == "bf16" and parameter.dtype == torch.float32:
            parameter.data = parameter.data.to(torch.bfloat16)
    return wrapped


def trainable_counts(model: Any) -> tuple[int, int]:
    """(trainable, all) parameters of `model`."""
    trainable = total = 0
    for parameter in model.parameters():
        total += parameter.numel()
        trainable += parameter.numel() if parameter.requires_grad else 0
    return trainable, total


def host_copy(peft_model: Any, settings: Any, state: Mapping[str, Any]) -> Any:
    """A `PeftModel` on the host whose tensors are `state`'s, gathered from the devices
    (assigned to a meta-device build, not copied: no second model is allocated). Its names
    are peft's own, without FSDPv2's wrappers, so peft's saving and merging see a plain
    model; the device copy is left as it is."""
    import peft
    import torch

    base = peft_model.get_base_model()
    with torch.device("meta"), _peft_wrapping():
        copy = peft.get_peft_model(type(base)(base.config), lora_config(settings))
    copy.load_state_dict(dict(state), assign=True, strict=False)
    return copy


def merged_state(copy: Any) -> dict[str, Any]:
    """The base model's own state dict with every adapter merged into its weights (peft's
    `merge_and_unload()` of a `host_copy`, which it consumes)."""
    result = copy.merge_and_unload().state_dict()
    missing = sorted(name for name, tensor in result.items() if tensor.device.type == "meta")
    if missing:  # a persistent buffer the gathered state did not hold
        raise RuntimeError(f"the merged model lacks {missing[:3]}: save it with "
                           "PeftModel.from_pretrained(...).merge_and_unload() instead.")
    return result


def worker_model(model: Any, plan: Any, precision: str) -> Any:
    """In the worker, on the host before the move to the device: `model` with the plan's
    adapters (and, when resuming, the checkpoint's adapter weights), or `model` as it is for
    a full fine-tune."""
    settings = plan.lora
    if not settings:
        return model
    wrapped = apply_lora(model, settings, precision)
    if plan.resume_from:
        import peft

        # A LoRA checkpoint holds the adapter (PeftModel.save_pretrained); the base is the
        # plan's model, frozen, as at the start.
        weights = peft.utils.load_peft_weights(plan.resume_from)
        peft.set_peft_model_state_dict(wrapped, weights)
    return wrapped


def described(model: Any, settings: Any) -> dict[str, Any]:
    """What the result says about LoRA: the settings (the plan's `lora`, None for a full
    fine-tune) and the trainable share of `model`."""
    trainable, total = trainable_counts(model)
    return {"lora": settings, "trainable_parameters": trainable, "parameters": total}


def save_adapter(peft_model: Any, settings: Any, folder: Path,
                 state: Mapping[str, Any]) -> Any:
    """The adapter of `peft_model` (the worker's, on the device), from its gathered `state`,
    in PEFT's format in `folder` (`PeftModel.from_pretrained(base, folder)`); returns the
    host copy it was saved from."""
    copy = host_copy(peft_model, settings, state)
    copy.save_pretrained(folder)
    return copy


def save_final_lora(peft_model: Any, settings: Any, tmp: Path,
                    state: Mapping[str, Any]) -> None:
    """`tmp/adapter` (PEFT's format) and the merged model at the top of `tmp`."""
    copy = save_adapter(peft_model, settings, tmp / ADAPTER_DIR, state)
    peft_model.get_base_model().save_pretrained(tmp, state_dict=merged_state(copy))


def load_adapter_model(output_dir: str | Path, auto_class: Any, **kwargs: Any) -> Any:
    """The base model with the adapter of `output_dir/adapter`, on the CPU (a `PeftModel`)."""
    peft = require_peft()
    folder = Path(output_dir) / ADAPTER_DIR
    base_name = peft.PeftConfig.from_pretrained(folder).base_model_name_or_path
    if not base_name:
        raise FileNotFoundError(
            f"{folder} does not name its base model (it was trained from a model instance): "
            "load the base yourself and use peft.PeftModel.from_pretrained(base, folder), or "
            "load the merged model with load_model().")
    base = auto_class.from_pretrained(base_name, **kwargs)
    with _peft_wrapping():
        return peft.PeftModel.from_pretrained(base, folder)
