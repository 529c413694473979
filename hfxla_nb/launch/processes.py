"""A launch's processes: who is alive, how they meet, how they stop, and how they die with the
kernel.

- Stopping every process, also those that left the launch's process group. Every process
  starts in the supervisor's group, so one `killpg` reaches them; a process started in a
  session of its own (a server, a daemon) is out of its reach. So the supervisor is a child
  subreaper (`become_subreaper`): every descendant stays in its process tree, and it stops
  what is still running before it exits (`stop_descendants`). Stopping from the notebook
  (`stop_group`) signals the group and every descendant read from /proc. The kernel is never
  made a subreaper: it would adopt, and never reap, every orphan of everything the user runs.
- Dying with the kernel. A killed kernel cannot stop its launch, which would train on and keep
  the TPU's device files open. The supervisor watches the kernel (`watch_kernel`) and, when it
  is gone, stops every process below it and writes down what it stopped (shown by the next
  `%xla_info`). Every other process asks for a signal when its parent dies
  (`die_with_parent`).
- The gloo rendezvous of `strategy="debug"`: one `TCPStore` server that every rank joins. A
  port picked free and bound later by rank 0 can be taken in between; the server is held by
  the process that forks the ranks. No process forks while a store's server thread runs in it
  (a forked rank could inherit a held lock): on one host the store opens after the fork and
  hands the ranks its port through a pipe; host 0 of a cluster keeps its store in a process
  of its own (`StoreProcess`).
- The heartbeat: one `Heartbeat` per rank every `HEARTBEAT_INTERVAL` seconds, so that the
  notebook tells a frozen process from a busy one.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..events import Channel, Heartbeat
from ..runtime.info import StoppedLaunch, record

# -- who is alive, and stopping all of them --

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
#: Seconds torch's own shutdown of a compile-worker pool gets before its sidecar is stopped.
COMPILE_POOL_GRACE = 5.0


def keep_compile_pool_cold() -> bool:
    """At `import hfxla_nb`: set `TORCH_WARM_POOL=0` unless it is set; whether it was set here.

    torch 2.8 warms inductor's compile-worker pool when `torch._inductor.async_compile` is
    first imported, which `import accelerate` does: a sidecar process at once, and its workers
    a few seconds later, often while the next cell (a launch) runs, so they look like the
    launch's (seen on Kaggle's stack). An XLA notebook compiles with XLA, not inductor. With
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
        # torch's shutdown waits up to 300 s for the pool's sidecar to exit, and on Python 3.12
        # with torch 2.9.1 the sidecar was seen ignoring it: the cell would hang for 5 minutes
        # after the launch. torch is given a few seconds; a sidecar still there is stopped.
        asked = threading.Thread(target=shutdown, name="hfxla_nb-pool-shutdown", daemon=True)
        asked.start()
        asked.join(COMPILE_POOL_GRACE)
    for pid in set(children_of(os.getpid())) - before:
        if COMPILE_WORKER in describe(pid):
            stop_child(pid)


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


# -- a launch dies with its kernel --

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
POLL_INTERVAL = 0.5  # seconds between looks at the parent where there is no pidfd


def die_with_parent(number: int = signal.SIGKILL) -> None:
    """Have the kernel send signal `number` to this process when its parent exits (Linux); a
    no-op elsewhere.

    A rank below a one-host supervisor asks for SIGTERM: the notebook stops a launch with
    SIGTERM to its whole group and SIGKILL after a grace time, and a supervisor that dies of
    that SIGTERM first must not cut a rank's grace short (a rank may handle SIGTERM to save
    its state). The parent-death signal fires when the thread that forked this process ends,
    so call it only in processes forked from their parent's main thread (every fork of a
    launch is).
    """
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, number)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request: nobody to signal it
        os._exit(1)


def watch_parent(on_death: Callable[[int], None]) -> threading.Thread:
    """Call `on_death(parent pid)` from a daemon thread once this process's parent is gone."""
    parent = os.getppid()

    def watch() -> None:
        try:
            descriptor = os.pidfd_open(parent)
        except (AttributeError, OSError):
            descriptor = None
        if os.getppid() == parent:
            if descriptor is not None:
                select.select([descriptor], [], [])  # readable once the parent exited
            while os.getppid() == parent:  # and where there is no pidfd, a poll
                time.sleep(POLL_INTERVAL)
        on_death(parent)

    thread = threading.Thread(target=watch, name="hfxla_nb-parent-watch", daemon=True)
    thread.start()
    return thread


# Held by the watch while it stops an orphaned launch, so that the supervisor's main thread,
# which sees its ranks end and heads for the exit, does not end the process first.
_stopping = threading.Lock()


def exit_process(code: int) -> None:
    """`os._exit(code)`, unless the kernel's death is being handled: then the watch exits."""
    with _stopping:
        os._exit(code)


def watch_kernel() -> threading.Thread:
    """In the supervisor: when the kernel dies, stop the launch, write it down and exit."""
    return watch_parent(_stop_orphaned_launch)


_serves_jobs = False  # this process's ranks serve a warm session's jobs (`serves_jobs`)


def serves_jobs() -> None:
    """This process's ranks run a warm session's jobs: when its kernel ends while no rank
    runs one (a restart, a shutdown), its processes are stopped without a note (nothing was
    lost: the session's end is the kernel's)."""
    global _serves_jobs
    _serves_jobs = True


def _stop_orphaned_launch(kernel_pid: int) -> None:
    """Stop every process below this supervisor, note what was stopped (unless it was a warm
    session between jobs), end the process."""
    _stopping.acquire()  # never released: this ends the process
    me = os.getpid()
    processes = [describe(me)]
    try:
        noted = not _serves_jobs or bool(_active.snapshot())
        stopped = stop_descendants(grace=LEFTOVER_GRACE)
        processes += [stopped[pid] for pid in sorted(stopped)]
        if noted:
            record(StoppedLaunch(kernel_pid, me, time.time(), processes))
    finally:
        os._exit(1)


# -- the gloo rendezvous --

STORE_START_TIMEOUT = 30.0  # seconds for a store process to say its port
STORE_STOP_TIMEOUT = 5.0  # seconds for it to close at SIGTERM before SIGKILL


def open_store(port: int = 0) -> Any:
    """A store server listening on `port` of every interface (0: a free port, chosen as it is
    bound); its `port` attribute is the port. Kept alive by the caller for the launch.

    Raises:
        RuntimeError: `port` is taken (the message names it).
    """
    import torch.distributed as dist
    from torch.distributed.constants import default_pg_timeout

    return dist.TCPStore("127.0.0.1", port, None, True, timeout=default_pg_timeout,
                         wait_for_workers=False)


# A port as the supervisor hands it to its debug ranks: fixed-size records on one pipe, so
# each rank's read takes exactly one (a write this small is atomic).
_PORT_RECORD = 8


def send_port(fd: int, port: int, ranks: int) -> None:
    """Hand `port` to `ranks` ranks waiting in `read_port`, then close `fd`."""
    try:
        os.write(fd, f"{port:07d}\n".encode() * ranks)
    finally:
        os.close(fd)


def read_port(fd: int) -> int | None:
    """In a debug rank: wait for the store's port from the supervisor, close `fd`, and make it
    this process's `MASTER_PORT`; None when the supervisor could not open the store."""
    data = os.read(fd, _PORT_RECORD)
    os.close(fd)
    if len(data) < _PORT_RECORD:
        return None
    port = int(data)
    os.environ["MASTER_PORT"] = str(port)
    return port


def join_gloo(rank: int, world: int, address: str, port: int) -> None:
    """Join the gloo group of `world` ranks as `rank`, through the store at `address:port`."""
    import torch.distributed as dist
    from torch.distributed.constants import default_pg_timeout

    store = dist.TCPStore(address, int(port), world, False, timeout=default_pg_timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)


class StoreProcess:
    """A store server (`open_store`) in a forked process of its own, so that the process that
    starts it can go on forking (host 0's Ray actor forks a supervisor per attempt). It dies
    with its parent (SIGKILL) and closes at `close()` (SIGTERM).

    Args:
        port: the port to listen on (0: a free one).

    Raises:
        RuntimeError: the store did not open (the port is taken, the message names it; or it
            said nothing within `STORE_START_TIMEOUT`).
    """

    def __init__(self, port: int = 0) -> None:
        said, say = os.pipe()
        pid = os.fork()
        if pid == 0:  # never returns
            os.close(said)
            _serve_store(port, say)
        os.close(say)
        self.pid: int | None = pid
        try:
            self.port = _read_port_or_error(said)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the store's process and reap it (closed already: nothing to do)."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        stop_child(pid, grace=STORE_STOP_TIMEOUT)


def _serve_store(port: int, say: int) -> None:
    """Body of a store's process: open the store, write its port (or the error) to `say`,
    then serve until SIGTERM. Ends the process; never returns."""
    code = 0
    try:
        die_with_parent()
        # SIGTERM is waited for, not handled: blocked before the server's thread starts.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            store = open_store(port)
            message = f"{int(store.port)}"
        except Exception as error:  # noqa: BLE001 - the parent raises it
            message, code = str(error) or type(error).__name__, 1
        os.write(say, message.encode())
        os.close(say)
        if not code:
            signal.sigwait({signal.SIGTERM})
            # Closed in order (its own client first): a killed store can leave its port in
            # TIME_WAIT, and the next attempt may ask for the same port (`use_port`).
            del store
    finally:
        os._exit(code)


def _read_port_or_error(said: int) -> int:
    """The port a store's process wrote to `said` (closed here), or its error raised."""
    data = b""
    try:
        while True:
            ready, _, _ = select.select([said], [], [], STORE_START_TIMEOUT)
            if not ready:
                raise RuntimeError(f"the rendezvous store did not open within "
                                   f"{STORE_START_TIMEOUT:.0f} s")
            chunk = os.read(said, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(said)
    text = data.decode(errors="replace")
    if not text.isdigit():
        raise RuntimeError(text or "the rendezvous store's process ended without a port")
    return int(text)


# -- the heartbeat --

HEARTBEAT_INTERVAL = 1.0


class _ActiveRanks:
    """The ranks running in this process, for heartbeats."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranks: set[int] = set()

    def add(self, rank: int) -> None:
        with self._lock:
            self._ranks.add(rank)

    def remove(self, rank: int) -> None:
        with self._lock:
            self._ranks.discard(rank)

    def snapshot(self) -> list[int]:
        with self._lock:
            return sorted(self._ranks)


_active = _ActiveRanks()
_heartbeat_pid: int | None = None
_heartbeat_lock = threading.Lock()


def _heartbeat(channel: Channel) -> None:
    """The heartbeat thread: forever (a daemon), every `HEARTBEAT_INTERVAL` s, one `Heartbeat`
    per rank running in this process, so that a frozen process is told from a busy one."""
    while True:
        time.sleep(HEARTBEAT_INTERVAL)
        for rank in _active.snapshot():
            channel.send(Heartbeat(rank=rank))


def start_heartbeat(channel: Channel) -> None:
    """One heartbeat thread in each process that runs ranks (xmp.spawn's pool processes too:
    a forked child has none of its parent's threads)."""
    global _heartbeat_pid
    with _heartbeat_lock:
        if _heartbeat_pid == os.getpid():
            return
        _heartbeat_pid = os.getpid()
        threading.Thread(
            target=_heartbeat, args=(channel,), name="hfxla_nb-heartbeat", daemon=True
        ).start()


def _after_fork_in_child() -> None:
    # A lock that a parent's thread held at the fork stays held in the child forever: the
    # heartbeat's snapshot could leave `_active` locked, and the child's first rank would hang
    # before it even said it started.
    global _active, _heartbeat_lock
    _active = _ActiveRanks()
    _heartbeat_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def rank_started(rank: int) -> None:
    """`rank` runs in this process now: the heartbeat names it."""
    _active.add(rank)


def rank_ended(rank: int) -> None:
    """`rank` ended: the heartbeat no longer names it."""
    _active.remove(rank)
