"""For `transformers.Trainer` users: XLA-safe `TrainingArguments` and hfxla_nb progress panels.

```python
def train(index):                                  # launched: hx.notebook_launcher(train)
    args = hx.xla_training_arguments(output_dir="out", max_steps=100, logging_steps=10)
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[hx.XlaProgressCallback()])
    trainer.train()
```

Constructing `TrainingArguments` starts the XLA runtime (its `__post_init__` reads the
device), and a notebook kernel whose runtime has started can no longer launch workers. So
`xla_training_arguments` only works inside a launched function; in the kernel it refuses with
an explanation. Tokenize with `padding="max_length"` (or fixed buckets): the Trainer's
default dynamic padding compiles a new graph for every new batch length.
"""

from __future__ import annotations

import inspect
import os
import warnings
from typing import Any

from .. import _xla, events
from ..events import Progress

try:  # transformers is optional for the package; the callback needs it
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - transformers missing
    TrainerCallback = object  # type: ignore[assignment,misc]

__all__ = ["XlaProgressCallback", "xla_training_arguments", "TrainingArgumentsInKernelError"]

_PROGRESS_CALLBACKS = ("ProgressCallback", "NotebookProgressCallback", "PrinterCallback")
_SUMMARY_SUFFIXES = ("_runtime", "_per_second")


class TrainingArgumentsInKernelError(RuntimeError):
    """`TrainingArguments` would start the XLA runtime in the notebook kernel."""


class XlaProgressCallback(TrainerCallback):
    """Shows a `transformers.Trainer` run in hfxla_nb's live panels, from a launched worker.

    Steps, samples per second and the logged values (loss, learning rate, grad norm, eval
    metrics) travel to the notebook as `Progress` events; nothing is read from the device
    that the Trainer did not already read (the loss arrives through `on_log`, after the
    Trainer's own fetch). When it is in a Trainer's callbacks, the Trainer's own
    `ProgressCallback` / `NotebookProgressCallback` / `PrinterCallback` are removed: a forked
    worker cannot draw into the notebook, and tqdm bars would only clutter the log.

    Outside a launched worker it does nothing.

    Args:
        label: the name of the training bar.
    """

    def __init__(self, label: str = "train") -> None:
        self.label = label
        self.events_sent = 0
        self._removed = False
        self._eval_step = 0

    # -- plumbing ------------------------------------------------------------------------------

    def _send(self, step: int, total: int | None, values: dict[str, float] | None = None,
              samples: int | None = None, label: str | None = None) -> None:
        if events.emit(Progress(events.worker_rank(), int(step), total, values or {}, samples,
                                label or self.label)):
            self.events_sent += 1

    def _remove_default_progress(self) -> None:
        """Drop the Trainer's own progress callbacks from the handler that calls us.

        A callback is not told its handler, so the caller's frame is looked up: the event is
        dispatched by `CallbackHandler.call_event`, whose `self` holds the callback list.
        """
        if self._removed:
            return
        frame = inspect.currentframe()
        try:
            for _ in range(6):
                frame = frame.f_back if frame is not None else None
                if frame is None:
                    return
                handler = frame.f_locals.get("self")
                callbacks = getattr(handler, "callbacks", None)
                if isinstance(callbacks, list) and any(cb is self for cb in callbacks):
                    # A new list: the handler may be iterating over the old one right now.
                    handler.callbacks = [
                        cb for cb in callbacks if type(cb).__name__ not in _PROGRESS_CALLBACKS
                    ]
                    self._removed = True
                    return
        finally:
            del frame

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

    def on_init_end(self, args, state, control, **kwargs):
        self._remove_default_progress()

    def on_train_begin(self, args, state, control, **kwargs):
        self._remove_default_progress()
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


def _explicit(kwargs: dict[str, Any], name: str) -> bool:
    return name in kwargs


def xla_training_arguments(**kwargs: Any):
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
    - `report_to="none"` (unless given): no experiment trackers are installed in a worker.
    - `disable_tqdm=True` (unless given): tqdm bars cannot draw from a forked worker; add
      `XlaProgressCallback()` to see progress in the notebook instead.
    - a warning (no change) for `logging_steps` under 10: every logging step fetches the loss
      from the device (a sync), and with `logging_steps=1` the Trainer syncs about 9 times
      per step.

    Args:
        kwargs: any `TrainingArguments` arguments; `output_dir` defaults to
            "hfxla_nb_trainer_output".

    Returns:
        The `TrainingArguments`, with an added attribute `hfxla_nb_changes` (list of str).

    Raises:
        TrainingArgumentsInKernelError: in a notebook kernel (no launched worker) whose XLA
            runtime has not started: it would start it, and later launches would refuse.
    """
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
    from transformers import TrainingArguments

    changes: list[str] = []
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
        "report_to": ("none", "no experiment tracker in a worker"),
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
    arguments = TrainingArguments(**kwargs)
    arguments.hfxla_nb_changes = changes
    if changes:
        warnings.warn(
            "xla_training_arguments changed: " + "; ".join(changes), UserWarning, stacklevel=2
        )
    return arguments
