"""`hx.plan_memory`: what a fine-tune needs per device and on disk, against what there is,
before any fork.

```python
plan = hx.plan_memory("google/gemma-2b", batch_size=8, max_length=1024, hardware="v5e-1")
plan.fits, plan.total_gib, plan.changes     # the changes that would make it fit, cheapest first
plan.check()                                # raises MemoryPlanError with the numbers when not
plan                                        # in a notebook: the table (ui.panels)
```

- The device: a TPU host by name (`runtime.environment.TPU_HOSTS`), this machine, or the CPU's
  virtual devices; how many XLA devices it has and what one of them can use.
- The model's facts, read from a build on the `meta` device (no weights, no memory): exact
  parameter counts, the linear layers LoRA may target, the sizes the activations depend on.
- LoRA's size before any adapter exists: the default rank, the layers a `target_modules`
  matches (as peft's `"all-linear"` matches them) and the parameters the adapters train.
  `train.lora` checks `lora=` with these.
- The sums: bytes per device of the weights, gradients, optimizer state and activations for
  one setting. Activations are an estimate (docs/memory.md gives the formulas and what is
  verified where).
- The plan (`MemoryPlan`), and the changes that would make it fit.
- The disk: what a run writes to its output folder, against the free space there, so a full
  disk is refused before any training, not found at the final save (docs/fine-tune.md, "A
  full disk", says what is counted).

All but the meta builds and `free_space` (which reads the file system) are pure functions.
torch and transformers are imported inside the functions that need them: `import hfxla_nb`
stays cheap.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime.environment import TPU_GENERATIONS, TPU_HOSTS, cpu_device_count, detect_accelerator
from .config import FineTuneError, resolve_precision

# -- the device a plan is for --

GIB = 2**30
# What a TPU device's runtime keeps for itself: "reserved 530.00M" in XLA's own HBM reports
# (pytorch/xla #1735, LargeWorldModel/LWM #60; tests/data/hbm).
TPU_RESERVED_BYTES = 530 * 2**20
_GENERATIONS = {generation.name: generation for generation in TPU_GENERATIONS}


@dataclass(frozen=True)
class PlanDevice:
    """Where a plan would run.

    Attributes:
        name: "v5e-1", "TPU v5e x 4" (this machine) or "CPU".
        kind: "tpu" or "cpu".
        devices: the XLA devices the host has.
        usable_bytes: what one device can use: its HBM less the TPU runtime's reserve, or the
            host's memory over the CPU's virtual devices.
    """

    name: str
    kind: str
    devices: int
    usable_bytes: int


def plan_device(hardware: str | None, environ: Mapping[str, str] | None = None) -> PlanDevice:
    """The device `plan_memory(hardware=...)` names; None is this machine (never starts the
    runtime).

    Raises:
        FineTuneError: for a hardware name that is not a known host, "cpu" or None.
    """
    environ = os.environ if environ is None else environ
    if hardware is None:
        accelerator = detect_accelerator(environ=environ)
        if accelerator.kind == "tpu" and accelerator.generation in _GENERATIONS:
            return tpu_device(accelerator.generation, accelerator.chips,
                              f"TPU {accelerator.generation} x {accelerator.chips}")
        hardware = "cpu"
    key = hardware.strip().lower()
    if key in TPU_HOSTS:
        generation, chips = TPU_HOSTS[key]
        return tpu_device(generation, chips, key)
    if key == "cpu":
        return cpu_devices(cpu_device_count(environ) or 1)
    raise FineTuneError(f"hardware={hardware!r} is not one plan_memory knows: pass one of "
                        f"{sorted(TPU_HOSTS)}, 'cpu', or None (this machine).")


def tpu_device(generation_name: str, chips: int, name: str) -> PlanDevice:
    """A host of `chips` chips of one generation: every XLA device's HBM less the reserve."""
    generation = _GENERATIONS[generation_name]
    per_device = round(generation.hbm_per_device_gib * GIB) - TPU_RESERVED_BYTES
    return PlanDevice(name, "tpu", chips * generation.cores_per_chip, per_device)


def cpu_devices(count: int) -> PlanDevice:
    """`count` virtual CPU devices, sharing the host's memory."""
    return PlanDevice("CPU", "cpu", count, host_memory() // count)


def eight_chip_host(device: PlanDevice) -> str | None:
    """The 8-chip host of a one-chip TPU host's generation ("v5e-1" -> "v5e-8"), if there is
    one."""
    generation = TPU_HOSTS.get(device.name, (None,))[0]
    bigger = [name for name, (kind, chips) in TPU_HOSTS.items()
              if kind == generation and chips == 8]
    return bigger[0] if bigger else None


def host_memory() -> int:
    """The host's memory: a CPU's virtual XLA devices share it."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# -- the model's facts, from a build on the meta device --

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


# -- LoRA's size before any adapter exists --

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


# -- the sums: bytes per device of each part --

TRAINED_BYTES = {"weights": 4, "gradients": 4, "optimizer": 8}  # fp32 master, grad, AdamW m+v
FROZEN_BYTES = {"fp32": 4, "bf16": 2}
ACTIVATION_BYTES = {"fp32": 4, "bf16": 2}


@dataclass(frozen=True)
class PartSizes:
    """Bytes per device of each part of a plan, and the trainable parameters.

    Attributes:
        trainable: parameters the optimizer updates.
        weights, gradients, optimizer: the state per device (split over the devices with
            "fsdp").
        activations_full, activations_checkpointed: what the backward pass keeps, without and
            with gradient checkpointing.
    """

    trainable: int
    weights: int
    gradients: int
    optimizer: int
    activations_full: int
    activations_checkpointed: int


@dataclass(frozen=True)
class PlanSettings:
    """The settings a plan is summed for: `plan_memory`'s arguments once "auto" is decided.

    Attributes:
        batch_size, max_length: the global batch (split over `devices`) and tokens per row.
        precision: "fp32" or "bf16".
        lora_rank: the adapters' rank, or None for a full fine-tune.
        target_modules: the layers the adapters go on (peft's matching).
        sharding: "data" or "fsdp".
        gradient_checkpointing: whether activations are recomputed in the backward pass.
        devices: the XLA devices used.
        modules_to_save: what a LoRA config trains whole besides its adapters.
        lora_dropout: the adapters' dropout.
    """

    batch_size: int
    max_length: int
    precision: str
    lora_rank: int | None
    target_modules: TargetModules
    sharding: str
    gradient_checkpointing: bool
    devices: int
    modules_to_save: tuple[str, ...] = ()
    lora_dropout: float = 0.0


def part_sizes(facts: ModelFacts, settings: PlanSettings) -> PartSizes:
    """Bytes per device of each part (docs/memory.md: the formulas)."""
    if settings.lora_rank:
        trainable = lora_parameter_count(facts, settings.lora_rank, settings.target_modules,
                                         settings.modules_to_save)
        weights = (facts.parameters * FROZEN_BYTES[settings.precision]
                   + trainable * TRAINED_BYTES["weights"])
    else:
        trainable = facts.parameters
        weights = trainable * TRAINED_BYTES["weights"]  # autocast keeps fp32 master weights
    shards = settings.devices if settings.sharding == "fsdp" else 1
    full, checkpointed = activation_bytes(facts, settings)
    return PartSizes(
        trainable=trainable,
        weights=math.ceil(weights / shards),
        gradients=math.ceil(trainable * TRAINED_BYTES["gradients"] / shards),
        optimizer=math.ceil(trainable * TRAINED_BYTES["optimizer"] / shards),
        activations_full=full,
        activations_checkpointed=checkpointed,
    )


def activation_bytes(facts: ModelFacts, settings: PlanSettings) -> tuple[int, int]:
    """(without, with gradient checkpointing) bytes one device keeps for the backward pass.

    Per token and layer: the two norms' inputs and outputs (4 h), queries and attention output
    (2 x heads x head_dim), keys and values (2 x kv_heads x head_dim), the attention
    probabilities (heads x sequence length), and the MLP's intermediate values (3 x
    intermediate for a gated MLP: gate, up and their product, the down projection's input;
    2 x otherwise: the first projection's output and its activation). Checkpointing
    keeps only each layer's input (h) and recomputes one layer at a time. The language-model
    head adds its logits and their float32 copy for the loss. LoRA's adapters add what they
    keep (`adapter_activation_bytes`). Either way the backward pass holds, beside what was kept,
    the gradients of one layer's activations (as large as what the layer kept) and the
    float32 gradient of the logits while it works through them (docs/memory.md)."""
    tokens = math.ceil(settings.batch_size / settings.devices) * settings.max_length
    element = ACTIVATION_BYTES[settings.precision]
    per_layer = (4 * facts.hidden + 2 * facts.heads * facts.head_dim
                 + 2 * facts.kv_heads * facts.head_dim + facts.heads * settings.max_length
                 + (3 if facts.gated_mlp else 2) * facts.intermediate)
    logits = tokens * facts.vocab * (element + 4)
    adapters = tokens * adapter_activation_bytes(facts, settings)
    working = tokens * (per_layer * element + facts.vocab * 4)
    full = tokens * facts.layers * per_layer * element + adapters + logits + working
    checkpointed = (tokens * (facts.layers * facts.hidden + per_layer) * element
                    + adapters // max(facts.layers, 1) + logits + working)
    return full, checkpointed


def adapter_activation_bytes(facts: ModelFacts, settings: PlanSettings) -> int:
    """Bytes per token LoRA's adapters keep for the backward pass, over the whole model: each
    targeted layer's `x @ A` (rank values, for lora_B's gradient) and, with lora_dropout > 0,
    its own dropped-out copy of the layer's input and the dropout mask (torch_xla multiplies
    by a mask in the input's type), for lora_A's gradient; 0 for a full fine-tune."""
    if not settings.lora_rank:
        return 0
    element = ACTIVATION_BYTES[settings.precision]
    targeted = targeted_layers(facts, settings.target_modules)
    kept = settings.lora_rank * len(targeted) * element
    if settings.lora_dropout:
        kept += sum(fan_in for _, fan_in, _ in targeted) * 2 * element
    return kept


# -- the plan, and the changes that would make it fit --

class MemoryPlanError(FineTuneError):
    """A fine-tune that cannot fit the device's memory; the message has the numbers and the
    changes that would make it fit, cheapest first."""


@dataclass(frozen=True)
class MemoryChange:
    """One change to a plan that does not fit, applied on top of the changes before it.

    Attributes:
        change: what changes, for people ("LoRA r=16 on all linear layers").
        argument: how to ask for it ("lora=True").
        total_gib: GiB per device once it and the changes before it are made.
        fits: whether that total fits the device.
    """

    change: str
    argument: str
    total_gib: float
    fits: bool


@dataclass(frozen=True)
class MemoryPlan:
    """What a fine-tune needs per device, in GiB, against what one device has (plain data).

    Attributes:
        model: the model's name (or type).
        hardware: where it would run ("v5e-1", "TPU v5e x 4 chips", "CPU").
        devices: XLA devices the batch (and with "fsdp" the state) is split over.
        device_memory_gib: memory one device can use: its HBM less what the TPU runtime
            reserves, or on the CPU the host memory over the virtual devices.
        batch_size, max_length: the global batch (split over the devices) and tokens per row.
        precision: "fp32" or "bf16" (bfloat16 autocast; a LoRA's frozen base stored in it).
        lora_rank: the adapters' rank, or None for a full fine-tune.
        sharding: "data" (state replicated on every device) or "fsdp" (split over them).
        gradient_checkpointing: whether activations are recomputed in the backward pass.
        parameters, trainable_parameters: counts, exact.
        parameters_gib, gradients_gib, optimizer_gib: state per device (AdamW: 2 fp32 states
            per trainable parameter).
        activations_gib: what the chosen setting keeps for the backward pass (estimate), with
            `activations_full_gib` and `activations_checkpointed_gib` for both settings.
        total_gib: the sum per device; `fits` when it is at most `device_memory_gib`.
        changes: when it does not fit, the changes that would make it fit, cheapest first.
        notes: what "auto" settings chose and why.
    """

    model: str
    hardware: str
    devices: int
    device_memory_gib: float
    batch_size: int
    max_length: int
    precision: str
    lora_rank: int | None
    sharding: str
    gradient_checkpointing: bool
    parameters: int
    trainable_parameters: int
    parameters_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    activations_full_gib: float
    activations_checkpointed_gib: float
    total_gib: float
    fits: bool
    changes: tuple[MemoryChange, ...] = ()
    notes: tuple[str, ...] = ()

    def check(self) -> MemoryPlan:
        """This plan when it fits; otherwise raises `MemoryPlanError` with the numbers and the
        changes that would make it fit."""
        if not self.fits:
            raise MemoryPlanError(f"this fine-tune does not fit: {self}")
        return self

    def __str__(self) -> str:
        """The plan in words, for messages and `print()`: the total against the device, the
        parts, and the changes that would make it fit. A notebook draws it as a table
        (`ui/plan_panel.py`, registered by `ui/formatters.py`)."""
        verdict = "fits" if self.fits else "does not fit"
        lines = [
            f"{self.model} on {self.hardware} ({self.devices} device"
            f"{'s' if self.devices != 1 else ''}): {self.total_gib:.2f} GiB per device of "
            f"{self.device_memory_gib:.2f}, {verdict}",
            f"  parameters {self.parameters_gib:.2f} GiB, gradients {self.gradients_gib:.2f} "
            f"GiB, optimizer state {self.optimizer_gib:.2f} GiB, activations "
            f"{self.activations_gib:.2f} GiB (estimate)",
        ]
        lines += [f"  note: {note}" for note in self.notes]
        if self.changes:
            lines.append("What would make it fit, cheapest first (each on top of the ones "
                         "before):")
            lines += [f"  {number}. {change.change} ({change.argument}): "
                      f"{change.total_gib:.2f} GiB per device"
                      f"{', fits' if change.fits else ''}"
                      for number, change in enumerate(self.changes, start=1)]
        return "\n".join(lines)


def _plan(facts: ModelFacts, settings: PlanSettings, device: PlanDevice,
          notes: tuple[str, ...] = ()) -> MemoryPlan:
    sizes = part_sizes(facts, settings)
    activations = (sizes.activations_checkpointed if settings.gradient_checkpointing
                   else sizes.activations_full)
    total = sizes.weights + sizes.gradients + sizes.optimizer + activations
    return MemoryPlan(
        model=facts.name, hardware=device.name, devices=settings.devices,
        device_memory_gib=device.usable_bytes / GIB,
        batch_size=settings.batch_size, max_length=settings.max_length,
        precision=settings.precision, lora_rank=settings.lora_rank, sharding=settings.sharding,
        gradient_checkpointing=settings.gradient_checkpointing,
        parameters=facts.parameters, trainable_parameters=sizes.trainable,
        parameters_gib=sizes.weights / GIB, gradients_gib=sizes.gradients / GIB,
        optimizer_gib=sizes.optimizer / GIB, activations_gib=activations / GIB,
        activations_full_gib=sizes.activations_full / GIB,
        activations_checkpointed_gib=sizes.activations_checkpointed / GIB,
        total_gib=total / GIB, fits=total <= device.usable_bytes, notes=notes,
    )


def _changes(facts: ModelFacts, settings: PlanSettings, device: PlanDevice,
             default_rank: int) -> tuple[MemoryChange, ...]:
    """The changes that make a plan fit, cheapest first, each on top of the ones before; it
    stops at the first that fits (or after a batch of one row per device)."""
    steps = []
    if not settings.lora_rank:
        steps.append((f"LoRA r={default_rank} on all linear layers", "lora=True",
                      {"lora_rank": default_rank, "target_modules": "all-linear"}))
    if settings.precision != "bf16":
        steps.append(("bfloat16", "precision='bf16'", {"precision": "bf16"}))
    if not settings.gradient_checkpointing:
        steps.append(("gradient checkpointing", "gradient_checkpointing=True",
                      {"gradient_checkpointing": True}))
    changes: list[MemoryChange] = []
    for change, argument, fields in steps:
        settings = dataclasses.replace(settings, **fields)
        changes.append(_change(facts, settings, device, change, argument))
        if changes[-1].fits:
            return tuple(changes)
    settings, sharded = _shard(facts, settings, device)
    if sharded is not None:
        changes.append(sharded)
        if sharded.fits:
            return tuple(changes)
    smaller = _smaller_batch(facts, settings, device)
    if smaller is not None:
        changes.append(smaller)
    return tuple(changes)


def _change(facts: ModelFacts, settings: PlanSettings, device: PlanDevice, change: str,
            argument: str) -> MemoryChange:
    plan = _plan(facts, settings, device)
    return MemoryChange(change, argument, round(plan.total_gib, 2), plan.fits)


def _shard(facts: ModelFacts, settings: PlanSettings, device: PlanDevice
           ) -> tuple[PlanSettings, MemoryChange | None]:
    """FSDP over this host's devices; on a one-chip TPU host, over the 8 chips of the same
    kind's 8-chip host (v5e-1 -> v5e-8), the cheapest step up."""
    if device.devices > 1:
        count, where = device.devices, "this host's"
    elif device.kind == "tpu":
        bigger = eight_chip_host(device)
        count, where = 8, (f"a {bigger}" if bigger else "an 8-chip host")
    else:
        return settings, None
    if settings.sharding == "fsdp" and settings.devices >= count:
        return settings, None
    sharded = dataclasses.replace(settings, sharding="fsdp", devices=count)
    return sharded, _change(facts, sharded, device, f"FSDP over {count} devices ({where})",
                            "sharding='fsdp'")


def _smaller_batch(facts: ModelFacts, settings: PlanSettings, device: PlanDevice
                   ) -> MemoryChange | None:
    """The largest batch (halving, at least one row per device) that fits, else one row per
    device."""
    batch = settings.batch_size
    while batch > settings.devices:
        batch = max(batch // 2, settings.devices)
        smaller = dataclasses.replace(settings, batch_size=batch)
        if _plan(facts, smaller, device).fits or batch == settings.devices:
            steps = math.ceil(settings.batch_size / batch)
            return _change(facts, smaller, device, f"batch_size={batch}",
                           f"batch_size={batch}, gradient_accumulation_steps={steps}")
    return None


def plan_memory(
    model: Any,
    *,
    batch_size: int = 8,
    max_length: int = 1024,
    precision: str = "auto",
    lora: Any = False,
    sharding: str = "data",
    gradient_checkpointing: bool = False,
    devices: int | None = None,
    hardware: str | None = None,
) -> MemoryPlan:
    """What fine-tuning `model` needs per device, against one device's memory, without training
    or loading any weights.

    Args:
        model: a transformers config, a model name or folder (its config is read with
            `AutoConfig.from_pretrained`), or a transformers model instance.
        batch_size: rows per step over all devices (split over them), as in `fine_tune`.
        max_length: tokens per row.
        precision: "auto" (bfloat16 on a TPU, float32 elsewhere), "bf16" or "fp32". bfloat16
            is autocast: trained weights keep float32 masters, activations and a LoRA's frozen
            base take 2 bytes.
        lora: False (full fine-tune), True (rank from `default_lora_rank`, all linear layers),
            "auto" (LoRA only when the full fine-tune does not fit), or a `peft.LoraConfig` or
            dict with `r` and `target_modules`.
        sharding: "data" (every device holds the whole state), "fsdp" (state split over the
            devices) or "auto" ("fsdp" only when "data" does not fit and there are devices to
            split over).
        gradient_checkpointing: recompute activations in the backward pass.
        devices: XLA devices to use; default all of `hardware`'s.
        hardware: "v5e-1", "v5e-8", "v6e-1", "v4-8", "v3-8", "v2-8" (and "v5e-4", "v6e-8"),
            "cpu" (the host's memory over its virtual devices), or None: this machine.

    Returns:
        A `MemoryPlan`; when it does not fit, its `changes` say what would, cheapest first,
        and `check()` raises `MemoryPlanError` with them.

    Raises:
        FineTuneError: for arguments that cannot work (the message says what to pass).
    """
    _check_positive("batch_size", batch_size)
    _check_positive("max_length", max_length)
    if precision not in ("auto", "fp32", "bf16"):
        raise FineTuneError(f"precision must be 'auto', 'fp32' or 'bf16', got {precision!r}.")
    if sharding not in ("auto", "data", "fsdp"):
        raise FineTuneError(f"sharding must be 'auto', 'data' or 'fsdp', got {sharding!r}.")
    device = plan_device(hardware)
    count = device.devices if devices is None else devices
    _check_positive("devices", count)
    if device.kind == "cpu" and count != device.devices:
        # Virtual CPU devices are as many as asked for (num_processes=), sharing the memory.
        device = cpu_devices(count)
    if count > device.devices:
        raise FineTuneError(f"devices={count}, but {device.name} has {device.devices}: pass at "
                            f"most {device.devices}, or the hardware you mean (hardware=...).")
    config = load_model_config(model)
    facts = model_facts(model, config)
    default_rank = default_lora_rank(config)
    rank, target_modules = lora_choice(lora, default_rank)
    settings = PlanSettings(
        batch_size, max_length,
        resolve_precision(precision, device.kind.upper()),
        rank, target_modules, "data" if sharding == "auto" else sharding,
        bool(gradient_checkpointing), count, lora_modules_to_save(lora), lora_dropout(lora))
    settings, notes = _decide_auto(facts, settings, device, lora, sharding, default_rank)
    plan = _plan(facts, settings, device, notes)
    if plan.fits:
        return plan
    return dataclasses.replace(plan, changes=_changes(facts, settings, device, default_rank))


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FineTuneError(f"{name} must be an integer >= 1, got {value!r}.")


def _decide_auto(facts: ModelFacts, settings: PlanSettings, device: PlanDevice, lora: Any,
                 sharding: str, default_rank: int) -> tuple[PlanSettings, tuple[str, ...]]:
    """Resolve lora="auto" and sharding="auto" from the plan, and say why."""
    notes = []
    if lora == "auto":
        if _plan(facts, settings, device).fits:
            notes.append("lora='auto' chose a full fine-tune: it fits")
        else:
            settings = dataclasses.replace(settings, lora_rank=default_rank)
            notes.append(f"lora='auto' chose LoRA r={default_rank}: the full fine-tune does "
                         "not fit")
    if sharding == "auto" and settings.devices > 1:
        if _plan(facts, settings, device).fits:
            notes.append("sharding='auto' chose 'data': the state fits every device")
        else:
            settings = dataclasses.replace(settings, sharding="fsdp")
            notes.append(f"sharding='auto' chose 'fsdp': the state does not fit one device, "
                         f"so it is split over {settings.devices}")
    return settings, tuple(notes)


# -- the disk: what a run writes, against the free space --

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
