"""A launch's processes: who is still alive (read from /proc), and stopping all of them, also
those that left the launch's process group.

Every process of a launch starts in the supervisor's process group (the supervisor calls
`os.setsid`), so one `killpg` reaches them. A process the function starts in a session or
group of its own (`subprocess.Popen(..., start_new_session=True)`, a server, a daemon that
double-forks) is out of that group's reach. Two things catch it:

- The supervisor is a *child subreaper* (`become_subreaper`, `PR_SET_CHILD_SUBREAPER`,
  Linux 3.4+): a process of the launch whose parent exits is adopted by the supervisor, not
  by init, so every descendant stays in the supervisor's process tree, whatever session or
  group it moved to. Before the supervisor exits, `stop_descendants` stops what is still
  running below it (the launcher names them on `last_launch().stopped_processes`).
- Stopping from the notebook (`stop_group`: a failure, a timeout, the stop button) signals
  the group *and* every descendant of its processes, read from /proc before the first
  signal and again while waiting, since the supervisor's own death hands its adoptees to
  init.

Why the supervisor and not the kernel: a subreaper adopts every orphan below it for the rest
of its life. Made one, the notebook kernel would adopt (and never reap: ipykernel waits
only for the processes it started) every orphan of everything the user runs in the kernel,
`!` shell commands and `%pip` included, launch or not. The supervisor lives only as long
as its launch, and its descendants are the launch's by definition.

What is still out of reach: a process that was started by a process of the launch after
the last look at /proc and whose parent then died while the supervisor was already gone
(a window of a few milliseconds while the launch is being stopped), and processes that
change their user (the kernel cannot signal them).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator

TERMINATE_GRACE = 3.0  # seconds between SIGTERM and SIGKILL
# The supervisor's grace for what outlived the ranks: less than the notebook's, whose SIGKILL
# (which no mask blocks) follows its SIGTERM to the supervisor after TERMINATE_GRACE.
LEFTOVER_GRACE = TERMINATE_GRACE / 3
KILL_WAIT = 10.0  # how long a SIGKILLed process may take to be gone (a loaded machine)
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
WARM_POOL = "TORCH_WARM_POOL"  # torch: "0" keeps inductor's compile-worker pool cold


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux): orphans among its descendants become its
    children instead of init's. Whether it is one now (False elsewhere than Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def stop_group(group: int, reap: Callable[[], object] = lambda: None) -> dict[int, str]:
    """SIGTERM to every process of `group` and to every descendant of them (whatever group or
    session it is in), then SIGKILL to what is left after the grace time.

    `reap` is called while waiting, so a caller can reap its own child (a zombie counts as
    gone). Returns what had to be stopped outside `group` (`describe`'s words for each).
    """
    outside: dict[int, int] = {}  # pid -> its start time (a reused pid is not ours)
    names: dict[int, str] = {}

    def alive() -> bool:
        """Whether any process of the launch runs (one look at /proc); notes new ones."""
        table = process_table()
        members = [pid for pid, (_, pgrp, _) in table.items() if pgrp == group]
        left = [pid for pid, started in outside.items() if _same(table, pid, started)]
        for pid in descendants(members + left, table):
            if table[pid][1] != group and pid not in outside:
                outside[pid], names[pid] = table[pid][2], describe(pid)
                left.append(pid)
        return bool(members or left)

    def send(number: int) -> None:
        signal_group(group, number)
        table = process_table()
        for pid, started in outside.items():
            if _same(table, pid, started):
                _signal(pid, number)

    if not alive():
        return {}  # the usual end of a finished launch: one look, nothing to stop
    send(signal.SIGTERM)
    if not _wait(alive, TERMINATE_GRACE, reap):
        alive()
        send(signal.SIGKILL)
        # A killed process is not gone at once: return only when none is left running, so
        # that nothing of the launch outlives the call (on a busy machine this takes a while).
        _wait(alive, KILL_WAIT, reap)
    return names


def stop_descendants(grace: float = TERMINATE_GRACE) -> dict[int, str]:
    """In a subreaper (the supervisor, before it exits): stop every process below this one
    (SIGTERM, SIGKILL after `grace`), reap them, and return `describe`'s words for each."""
    me = os.getpid()
    started: dict[int, int] = {}
    names: dict[int, str] = {}

    def look() -> list[int]:
        table = process_table()
        for pid in descendants([me], table) - {me}:
            if pid not in started:
                started[pid], names[pid] = table[pid][2], describe(pid)
        return [pid for pid, at in started.items() if _same(table, pid, at)]

    def reap() -> None:
        """Reap every child that has exited, without waiting for one that runs."""
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    if not _has_children(me) or not look():
        reap()
        return {}  # the usual end: nothing below the supervisor, no look at all of /proc
    for number, seconds in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT)):
        for pid in look():
            _signal(pid, number)
        if _wait(lambda: bool(look()), seconds, reap):
            break
    reap()
    return names


def stop_child(pid: int, grace: float = TERMINATE_GRACE) -> None:
    """Stop this process's child `pid` (SIGTERM, SIGKILL after `grace` s) and reap it (gone
    or reaped already: nothing to do)."""
    exited = False

    def reap() -> None:
        nonlocal exited
        try:
            exited = exited or os.waitpid(pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            exited = True

    _signal(pid, signal.SIGTERM)
    if not _wait(lambda: not exited, grace, reap):
        _signal(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _has_children(pid: int) -> bool:
    """Whether `pid` has a child (a zombie counts), from /proc/PID/task/*/children (a few
    files instead of all of /proc); True where the kernel does not have those files."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/children") as file:
                if file.read().strip():
                    return True
    except OSError:
        return True
    return False


def describe(pid: int) -> str:
    """`"sleep 600 (pid 1234)"`: a process's command line (its name when it has none)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            words = file.read().split(b"\0")
        # One line: an argument may hold newlines (`python -c` code).
        command = " ".join(" ".join(w.decode(errors="replace") for w in words).split())
        if not command:
            with open(f"/proc/{pid}/comm") as file:
                command = f"[{file.read().strip()}]"
    except OSError:
        command = "a process that has ended"
    if len(command) > 200:
        command = command[:197] + "..."
    return f"{command} (pid {pid})"


@contextlib.contextmanager
def kernel_gains_no_process() -> Iterator[None]:
    """Around a launch, in the kernel: the kernel has no more children after it than before.

    The launch's own processes are stopped by `stop_group`; what this guards against is a
    process the *kernel* would start while a launch runs. torch's inductor warms a pool of
    compile workers (`torch/_inductor/compile_worker`, a sidecar and its workers) when it
    is imported or first used, unless `TORCH_WARM_POOL=0` (torch 2.8 warms it early; 2.9
    only when a compilation needs it): the variable is set while the launch runs (the
    workers inherit it too, so a launch never warms a pool it does not use, and the pool
    is still made when a compilation needs one), then put back. A compile-worker pool that
    the kernel started during the launch all the same is shut down with torch's own
    `shutdown_compile_workers` (torch makes a new one on the next compilation that needs
    it), unless the kernel already had compile workers before the launch (the user's own).
    """
    before = set(children_of(os.getpid()))
    saved = os.environ.get(WARM_POOL)
    if saved is None:
        os.environ[WARM_POOL] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(WARM_POOL, None)
        _shut_down_new_compile_workers(before)


COMPILE_WORKER = "torch/_inductor/compile_worker"


def keep_compile_pool_cold() -> bool:
    """At `import hfxla_nb`: set `TORCH_WARM_POOL=0` unless it is set; whether it was set here.

    torch 2.8 warms inductor's compile-worker pool when `torch._inductor.async_compile` is
    first imported, which `import accelerate` does: a sidecar process at once, and its workers
    a few seconds later, often while the next cell (a launch) runs, so they look like the
    launch's (#29, Kaggle's stack). An XLA notebook compiles with XLA, not inductor. With
    hfxla_nb imported before accelerate, the kernel starts no pool; torch still makes one
    when a `torch.compile` needs it. Set TORCH_WARM_POOL=1 first to keep torch's warm-up.
    """
    if WARM_POOL in os.environ or "torch._inductor.async_compile" in sys.modules:
        return False
    os.environ[WARM_POOL] = "0"
    return True


def _shut_down_new_compile_workers(before: set[int]) -> None:
    """Shut down inductor's compile-worker pool if the kernel started it since `before`."""
    if any(COMPILE_WORKER in describe(pid) for pid in before):
        return  # the user's pool, from before the launch: theirs to keep
    new = set(children_of(os.getpid())) - before
    if not any(COMPILE_WORKER in describe(pid) for pid in new):
        return
    async_compile = sys.modules.get("torch._inductor.async_compile")
    shutdown = getattr(async_compile, "shutdown_compile_workers", None)
    if shutdown is not None:
        shutdown()


def children_of(pid: int) -> list[int]:
    """The child processes of `pid` (zombies too), from /proc/PID/task/*/children (a few
    files: this runs around every launch), or from all of /proc where those files are
    missing (live children only)."""
    children: set[int] = set()
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as file:
                children.update(int(child) for child in file.read().split())
    except OSError:
        return sorted(child for child, (parent, _, _) in process_table().items()
                      if parent == pid)
    return sorted(children)


def _wait(alive: Callable[[], bool], seconds: float, reap: Callable[[], object]) -> bool:
    """Wait up to `seconds` for `alive()` to be false; whether it is."""
    deadline = time.monotonic() + seconds
    while alive():
        if time.monotonic() >= deadline:
            return False
        reap()
        time.sleep(0.05)
    return True


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except (ProcessLookupError, PermissionError):
        pass


def signal_group(group: int, number: int) -> None:
    try:
        os.killpg(group, number)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(group: int) -> bool:
    """Whether any non-zombie process of the process group is still running (from /proc)."""
    return bool(group_processes(group))


def group_processes(group: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `group`, read from /proc."""
    return sorted(pid for pid, (_, pgrp, _) in process_table().items() if pgrp == group)


def process_table() -> dict[int, tuple[int, int, int]]:
    """Every live (non-zombie) process: pid -> (parent pid, process group, start time)."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            table[int(name)] = (int(fields[1]), int(fields[2]), int(fields[19]))
    return table


def descendants(roots: Iterable[int], table: dict[int, tuple[int, int, int]]) -> set[int]:
    """The live processes of `table` among `roots` or below them."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = [pid for pid in roots if pid in table]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def _same(table: dict[int, tuple[int, int, int]], pid: int, started: int) -> bool:
    """Whether `pid` is alive and is still the process that started at `started`."""
    entry = table.get(pid)
    return entry is not None and entry[2] == started
