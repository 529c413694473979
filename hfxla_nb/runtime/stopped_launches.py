"""Launches whose kernel died, stopped by their own supervisor: one small JSON file each.

A kernel killed mid-launch (a crash, the out-of-memory killer, a forced restart) cannot stop
its launch or say so. The launch's supervisor notices its parent is gone, stops every process
of the launch and writes down what it stopped here, in the system's temporary folder. The
next `hx.detect()` (`%xla_info`) reads these notes and shows them once; `forget` removes them.

Only the standard library: the supervisor writes a note after its kernel is gone, and the
runtime layer reads it without importing torch.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: Notes older than this are not shown (a machine's temporary folder outlives many sessions).
SHOWN_FOR = 7 * 24 * 3600.0


@dataclass(frozen=True)
class StoppedLaunch:
    """A launch stopped because the kernel that started it died.

    Attributes:
        kernel_pid: the process id the kernel had.
        supervisor_pid: the launch's supervisor, which stopped it.
        stopped_at: when (seconds since the epoch).
        processes: every process it stopped, `processes.describe`'s words for each.
        path: the note's file (empty until read back).
    """

    kernel_pid: int
    supervisor_pid: int
    stopped_at: float
    processes: list[str] = field(default_factory=list)
    path: str = ""

    def sentence(self) -> str:
        """One line for a person: whose launch, when, and what was stopped."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.stopped_at))
        stopped = ", ".join(self.processes) or "nothing else"
        return (f"a launch of a kernel that died (pid {self.kernel_pid}) was stopped at "
                f"{when}: {stopped}")


def notes_folder() -> Path:
    """Where the notes go: one folder per user in the system's temporary folder."""
    return Path(tempfile.gettempdir()) / f"hfxla_nb-{os.getuid()}" / "stopped-launches"


def record(launch: StoppedLaunch, folder: Path | None = None) -> Path:
    """Write `launch` as a note, whole or not at all (a temporary file renamed into place).

    Returns:
        The note's path.
    """
    folder = notes_folder() if folder is None else folder
    folder.mkdir(parents=True, exist_ok=True)
    data = {key: value for key, value in asdict(launch).items() if key != "path"}
    path = folder / f"{launch.supervisor_pid}-{int(launch.stopped_at * 1000)}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data))
    os.replace(partial, path)
    return path


def read(folder: Path | None = None, now: float | None = None) -> list[StoppedLaunch]:
    """The notes not yet forgotten and younger than `SHOWN_FOR`, oldest first; unreadable
    ones are skipped."""
    folder = notes_folder() if folder is None else folder
    now = time.time() if now is None else now
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            data = json.loads(path.read_text())
            launch = StoppedLaunch(int(data["kernel_pid"]), int(data["supervisor_pid"]),
                                   float(data["stopped_at"]),
                                   [str(line) for line in data.get("processes", [])],
                                   str(path))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if now - launch.stopped_at <= SHOWN_FOR:
            found.append(launch)
    return sorted(found, key=lambda launch: launch.stopped_at)


def forget(launches: Iterable[StoppedLaunch]) -> None:
    """Remove the notes of `launches` (after they were shown)."""
    for launch in launches:
        if launch.path:
            Path(launch.path).unlink(missing_ok=True)
