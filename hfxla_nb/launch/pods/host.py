"""One host of a multi-host launch: the Ray actor that does there what the kernel does locally.

The actor forks the host's supervisor (`host_worker.supervise_host`) with a launch channel and
output pipes of its own, and a thread of the actor reads them as the kernel's watch loop does:
events, and native output turned into `Log` events of the process's rank. The notebook takes
them with `poll()`; `stop()` stops the host's process group (SIGTERM, then SIGKILL) and
reaps it. The class is made a Ray actor by `cluster_launch` (`ray.remote`), so importing this
module does not import Ray.
"""

from __future__ import annotations

import dataclasses
import os
import select
import threading
from collections.abc import Callable
from importlib import metadata
from typing import Any

from ...events import Channel, Event, Log, OutputPipes, Started
from ...runtime import compile_cache
from .. import rendezvous
from ..native_output import NativeRelay
from ..processes import stop_group
from .host_worker import supervise_host

VERSIONED = ("hfxla_nb", "torch", "torch_xla")


def installed_versions() -> dict[str, str | None]:
    """The versions of the packages every host must share (None: not installed)."""
    versions: dict[str, str | None] = {}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


class _Relay(NativeRelay):
    """Native output as `Log` events of the writing process's rank (the notebook tags them)."""

    def __init__(self, ranks_of: Callable[[int], list[int]], sink: Callable[[Event], None]):
        said: dict[str, bool] = {}
        super().__init__(ranks_of=ranks_of, shown=lambda ranks: True, tagged=False,
                         rewrite=lambda line: compile_cache.native_line(line, said))
        self.sink = sink

    def _write(self, pipe: Any, data: bytes) -> None:
        ranks = self.ranks_of(pipe.pid) if pipe.pid is not None else []
        if not ranks and pipe.rank is not None:
            ranks = [pipe.rank]
        lines = (self.rewrite(line) for line in data.decode(errors="replace").splitlines(True))
        text = "".join(line for line in lines if line is not None)
        if text:
            self.sink(Log(rank=ranks[0] if ranks else None, stream=pipe.stream, text=text))


class HostLaunch:
    """The actor of one host (one per placement-group bundle, so one per node); which host
    it is, `start()` says."""

    def __init__(self) -> None:
        self.host = 0
        self._lock = threading.Condition()
        self._events: list[Event] = []
        self._exit: int | None = None
        self._pid: int | None = None
        self._offset = 0
        self._pid_ranks: dict[int, list[int]] = {}
        self._pump: threading.Thread | None = None
        self._attempt = 0  # which start() the relay thread serves (a relaunch starts again)
        self._store: rendezvous.StoreProcess | None = None  # host 0's (`open_rendezvous`)

    def describe(self) -> dict[str, Any]:
        """Where this host is and what it runs: address, versions, TPU slice figures.

        Also imports torch here, once, so the processes forked later inherit it (as they
        inherit the kernel's on one host) instead of each importing it."""
        import ray
        import torch.distributed  # noqa: F401

        info: dict[str, Any] = {"address": ray.util.get_node_ip_address(),
                                "node_id": ray.get_runtime_context().get_node_id(),
                                "pid": os.getpid(), "versions": installed_versions()}
        try:
            from ray._private.accelerators.tpu import TPUAcceleratorManager as tpu

            info["tpu"] = {"pod_type": tpu.get_current_node_tpu_pod_type(),
                           "topology": tpu.get_current_node_tpu_topology(),
                           "worker_id": tpu.get_current_node_tpu_worker_id()}
        except Exception:  # noqa: BLE001 - no TPU, or an older Ray: no slice figures
            info["tpu"] = None
        return info

    def open_rendezvous(self, port: int = 0) -> int:
        """The gloo group's store on this host (host 0), listening on `port` (0: a free one)
        until `close_rendezvous()`; returns its port.

        The store is bound here, before any process is forked, and stays bound. A port
        picked free, closed, and bound again seconds later by rank 0 can be taken in between
        (as the source port of another connection, on a busy host): the gloo mesh of one
        loaded two-host run failed to connect so (#29; `rendezvous.py`). It runs in a process
        of its own: this actor forks a supervisor per attempt, and a fork while a store's
        thread runs can leave the ranks' store clients waiting forever on a lock it held. A
        fresh store for each attempt: a relaunch must not read the last group's keys."""
        self.close_rendezvous()
        self._store = rendezvous.StoreProcess(port)
        return self._store.port

    def close_rendezvous(self) -> None:
        """Stop the store `open_rendezvous` started (none: nothing to do)."""
        if self._store is not None:
            self._store.close()
        self._store = None

    def start(self, host: int, strategy: str, env: dict[str, str | None], local_world: int,
              world: int, function: Callable, args: tuple, pass_index: bool) -> int:
        """Fork the supervisor of host `host` and start relaying; returns its pid. Called
        again after `stop()` for the next attempt of a launch (`max_restarts`): what the last
        attempt left unread is dropped."""
        self.host = host
        with self._lock:
            self._events, self._exit, self._pid_ranks = [], None, {}
            self._attempt += 1
        channel = Channel()
        (out_read, out_write), (err_read, err_write) = os.pipe(), os.pipe()
        self._offset = 0 if strategy == "debug" else self.host * local_world
        pid = os.fork()
        if pid == 0:  # never returns
            os.close(out_read)
            os.close(err_read)
            supervise_host(strategy, channel, (out_write, err_write), env, self.host,
                           local_world, world, function, args, pass_index)
        os.close(out_write)
        os.close(err_write)
        self._pid = pid
        relay = _Relay(lambda p: self._pid_ranks.get(p, []), self._add)
        relay.add(out_read, "stdout")
        relay.add(err_read, "stderr")
        self._pump = threading.Thread(target=self._relay,
                                      args=(channel, relay, pid, self._attempt),
                                      name="hfxla_nb-host-relay", daemon=True)
        self._pump.start()
        return pid

    def poll(self, wait: float = 0.2) -> tuple[list[Event], int | None]:
        """The events since the last poll (waiting up to `wait` s for one), and the
        supervisor's exit status once it has exited and everything it sent was read."""
        with self._lock:
            if not self._events and self._exit is None:
                self._lock.wait(wait)
            events, self._events = self._events, []
            return events, self._exit

    def stop(self) -> None:
        """Stop every process of this host's launch (SIGTERM, then SIGKILL) and reap it."""
        pid = self._pid
        if pid is not None:
            stop_group(pid, reap=lambda: self._reap(pid, block=False))
            try:  # stopped before its setsid(): not in a group of its own yet
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
            self._reap(pid, block=True)
        if self._pump is not None:
            self._pump.join(10)
        self.close_rendezvous()

    # -- the relay thread ----------------------------------------------------------------------

    def _add(self, event: Event) -> None:
        if self._offset and event.rank is not None:
            event = dataclasses.replace(event, rank=event.rank + self._offset)
        if isinstance(event, Started):
            self._pid_ranks.setdefault(event.pid, []).append(event.rank)
        with self._lock:
            self._events.append(event)
            self._lock.notify_all()

    def _reap(self, pid: int, block: bool) -> int | None:
        with self._lock:
            if self._exit is not None or self._pid is None:
                return self._exit
        try:
            done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return self._exit
        if done == 0:
            return None
        self._pid = None
        return os.waitstatus_to_exitcode(status)

    def _relay(self, channel: Channel, relay: _Relay, pid: int, attempt: int) -> None:
        """The relay thread of one attempt: until the supervisor `pid` exits (or `stop` reaped
        it: status -9), queue the events it sends for `poll` and relay its processes' native
        output, looking every 0.05 s; then the events sent last and the rest of the output,
        and the channel is closed whatever happened."""
        code = None
        try:
            while code is None:
                ready, _, _ = select.select([channel, *relay.fds()], [], [], 0.05)
                self._receive(channel, relay)
                for fd in ready:
                    if fd is not channel:
                        relay.read(fd)
                code = self._reap(pid, block=False)
                if code is None and self._pid is None:
                    code = -9  # reaped by stop()
            self._receive(channel, relay)
            relay.close()
        finally:
            channel.close()
            with self._lock:
                if attempt == self._attempt:  # not a later attempt's exit
                    self._exit = code if code is not None else -9
                self._lock.notify_all()

    def _receive(self, channel: Channel, relay: _Relay) -> None:
        for event in channel.receive():
            if isinstance(event, OutputPipes):
                relay.add_process(event)
            else:
                self._add(event)
