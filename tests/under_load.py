"""Run a command while every core is busy: `make test-stress`.

A loaded machine (a shared CI runner, a notebook host running other kernels) is where timing
assumptions break: a grace time too short, a poll that races a process's exit, a bound that
counts what the scheduler decides. This runs the command with one busy process per core, at
the command's own priority (as other users' work would be): `stress-ng --cpu N` where
Debian's stress-ng is installed, else a Python busy loop per core. Its exit status is the command's.

Usage: python tests/under_load.py COMMAND [ARG ...]
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from hfxla_nb.launch.processes import die_with_parent

BUSY_LOOP = "while True: pass"


def start_load(cores: int) -> list[subprocess.Popen]:
    """One busy process per core (`stress-ng` where there is one), each in a session of its own.

    Each gets SIGKILL when this script dies, however it dies: in sessions of their own,
    nothing else would stop them."""
    if shutil.which("stress-ng"):
        command = [["stress-ng", "--cpu", str(cores), "--quiet"]]
    else:
        command = [[sys.executable, "-c", BUSY_LOOP]] * cores
    return [subprocess.Popen(argv, start_new_session=True, preexec_fn=die_with_parent)
            for argv in command]


def stop_load(load: list[subprocess.Popen]) -> None:
    for process in load:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    cores = os.cpu_count() or 1
    # A SIGTERM (a stopped make, a CI timeout) stops the load too, through the `finally` below.
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    load = start_load(cores)
    began = time.monotonic()
    print(f"under_load: {len(load)} load process(es) over {cores} cores "
          f"({'stress-ng' if shutil.which('stress-ng') else 'busy loops'}); running "
          f"{' '.join(argv)}", flush=True)
    try:
        code = subprocess.call(argv)
    finally:
        stop_load(load)
    print(f"under_load: exit {code} after {time.monotonic() - began:.0f} s", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
