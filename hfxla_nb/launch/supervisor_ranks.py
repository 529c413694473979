"""Ranks that run in the supervisor itself: its death without a word is theirs.

The supervisor (the process a launch forks from the kernel) runs the ranks itself with
`strategy="spmd"`, and with "replicated" where xmp.spawn would fork a single process
(XLA:CPU, a one-chip TPU host: `_xla.spawn` saves that second fork of a process as big as
the kernel). No process is left to watch it there, so when it is killed by a signal (the
out-of-memory killer's SIGKILL) or leaves by `os._exit(3)` before its ranks said anything,
the notebook names that from the supervisor's exit status, as the supervisor names a pool
process's death (`ProcessExited`): "process 1234 killed by SIGKILL", the ranks "killed".
"""

from __future__ import annotations

from typing import Any

from ..events import ProcessExited
from ..states import Outcome
from .record import RecordKeeper
from .supervision import Supervision


class SupervisorRanksKeeper(RecordKeeper):
    """A `RecordKeeper` for which a supervisor that ran ranks and exited abnormally, with no
    failure known, is a `ProcessExited` of those ranks' process."""

    def outcome_after_exit(self, status: int) -> Outcome:
        supervisor = self.record.process_group  # the supervisor's pid (it leads the group)
        ranks = self.pid_ranks.get(supervisor, set()) if supervisor is not None else set()
        running = any(r.exit_state.active for r in self.record.ranks if r.rank in ranks)
        if status and self.failure is None and running:
            self.handle(ProcessExited(rank=None, pid=supervisor, signal=-status)
                        if status < 0 else
                        ProcessExited(rank=None, pid=supervisor, exitcode=status))
        return super().outcome_after_exit(status)


class OneHostSupervision(Supervision):
    """`Supervision` whose record keeper is a `SupervisorRanksKeeper`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        old = self.keeper
        self.keeper = SupervisorRanksKeeper(old.record, old.timeout, old.heartbeat_timeout)
