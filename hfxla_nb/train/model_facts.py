"""What a model is, read from a build on the `meta` device: exact parameter counts, the linear
layers LoRA may target and the sizes the activations depend on (no weights, no memory).

`plan_memory` (`memory_plan.py`), LoRA's checks (`lora.py`) and `prepare_fine_tune` read
these facts. torch and transformers are imported inside the functions that need them, so
`import hfxla_nb` stays cheap.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

from .config import FineTuneError

#: The heads peft leaves out of "all-linear" for task_type="SEQ_CLS" (and trains whole).
SEQUENCE_CLASSIFIER_HEADS = ("classifier", "score")


@dataclass(frozen=True)
class ModelFacts:
    """A model's facts, counted on its meta-device build.

    Attributes:
        name: the model's name (its folder's or hub name's last part, else its type).
        parameters: all its parameters, exact.
        linear_layers: (name, in features, out features) of each layer LoRA may target.
        head_parameters: a sequence classifier's head, which peft trains whole.
        own_parameters: (module name, parameters of that module itself), for the modules a
            LoRA config's `modules_to_save` trains whole.
        hidden, layers, intermediate, heads, kv_heads, head_dim: the text model's sizes.
        vocab: the vocabulary of its language-model head; 0 for models without one.
        gated_mlp: whether its MLP is gated (gate, up and down projections).
    """

    name: str
    parameters: int
    linear_layers: tuple[tuple[str, int, int], ...]
    head_parameters: int
    own_parameters: tuple[tuple[str, int], ...]
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    gated_mlp: bool


def load_model_config(model: Any) -> Any:
    """The transformers config of `model`: a config, a model name or folder (through
    `AutoConfig.from_pretrained`, the real loading path), or a model instance's `.config`.

    Raises:
        FineTuneError: when there is no config to read (the message says what to pass).
    """
    if isinstance(model, (str, os.PathLike)):
        from transformers import AutoConfig

        source = os.path.expanduser(os.fspath(model))
        try:
            return AutoConfig.from_pretrained(source)
        except Exception as error:  # noqa: BLE001 - say what to do, whatever failed
            raise FineTuneError(
                f"plan_memory could not load the config of {source!r}: {error}. Pass a folder "
                "with a config.json, a transformers config, or a model instance.") from None
    config = getattr(model, "config", model)
    if not hasattr(config, "to_dict") or not hasattr(config, "model_type"):
        raise FineTuneError(
            f"plan_memory needs a transformers model, config, name or folder; got "
            f"{type(model).__name__}. A plain nn.Module has no config to estimate activations "
            "from: pass its transformers config instead.")
    return config


def on_meta(auto_class: Any, config: Any) -> Any:
    """`auto_class.from_config(config)` built on the `meta` device: exact shapes, no memory.

    The model's module is imported first, outside the `meta` device: importing it can import
    accelerate, torch_xla and torch._dynamo, and on torch 2.8 importing torch._dynamo under
    `torch.device("meta")` dies in a circular import.

    Raises:
        ValueError: when `auto_class` has no class for this config (transformers' error).
    """
    import torch

    mapping = getattr(auto_class, "_model_mapping", None)
    if mapping is not None and type(config) in mapping:
        mapping[type(config)]  # imports the modeling module (transformers' lazy mapping)
    with torch.device("meta"):
        return auto_class.from_config(config)


def meta_model(config: Any) -> Any:
    """The model a config describes, built on the `meta` device: exact shapes, no memory."""
    from transformers import AutoModel, AutoModelForCausalLM

    try:
        return on_meta(AutoModelForCausalLM, config)
    except ValueError:  # no causal-LM class for this architecture (BERT-style encoders)
        return on_meta(AutoModel, config)


def meta_classifier(config: Any, num_labels: int) -> Any:
    """The sequence classifier a config describes with a head for `num_labels` labels, built
    on the `meta` device (what `fine_tune` loads for task="classification")."""
    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(config)
    config.num_labels = int(num_labels)
    return on_meta(AutoModelForSequenceClassification, config)


def text_config(config: Any) -> Any:
    """The text model's config (a multimodal config's text part, else the config itself)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def model_facts(model: Any, config: Any) -> ModelFacts:
    """The facts of `model` (an `nn.Module` as it is), or else of the model `config`
    describes, built on the meta device.

    Args:
        model: a torch module, or anything else (then `config` is built).
        config: the model's transformers config.
    """
    import torch

    module = model if isinstance(model, torch.nn.Module) else meta_model(config)
    text = text_config(config)
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    output = module.get_output_embeddings() if hasattr(module, "get_output_embeddings") else None
    excluded, head_parameters = _excluded_heads(module, output)
    names = [name for name, _ in module.named_modules()]
    return ModelFacts(
        name=model_name(config),
        parameters=sum(parameter.numel() for parameter in module.parameters()),
        linear_layers=tuple(layer for layer in linear_layers(module) if layer[0] not in excluded),
        head_parameters=head_parameters,
        own_parameters=tuple(
            (name, count) for name, child in module.named_modules()
            if (count := sum(p.numel() for p in child.parameters(recurse=False)))),
        hidden=hidden,
        layers=int(text.num_hidden_layers),
        intermediate=int(getattr(text, "intermediate_size", None) or 4 * hidden),
        heads=heads,
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
        vocab=int(text.vocab_size) if output is not None else 0,
        gated_mlp=any(name.endswith(("gate_proj", "gate_up_proj")) for name in names),
    )


def model_name(config: Any) -> str:
    """The last part of the config's `name_or_path`, else its type ("Llama" for LlamaConfig)."""
    path = getattr(config, "name_or_path", "") or ""
    return os.path.basename(path.rstrip("/")) or config.__class__.__name__.removesuffix("Config")


def linear_layers(module: Any) -> list[tuple[str, int, int]]:
    """(name, in, out) of every nn.Linear and transformers Conv1D: what "all-linear" targets."""
    import torch

    layers = []
    for name, child in module.named_modules():
        if isinstance(child, torch.nn.Linear):
            layers.append((name, child.in_features, child.out_features))
        elif type(child).__name__ == "Conv1D" and hasattr(child, "weight"):
            fan_in, fan_out = child.weight.shape  # GPT-2's Conv1D stores (in, out)
            layers.append((name, int(fan_in), int(fan_out)))
    return layers


def _excluded_heads(module: Any, output: Any) -> tuple[set[str], int]:
    """What peft's "all-linear" leaves out: the output embeddings (a language-model head), or
    else a sequence classifier's head, which peft trains whole instead."""
    if output is not None:
        return {name for name, child in module.named_modules() if child is output}, 0
    for head_name in SEQUENCE_CLASSIFIER_HEADS:
        head = getattr(module, head_name, None)
        if head is not None:
            names = {name for name, child in module.named_modules() if child is head}
            names |= {f"{prefix}.{sub}" for prefix in names
                      for sub, _ in head.named_modules() if sub}
            return names, sum(parameter.numel() for parameter in head.parameters())
    return set(), 0
