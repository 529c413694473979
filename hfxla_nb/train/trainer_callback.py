"""`hx.XlaProgressCallback`: a `transformers.Trainer` run shown in hfxla_nb's live panels, from
a launched worker (`Progress` events; the Trainer's own bars removed). Imports transformers.
"""

from __future__ import annotations

import inspect

from .. import events
from ..events import Progress

try:  # transformers is optional for the package; the callback needs it
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - transformers missing
    TrainerCallback = object  # type: ignore[assignment,misc]

__all__ = ["XlaProgressCallback"]

_PROGRESS_CALLBACKS = ("ProgressCallback", "NotebookProgressCallback", "PrinterCallback")
_SUMMARY_SUFFIXES = ("_runtime", "_per_second")



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
