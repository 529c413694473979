"""`hx.doctor()` and `%xla_doctor`: one command that checks this host end to end and gives a
report to paste into an issue.

In at most `TIME_LIMIT` seconds, each step with a limit of its own (`STEPS`): the versions and
whether they pair, the host and its chips, who holds the device files, the environment
variables, a trivial launch, every device (a compile and execution, an all-reduce over an SPMD
mesh, a bf16 matmul against fp32, memory), the compile cache across two processes (TPU only),
and a 20-step demo fine-tune. Every step that launches does it in workers: the kernel's XLA
runtime stays unstarted, and a step that hangs is stopped at its limit ("timed out").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone

from .._version import __version__
from ..runtime.doctor_report import Check, DoctorReport
from ..runtime.info import RuntimeInfo, detect
from . import kernel_steps, launched_steps

__all__ = ["STEPS", "TIME_LIMIT", "doctor"]

#: The whole run's limit, in seconds.
TIME_LIMIT = 90.0
#: Each step: its name, its function, and its own limit in seconds (fewer when less of
#: `TIME_LIMIT` is left).
STEPS: tuple[tuple[str, Callable[[RuntimeInfo, float], Check], float], ...] = (
    ("versions", lambda info, limit: kernel_steps.versions(info), 5.0),
    ("host", lambda info, limit: kernel_steps.host(info), 5.0),
    ("device files", lambda info, limit: kernel_steps.device_files(info), 5.0),
    ("environment", lambda info, limit: kernel_steps.environment(info), 5.0),
    ("launch", launched_steps.launch, 25.0),
    ("devices", launched_steps.devices, 30.0),
    ("compile cache", launched_steps.compile_cache, 40.0),
    ("fine-tune", launched_steps.fine_tune, 45.0),
)
#: The least time a step starts with; with less left, it is skipped.
_LEAST = 2.0
#: A step's thread is waited for this long past its limit (its launch stops at the limit).
_GRACE = 10.0


def run_step(name: str, step: Callable[[RuntimeInfo, float], Check], info: RuntimeInfo,
             limit: float, grace: float = _GRACE) -> Check:
    """`step(info, limit)` in a thread, given `limit` seconds and `grace` more (a launch
    stops itself at `limit`); a step not back by then is "timed out", one that raised
    "failed"."""
    outcome: list[Check | BaseException] = []

    def body() -> None:
        try:
            outcome.append(step(info, limit))
        except BaseException as error:  # noqa: BLE001 - a step's bug is a failed step
            outcome.append(error)

    began = time.perf_counter()
    thread = threading.Thread(target=body, name=f"hfxla_nb-doctor-{name}", daemon=True)
    thread.start()
    thread.join(limit + grace)
    seconds = time.perf_counter() - began
    if not outcome:
        return Check(name, "timed out", f"not done in {limit:.0f} s, its limit", seconds=seconds,
                     fix=f"a busy host is slow and a hang never ends: give it more time, "
                     f"hx.doctor(steps=({name!r},), time_limit=300), and if it still times "
                     "out, report this report.")
    result = outcome[0]
    if isinstance(result, BaseException):
        return Check(name, "failed", f"{type(result).__name__}: {result}", seconds=seconds,
                     fix="this is a bug in the doctor: report it with this report.")
    if not result.seconds:
        result.seconds = seconds
    return result


def doctor(*, steps: tuple[str, ...] | None = None, time_limit: float = TIME_LIMIT,
           show: bool = True) -> DoctorReport:
    """Check this host end to end, each step within its limit, and report.

    Args:
        steps: the names of the steps to run (default: every step of `STEPS`); the others
            are "skipped".
        time_limit: the whole run's limit in seconds; each step's own limit (`STEPS`) grows
            or shrinks with it.
        show: in a notebook, say which step runs while it runs.

    Returns:
        A `DoctorReport`: a panel in a notebook; `to_markdown()` for an issue, `to_json()` as
        data.

    Raises:
        ValueError: a step name that does not exist (the message lists them).
    """
    names = [name for name, _, _ in STEPS]
    unknown = sorted(set(steps or ()) - set(names))
    if unknown:
        raise ValueError(f"no step {', '.join(map(repr, unknown))}; the steps are "
                         f"{', '.join(map(repr, names))}.")
    began = time.perf_counter()
    info = detect()
    progress = _Progress(show)
    checks = []
    scale = time_limit / TIME_LIMIT  # each step's own limit, in proportion
    for index, (name, step, own_limit) in enumerate(STEPS):
        left = time_limit - (time.perf_counter() - began)
        if steps is not None and name not in steps:
            checks.append(Check(name, "skipped", "not asked for"))
            continue
        if left < _LEAST:
            checks.append(Check(name, "skipped", f"the run's {time_limit:.0f} s were spent"))
            continue
        progress.say(f"hfxla_nb doctor: step {index + 1} of {len(STEPS)}, {name} ...")
        limit = min(own_limit * scale, left)
        checks.append(run_step(name, step, info, limit, grace=max(0.0, min(_GRACE, left - limit))))
    progress.close()
    return DoctorReport(checks=checks, seconds=time.perf_counter() - began,
                        created=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                        version=__version__, env=dict(info.env))


class _Progress:
    """One line in the cell, replaced as the steps go, emptied at the end (a notebook only).

    The line is sent as a raw text/plain bundle: `display(str)` would show the string's repr,
    quotes included, and an empty string as a stray `''` line above the report.
    """

    def __init__(self, show: bool) -> None:
        self._show = False
        self._handle = None
        if show:
            from ..ui.modes import in_notebook

            self._show = in_notebook()

    def say(self, line: str) -> None:
        if not self._show:
            return
        if self._handle is None:
            from IPython.display import display

            self._handle = display({"text/plain": line}, raw=True, display_id=True)
        else:
            self._handle.update({"text/plain": line}, raw=True)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.update({"text/plain": ""}, raw=True)
