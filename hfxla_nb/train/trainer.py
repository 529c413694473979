"""For `transformers.Trainer` users: XLA-safe `TrainingArguments` and hfxla_nb progress panels.

```python
def train(index):                                  # launched: hx.notebook_launcher(train)
    args = hx.xla_training_arguments(output_dir="out", max_steps=100, logging_steps=10)
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[hx.XlaProgressCallback()])
    trainer.train()
```

`XlaProgressCallback` shows the run in hfxla_nb's live panels, from a launched worker
(`Progress` events; the Trainer's own bars removed).

Constructing `TrainingArguments` starts the XLA runtime (its `__post_init__` reads the
device), and a notebook kernel whose runtime has started can no longer launch workers. So
`xla_training_arguments` only works inside a launched function; in the kernel it refuses with
an explanation. Tokenize with `padding="max_length"` (or fixed buckets): the Trainer's
default dynamic padding compiles a new graph for every new batch length.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from .. import _xla, events
from ..events import Progress

# -- XlaProgressCallback: a Trainer run in the live panels --

try:  # transformers is optional for the package; the callback needs it
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - transformers missing
    TrainerCallback = object  # type: ignore[assignment,misc]

__all__ = ["XlaProgressCallback", "xla_training_arguments", "xla_trainer",
           "TrainingArgumentsInKernelError"]

_PROGRESS_CALLBACKS = ("ProgressCallback", "NotebookProgressCallback", "PrinterCallback")
_SUMMARY_SUFFIXES = ("_runtime", "_per_second")



class XlaProgressCallback(TrainerCallback):
    """Shows a `transformers.Trainer` run in hfxla_nb's live panels, from a launched worker.

    Steps, samples per second and the logged values (loss, learning rate, grad norm, eval
    metrics) travel to the notebook as `Progress` events; nothing is read from the device
    that the Trainer did not already read (the loss arrives through `on_log`, after the
    Trainer's own fetch). A Trainer made by `hx.xla_trainer(Trainer)` drops its own
    `ProgressCallback` / `NotebookProgressCallback` / `PrinterCallback` when this callback is
    among its callbacks (transformers' `trainer.remove_callback`): a forked worker cannot draw
    into the notebook, and their bars or printed logs would repeat the panel's. A callback is
    given no handle on its Trainer, so with a plain `Trainer`, remove them yourself:
    `trainer.remove_callback(PrinterCallback)`.

    Outside a launched worker it does nothing.

    Args:
        label: the name of the training bar.
    """

    def __init__(self, label: str = "train") -> None:
        self.label = label
        self.events_sent = 0
        self._eval_step = 0

    # -- plumbing ------------------------------------------------------------------------------

    def _send(self, step: int, total: int | None, values: dict[str, float] | None = None,
              samples: int | None = None, label: str | None = None) -> None:
        if events.emit(Progress(events.worker_rank(), int(step), total, values or {}, samples,
                                label or self.label)):
            self.events_sent += 1

    @staticmethod
    def _samples(args, state) -> int | None:
        batch = getattr(args, "train_batch_size", None) or getattr(
            args, "per_device_train_batch_size", None
        )
        accumulation = getattr(args, "gradient_accumulation_steps", 1) or 1
        if not batch:
            return None
        return int(state.global_step * batch * accumulation)

    # -- events --------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        self._send(state.global_step, state.max_steps or None, samples=0)

    def on_step_end(self, args, state, control, **kwargs):
        from ..observe.reporting import report

        # No device values: report never fetches here, it only throttles the bar updates.
        report(step=state.global_step, total=state.max_steps or None,
               samples=self._samples(args, state), label=self.label)

    def on_log(self, args, state, control, logs=None, **kwargs):
        values = {}
        for key, value in (logs or {}).items():
            # Timing summaries (train_runtime, ..._per_second, total_flos) would crowd the bar.
            if key.endswith(_SUMMARY_SUFFIXES) or key == "total_flos":
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                values[key] = float(value)
        if not values:
            return
        label = self.label
        if any(key.startswith("eval_") for key in values):
            label = "eval"
            values = {key[5:] if key.startswith("eval_") else key: v for key, v in values.items()}
        self._send(state.global_step, state.max_steps or None, values,
                   self._samples(args, state), label)

    def on_prediction_step(self, args, state, control, **kwargs):
        self._eval_step += 1
        loader = kwargs.get("eval_dataloader")
        total = None
        try:
            total = len(loader) if loader is not None else None
        except TypeError:
            pass
        from ..observe.reporting import report

        report(step=self._eval_step, total=total, label="eval")

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self._eval_step = 0

    def on_train_end(self, args, state, control, **kwargs):
        self._send(state.global_step, state.global_step, samples=self._samples(args, state))


# -- XLA-safe TrainingArguments, only inside a launched function --

class TrainingArgumentsInKernelError(RuntimeError):
    """`TrainingArguments` would start the XLA runtime in the notebook kernel."""


def _explicit(kwargs: dict[str, Any], name: str) -> bool:
    return name in kwargs


def xla_training_arguments(*, fsdp: bool = False, model: Any = None,
                           arguments_class: Any = None, **kwargs: Any):
    """`transformers.TrainingArguments` with the XLA pitfalls fixed. Only inside a launched
    function: constructing `TrainingArguments` starts the XLA runtime.

    What it changes, and why (each change is listed in a `UserWarning` and in the returned
    object's `hfxla_nb_changes`):

    - `optim="adamw_torch"`: the default fused AdamW fails on XLA (`fused=True requires ...`).
    - `dataloader_drop_last=True` (unless given): a ragged last batch is a new shape, hence a
      new compilation, every epoch. The Trainer applies it to evaluation too, so evaluate on
      a multiple of the evaluation batch size (`fine_tune` pads instead and loses no row).
    - `eval_accumulation_steps=1` (unless given): without it, predictions pile up on the
      device in a tensor whose shape changes every step, compiling a graph per evaluation
      step (measured: 17 compiles instead of 3 for 15 evaluation batches).
    - `dataloader_pin_memory=False` (unless given): pinned memory is a CUDA feature.
    - `report_to="none"` (unless given), as transformers 5's default (4.x reported to every
      tracker installed). Pass `report_to="tensorboard"` or `"wandb"` to use the Trainer's
      own trackers in the launched worker (a W&B run the Trainer leaves open is finished when the
      function returns: `launch.worker.finish_like_a_script`).
    - `disable_tqdm=True` (unless given): tqdm bars cannot draw from a forked worker; add
      `XlaProgressCallback()` to see progress in the notebook instead.
    - a warning (no change) for `logging_steps` under 10: every logging step fetches the loss
      from the device (a sync), and with `logging_steps=1` the Trainer syncs about 9 times
      per step.
    - `gradient_checkpointing=False`: transformers' (and trl's `SFTConfig` default) goes through
      `torch.utils.checkpoint`, which fails on XLA ("module 'torch' has no attribute 'xla'") and
      XLA's compiler would remove anyway. When it was asked for, torch_xla's own checkpoint
      recomputes each layer instead: through FSDPv2 (`xla_fsdp_grad_ckpt`) with `fsdp=True`,
      else on the layers of `model` (given), else it is refused.
    - trl's `SFTConfig`: `packing_strategy="wrapped"` with packing (the default "bfd" is
      padding-free: a row of a new length, so a new compile, every step) and
      `pad_to_multiple_of=max_length` (unless given): one shape.
    - `bf16=False` (unless given) off a TPU: bfloat16 autocast on XLA's CPU devices mixes
      dtypes in attention (trl's `SFTConfig` turns it on by default).
    - `fsdp=True` (with `model=`): what FSDPv2 needs, as optimum-tpu's
      `get_fsdp_training_args(model)` gave: SPMD on, `fsdp="full_shard"`, `fsdp_config` with
      the model's layer class to wrap (`_no_split_modules`), `xla` and `xla_fsdp_v2`, and
      `dataloader_drop_last=True`. Build the trainer with `hx.xla_trainer(Trainer)(...)`:
      transformers' Trainer otherwise never creates the optimizer under FSDPv2.

    Args:
        fsdp: shard the model with PyTorch/XLA's FSDPv2 over every device (the worker must be
            launched with `strategy="spmd"`).
        model: the model to train (needed by `fsdp=True` and by gradient checkpointing
            without it); a `PeftModel` is looked through.
        arguments_class: `TrainingArguments` (default) or a subclass such as trl's
            `SFTConfig`.
        kwargs: any arguments of `arguments_class`; `output_dir` defaults to
            "hfxla_nb_trainer_output".

    Returns:
        The `TrainingArguments`, with an added attribute `hfxla_nb_changes` (list of str).

    Raises:
        TrainingArgumentsInKernelError: in a notebook kernel (no launched worker) whose XLA
            runtime has not started: it would start it, and later launches would refuse.
    """
    _refuse_in_kernel()
    from transformers import TrainingArguments

    arguments_class = arguments_class or TrainingArguments
    changes: list[str] = []
    _checkpointing_and_fsdp(kwargs, arguments_class, fsdp, model, changes)
    optim = str(kwargs.get("optim", "adamw_torch_fused"))
    if optim in ("adamw_torch_fused", "OptimizerNames.ADAMW_TORCH_FUSED"):
        kwargs["optim"] = "adamw_torch"
        changes.append(
            f"optim={optim!r} -> 'adamw_torch' (fused AdamW does not run on XLA)"
        )
    defaults = {
        "dataloader_drop_last": (True, "a ragged last batch would compile a new graph; "
                                 "evaluation drops its ragged batch too"),
        "eval_accumulation_steps": (1, "predictions would pile up on the device in a tensor "
                                       "of changing shape, one compile per evaluation step"),
        "dataloader_pin_memory": (False, "pinned memory is for CUDA"),
        "report_to": ("none", "no tracker unless asked for: pass report_to='tensorboard' "
                              "or 'wandb'"),
        "disable_tqdm": (True, "tqdm cannot draw from a worker; use XlaProgressCallback()"),
    }
    for name, (value, why) in defaults.items():
        if not _explicit(kwargs, name):
            kwargs[name] = value
            changes.append(f"{name}={value!r} ({why})")
    kwargs.setdefault("output_dir", "hfxla_nb_trainer_output")
    logging_steps = kwargs.get("logging_steps")
    if isinstance(logging_steps, (int, float)) and 0 < logging_steps < 10 and (
        kwargs.get("logging_strategy", "steps") == "steps"
    ):
        warnings.warn(
            f"logging_steps={logging_steps}: every logging step fetches the loss from the "
            "device, a host-device sync (with logging_steps=1 the Trainer syncs about 9 times "
            "per step). Log every 10 or more steps for speed on XLA.",
            UserWarning,
            stacklevel=2,
        )
    arguments = arguments_class(**kwargs)
    arguments.hfxla_nb_changes = changes
    if changes:
        warnings.warn(
            "xla_training_arguments changed: " + "; ".join(changes), UserWarning, stacklevel=2
        )
    return arguments


def _refuse_in_kernel() -> None:
    """Raise `TrainingArgumentsInKernelError` in a notebook kernel (no launched worker) whose
    XLA runtime has not started: `TrainingArguments` would start it."""
    use_xla = os.environ.get("USE_TORCH_XLA", "1").upper() not in ("0", "FALSE", "NO", "OFF")
    if (
        use_xla
        and _xla.is_installed()
        and events.worker_channel() is None
        and not _xla.runtime_is_initialized()
    ):
        raise TrainingArgumentsInKernelError(
            "xla_training_arguments() (like transformers.TrainingArguments) starts the XLA "
            "runtime, and a notebook kernel whose runtime has started cannot launch workers any "
            "more (they would hang). Build the arguments inside the function you launch:\n\n"
            "    def train(index):\n"
            "        args = hx.xla_training_arguments(output_dir='out', max_steps=100)\n"
            "        Trainer(model, args, ..., callbacks=[hx.XlaProgressCallback()]).train()\n\n"
            "    hx.notebook_launcher(train)\n\n"
            "(Set USE_TORCH_XLA=0 for a plain CPU Trainer without XLA.)"
        )


def _layer_classes(model: Any) -> set[type]:
    """The classes of `model`'s repeated layers (`_no_split_modules`: what FSDP wraps)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return {type(module) for module in model.modules() if type(module).__name__ in names}


def _checkpointing_and_fsdp(kwargs: dict[str, Any], arguments_class: Any, fsdp: bool,
                            model: Any, changes: list[str]) -> None:
    """Gradient checkpointing through torch_xla's own checkpoint, and FSDPv2's arguments."""
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(arguments_class)}
    checkpointing = bool(kwargs.get("gradient_checkpointing",
                                    defaults.get("gradient_checkpointing", False)))
    layers = _layer_classes(model) if model is not None else set()
    if fsdp:
        if model is None or not layers:
            raise ValueError(
                "xla_training_arguments(fsdp=True) needs model=<the model to train>: FSDPv2 "
                "wraps each of its repeated layers (the classes in model._no_split_modules)"
                + ("" if model is None else ", and this model names none") + ".")
        if not _xla.is_spmd():
            _xla.use_spmd()  # before any tensor is on the device; the Trainer makes the mesh
        config = dict(kwargs.get("fsdp_config") or {})
        config.update(transformer_layer_cls_to_wrap=sorted(c.__name__ for c in layers),
                      xla=True, xla_fsdp_v2=True, xla_fsdp_grad_ckpt=checkpointing)
        kwargs.update(fsdp="full_shard", fsdp_config=config)
        kwargs.setdefault("dataloader_drop_last", True)
        wrapped = ", ".join(config["transformer_layer_cls_to_wrap"])
        changes.append(f"fsdp='full_shard' with FSDPv2 on {wrapped} (SPMD on; build the "
                       "trainer with hx.xla_trainer(Trainer))")
    if checkpointing:
        if fsdp:
            how = "torch_xla's checkpoint through FSDPv2 (xla_fsdp_grad_ckpt)"
        elif layers:
            _xla.checkpoint_layers(model, layers)
            names = ", ".join(sorted(c.__name__ for c in layers))
            how = f"torch_xla's checkpoint on each {names}"
        else:
            raise ValueError(
                "gradient_checkpointing=True goes through torch.utils.checkpoint, which fails on "
                "XLA: pass model=<the model> (its layers are then recomputed with torch_xla's "
                "own checkpoint), or gradient_checkpointing=False.")
        changes.append(f"gradient_checkpointing -> False, recomputing with {how} instead "
                       "(torch.utils.checkpoint fails on XLA)")
    if "gradient_checkpointing" in kwargs or checkpointing:
        kwargs["gradient_checkpointing"] = False
    _fixed_sft_shapes(kwargs, defaults, changes)
    if "bf16" not in kwargs and defaults.get("bf16", False) is not False and (
            _xla.device_type() != "TPU"):  # trl's SFTConfig: None, "on where supported"
        kwargs["bf16"] = False
        changes.append("bf16=False (bfloat16 autocast on XLA's CPU devices mixes dtypes in "
                       "attention; on a TPU it stays)")


def _fixed_sft_shapes(kwargs: dict[str, Any], defaults: dict[str, Any],
                      changes: list[str]) -> None:
    """trl's `SFTConfig`: rows of one length, so training compiles a fixed number of graphs.
    Its default packing ("bfd") is padding-free, one row of a new length every step, and
    without packing batches are padded to their longest row."""
    if "packing_strategy" in defaults and kwargs.get("packing") and (
            "packing_strategy" not in kwargs):
        kwargs["packing_strategy"] = "wrapped"
        changes.append("packing_strategy='wrapped' (rows of max_length; 'bfd' packs padding-"
                       "free rows of a new length, a new compile, every step)")
    length = kwargs.get("max_length", defaults.get("max_length"))
    if "pad_to_multiple_of" in defaults and "pad_to_multiple_of" not in kwargs and (
            isinstance(length, int)):
        kwargs["pad_to_multiple_of"] = length
        changes.append(f"pad_to_multiple_of={length} (every batch padded to max_length: one "
                       "shape, one compile)")


def xla_trainer(trainer_class: Any) -> Any:
    """`trainer_class` (transformers' `Trainer`, trl's `SFTTrainer`, ...) made to work with
    `xla_training_arguments(fsdp=True)`, and its data checked for trl's column formats.

    - Under FSDPv2 the Trainer delays creating the optimizer until after wrapping the model,
      then never creates it (transformers 5: "'NoneType' object has no attribute
      'param_groups'"); this subclass creates it from the wrapped model's parameters
      (FSDPv2 shards them in place) before the scheduler.
    - FSDPv2's output sharding knows only the logits; trl's fused LM head returns
      `log_probs` instead ("the output of the model shouldn't be `None`"): the first
      batch-shaped output is sharded.
    - Under FSDPv2 the Trainer's `save_model` writes the wrapper's raw state dict; a LoRA
      model is saved as peft saves it (`adapter_config.json`, `adapter_model.safetensors`),
      gathered from the shards.
    - trl reads a dataset with a `prompt` column as prompt/completion data and fails with
      `KeyError: 'completion'` without one; refused here with what to rename.
    - With an `XlaProgressCallback` among its callbacks, the Trainer's own progress
      callbacks are removed (`trainer.remove_callback`): the panel shows the progress.

    Example:

    ```python
    args = hx.xla_training_arguments(fsdp=True, model=model, arguments_class=SFTConfig, ...)
    trainer = hx.xla_trainer(SFTTrainer)(model=model, args=args, train_dataset=ds,
                                         peft_config=LoraConfig(...),
                                         callbacks=[hx.XlaProgressCallback()])
    ```
    """
    cached = _TRAINERS.get(trainer_class)
    if cached is not None:
        return cached

    class XlaTrainer(trainer_class):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            _check_trl_columns(kwargs.get("train_dataset"), trainer_class)
            super().__init__(*args, **kwargs)
            _drop_default_progress(self)

        def _wrap_model(self, model: Any, *args: Any, **kwargs: Any) -> Any:
            wrapped = super()._wrap_model(model, *args, **kwargs)
            if hasattr(wrapped, "_shard_output"):  # FSDPv2
                wrapped._shard_output = _shard_batch_output
            return wrapped

        def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
            inner = getattr(self.model, "module", None)
            if not (hasattr(self.model, "_shard_output") and hasattr(inner, "peft_config")):
                return super().save_model(output_dir, _internal_call)
            _save_fsdp_v2_adapter(inner, output_dir or self.args.output_dir,
                                  self.processing_class)

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None):
            if optimizer is None and self.optimizer is None:
                self.create_optimizer()
            return super().create_scheduler(num_training_steps, optimizer)

    XlaTrainer.__name__ = XlaTrainer.__qualname__ = f"Xla{trainer_class.__name__}"
    _TRAINERS[trainer_class] = XlaTrainer
    return XlaTrainer


_TRAINERS: dict[Any, Any] = {}


def _drop_default_progress(trainer: Any) -> None:
    """With an `XlaProgressCallback` among `trainer`'s callbacks, remove the Trainer's own
    progress callbacks, as transformers removes a callback (`trainer.remove_callback`)."""
    callbacks = trainer.callback_handler.callbacks
    if not any(isinstance(callback, XlaProgressCallback) for callback in callbacks):
        return
    # By name: importing NotebookProgressCallback's module would import IPython in a worker.
    for callback in [cb for cb in callbacks if type(cb).__name__ in _PROGRESS_CALLBACKS]:
        trainer.remove_callback(callback)


def _save_fsdp_v2_adapter(peft_model: Any, output_dir: str, processing_class: Any) -> None:
    """A `PeftModel` trained under FSDPv2, saved as peft saves it (the Trainer's own save
    writes the wrapper's raw state dict, huggingface/transformers#29659): its state gathered to the
    host, FSDPv2's wrapper names removed, saved from a host copy (`lora.host_copy`)."""
    from .lora import host_copy

    _xla.sync()  # every tensor holds its value before the one transfer
    state = peft_model.state_dict()
    names = list(state)
    tensors = _xla.to_cpu([state[name] for name in names])
    clean = {name.replace("_orig_module.", ""): tensor
             for name, tensor in zip(names, tensors, strict=True)}
    config = peft_model.peft_config["default"]
    host_copy(peft_model, config, clean).save_pretrained(output_dir)
    if processing_class is not None:
        processing_class.save_pretrained(output_dir)


def _shard_batch_output(output: Any, mesh: Any) -> None:
    """FSDPv2's output sharding, on the batch axis of the output's first batch-shaped tensor:
    the logits, or what trl's fused LM head returns instead (`log_probs`; transformers' own
    `shard_output` only knows the logits and raises on it)."""
    import torch

    values = output.values() if hasattr(output, "values") else (
        output if isinstance(output, tuple) else (output,))
    for value in values:
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            _xla.mark_sharding(value, mesh, ("fsdp",) + (None,) * (value.dim() - 1))
            return


def _check_trl_columns(dataset: Any, trainer_class: Any) -> None:
    columns = set(getattr(dataset, "column_names", None) or ())
    if "trl" not in trainer_class.__module__ or "prompt" not in columns:
        return
    if "completion" not in columns and "messages" not in columns:
        raise ValueError(
            f"{trainer_class.__name__} reads a dataset with a 'prompt' column as prompt/"
            "completion data and needs a 'completion' column (KeyError: 'completion'). Rename "
            "the response column, e.g. dataset.rename_column('response', 'completion') (the "
            "prompt is then not learned), or join both into one 'text' column.")
