"""`LaunchError`: what the cell raises when a launched function failed.

Its message (`supervision.failure_message`) says how the launch failed or timed out.

The cell's traceback ends at the user's call, not in the launcher. IPython shows every frame
of a traceback, the last one always (it ignores `__tracebackhide__` there), so a failed launch
would show a launcher frame between the user's cell and the message, which already holds the
remote traceback. In IPython, `LaunchError` gets a custom exception handler that shows the
same traceback without hfxla_nb's frames; nothing changes where another handler is already
set, or outside IPython.

`LaunchError` is also torch's `ChildFailedError`, so importing this module imports torch.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ..states import BaseLaunchRecord, RankState

# -- the traceback without hfxla_nb's frames --

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hide_launcher_frames(error_class: type[BaseException]) -> None:
    """Have IPython show `error_class`'s tracebacks without hfxla_nb's frames (installed
    when the first `LaunchError` is made: `launch.errors` imports torch)."""
    shell_module = sys.modules.get("IPython.core.interactiveshell")
    shell = getattr(getattr(shell_module, "InteractiveShell", None), "_instance", None)
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return
    current = tuple(getattr(shell, "custom_exceptions", ()) or ())
    if current == (error_class,):
        return
    if current:
        return  # the user's (or another library's) handler stays
    shell.set_custom_exc((error_class,), _show_without_our_frames)


def _show_without_our_frames(shell: Any, etype: type, value: BaseException,
                             tb: types.TracebackType | None,
                             tb_offset: int | None = None) -> list[str]:
    value.__traceback__ = without_package_frames(tb)
    shell.showtraceback((etype, value, value.__traceback__), tb_offset=tb_offset,
                        running_compiled_code=True)
    return []


def without_package_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The same traceback without the frames of hfxla_nb's own files (outermost first)."""
    kept = []
    while tb is not None:
        if not is_package_file(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for entry in reversed(kept):
        rebuilt = types.TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def is_package_file(path: str) -> bool:
    """Whether `path` is one of hfxla_nb's own files."""
    return os.path.abspath(path).startswith(_PACKAGE + os.sep)


# -- LaunchError: what the cell raises --

class LaunchError(RuntimeError, ChildFailedError):
    """A launched function failed. `record` holds every rank's state; the message carries
    the failing rank, its exception and its remote traceback.

    It is also torch's `ChildFailedError` (what `accelerate.notebook_launcher` raises
    through torchelastic), so `except ChildFailedError` and `pytest.raises(
    ChildFailedError, match=...)` written for accelerate catch it: `failures` maps each
    failed rank to a `ProcessFailure` whose `message` is that rank's error.

    Args:
        message: what went wrong (`launch.failure.failure_message`).
        record: the launch's `LaunchRecord`.
    """

    def __init__(self, message: str, record: BaseLaunchRecord | None = None) -> None:
        # Not ChildFailedError.__init__: it would write its own banner as the message.
        RuntimeError.__init__(self, message)
        self.record = record
        self.name = "hfxla_nb.notebook_launcher"
        self.failures = _process_failures(record, message)


def _process_failures(record: BaseLaunchRecord | None,
                      message: str) -> dict[int, ProcessFailure]:
    """torchelastic's view of a failed launch: failed rank -> `ProcessFailure` (never empty:
    a launch that timed out with no failed rank is named by its rank 0)."""
    failed = {RankState.FAILED, RankState.KILLED, RankState.TIMEOUT}
    ranks = [] if record is None else [r for r in record.ranks if r.exit_state in failed]
    failures = {}
    for rank in ranks or [None]:
        # torchelastic's convention: a process killed by a signal exited with -signal.
        exitcode = -rank.signal if rank is not None and rank.signal is not None else 1
        failure = ProcessFailure(local_rank=0 if rank is None else rank.rank,
                                 pid=-1 if rank is None or rank.pid is None else rank.pid,
                                 exitcode=exitcode, error_file="<N/A>")
        failure.message = (rank.error if rank is not None else None) or message.splitlines()[0]
        failures[failure.local_rank] = failure
    return failures


def launch_error(message: str, record: BaseLaunchRecord) -> LaunchError:
    """The `LaunchError` the cell raises, with IPython set to show its traceback without
    hfxla_nb's frames (`kernel_traceback`)."""
    hide_launcher_frames(LaunchError)
    return LaunchError(message, record)
