"""`LaunchError`: what the cell raises when a launched function failed.

It is also torch's `ChildFailedError`, so this module imports torch: it is imported only when a
launch fails (and by `hx.LaunchError`, through the package's lazy exports), never by
`import hfxla_nb` or the launcher's own import.
"""

from __future__ import annotations

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ..states import BaseLaunchRecord, RankState
from .kernel_traceback import hide_launcher_frames


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
