"""A forked worker behaves like a script: nothing it does reaches the kernel's sockets.

After the fork the worker still holds what the notebook imported: the IPython shell,
ipykernel's output streams, jupyter_client's session, tqdm's notebook bars (bound by
`from tqdm.auto import tqdm` in a cell, or by transformers, datasets and huggingface_hub at
their import). A forked child cannot use the kernel's sockets (ipykernel drops each message
with "attempted to send message from fork"). Here, in the worker only:

- the shell is cleared, so `IPython.display.display` prints a text form instead;
- the kernel's own stream objects write into the worker's streams (`Log` events);
- the session sends nothing, so widgets and comms created in the worker stay silent;
- every tqdm bar, whatever class the caller holds, reports `Progress` events instead of
  drawing (the notebook draws them);
- transformers' Trainer picks its text progress callback, which uses tqdm.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ..events import Channel, Progress, worker_rank

#: A bar reports at most this often (tqdm's own refresh is throttled too); its end always.
BAR_INTERVAL = 0.2


def leave_the_notebook(channel: Channel) -> None:
    """Make this (forked) process a script as far as notebook machinery goes."""
    _forget_shell()
    _route_kernel_streams()
    _silence_kernel_session()
    _bars_become_events(channel)
    _text_progress_for_trainer()


def cell_numbers() -> dict[str, int]:
    """IPython's file name of each notebook cell -> its execution count (`In [5]`), so that a
    frame in a cell can be named "cell 5"; {} outside IPython (IPython 7 puts the count in
    the name itself: `<ipython-input-5-...>`)."""
    shell_module = sys.modules.get("IPython.core.interactiveshell")
    shell = getattr(getattr(shell_module, "InteractiveShell", None), "_instance", None)
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    return {str(name): int(count) for name, count in names.items()} if names else {}


def _forget_shell() -> None:
    shell_module = sys.modules.get("IPython.core.interactiveshell")
    if shell_module is not None:
        shell_module.InteractiveShell.clear_instance()


def _route_kernel_streams() -> None:
    """ipykernel's `OutStream`s (held by loggers and libraries since the kernel started)
    write into this process's `sys.stdout` / `sys.stderr` instead of the kernel's socket."""
    iostream = sys.modules.get("ipykernel.iostream")
    if iostream is None:
        return

    def write(self: Any, text: str) -> int:
        target = sys.stderr if getattr(self, "name", "") == "stderr" else sys.stdout
        if isinstance(target, iostream.OutStream):  # never loop back into the kernel
            return len(text)
        return target.write(text)

    iostream.OutStream.write = write
    iostream.OutStream.flush = lambda self: None


def _silence_kernel_session() -> None:
    """Messages to the kernel's sockets (display data, comm and widget messages) are dropped
    before jupyter_client would warn about them."""
    session = sys.modules.get("jupyter_client.session")
    if session is not None:
        session.Session.send = lambda self, *args, **kwargs: None


def _bars_become_events(channel: Channel) -> None:
    """Patch tqdm's classes themselves, so that every bar, including subclasses defined by
    libraries at import time and names bound in notebook cells, sends `Progress` events."""
    try:
        import tqdm.std as std
    except ImportError:
        return
    devnull = open(os.devnull, "w")  # noqa: SIM115 - one for the life of the process
    original_init = std.tqdm.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("display", None)  # tqdm.notebook's own argument
        kwargs["file"] = devnull
        self._hfxla_sent = 0.0
        original_init(self, *args, **kwargs)

    def display(self: Any, msg: str | None = None, pos: int | None = None, **_: Any) -> bool:
        now = time.monotonic()
        finished = self.total is not None and self.n >= self.total
        if not finished and now - getattr(self, "_hfxla_sent", 0.0) < BAR_INTERVAL:
            return True
        self._hfxla_sent = now
        channel.send(_bar_event(self))
        return True

    def close(self: Any) -> None:
        if not getattr(self, "disable", True) and not getattr(self, "_hfxla_closed", False):
            self._hfxla_closed = True
            channel.send(_bar_event(self))
        original_close(self)

    original_close = std.tqdm.close
    std.tqdm.__init__ = __init__
    std.tqdm.display = display
    std.tqdm.close = close
    notebook = sys.modules.get("tqdm.notebook")
    if notebook is not None:
        # The notebook bar would build widgets: it behaves as the (patched) text bar instead.
        for name in ("__init__", "display", "close", "clear", "reset", "__iter__", "update",
                     "__repr__"):
            setattr(notebook.tqdm_notebook, name, getattr(std.tqdm, name))


def _bar_event(bar: Any) -> Progress:
    values = {}
    postfix = getattr(bar, "postfix", None)
    if isinstance(postfix, dict):
        values = {k: float(v) for k, v in postfix.items() if _is_number(v)}
    return Progress(
        rank=worker_rank(),
        step=int(bar.n),
        total=int(bar.total) if bar.total else None,
        values=values,
        label=str(bar.desc or "tqdm").rstrip(": ") or "tqdm",
    )


def _text_progress_for_trainer() -> None:
    """transformers chose `NotebookProgressCallback` at import, in the kernel; in a worker
    it would display HTML nobody sees. Its text callback uses tqdm, which reports events."""
    trainer = sys.modules.get("transformers.trainer")
    callbacks = sys.modules.get("transformers.trainer_callback")
    if trainer is not None and callbacks is not None:
        trainer.DEFAULT_PROGRESS_CALLBACK = callbacks.ProgressCallback


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, bool)


def finish_like_a_script(failed: bool = False) -> None:
    """What a script's exit does that the worker's `os._exit` skips: a W&B run left open is
    finished, and W&B's service process stopped (W&B's `atexit` hook does both in a script).
    The Trainer's `report_to="wandb"` never finishes its run: without this, the run's data
    was lost with the worker, its service killed with the launch's processes. W&B is not
    imported here: only a worker that imported it has a run to finish."""
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None)
    if run is None:
        return
    try:
        run.finish(exit_code=1 if failed else 0)
        wandb.teardown()
    except Exception as error:  # noqa: BLE001 - the function's outcome matters more
        print(f"hfxla_nb: could not finish the W&B run: {error!r}", file=sys.stderr)
