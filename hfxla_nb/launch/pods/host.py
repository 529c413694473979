"""One host of a multi-host launch: what runs there, and the variables it runs with.

- The forked processes of one host (`supervise_host`). Workers never draw. The host's actor
  forks a supervisor into its own session, as the launcher does on one host. For
  `strategy="debug"` the supervisor forks one process per local rank, each joining the gloo
  group that spans every host (global rank = host x processes + local rank, rendezvous at
  host 0); for "replicated" and "spmd" it runs the one-host supervisor with the slice's
  multi-host PJRT variables. Each process asks for SIGKILL when its parent dies, so a host
  whose actor is killed, or a node that leaves the cluster, leaves no process behind.
- The Ray actor (`HostLaunch`) that does on the host what the kernel does locally: it forks
  the supervisor with a launch channel and output pipes of its own, and a thread reads them
  as the kernel's watch loop does. The notebook takes the events with `poll()`; `stop()`
  stops the host's process group and reaps it. `launch.pods` makes the class a Ray actor
  (`ray.remote`), so importing this module does not import Ray.
- The variables multi-host PJRT reads on each host of a TPU slice, as a pure function
  (`pjrt_env`). On a TPU VM, libtpu and torch_xla learn the slice from the metadata server;
  where a launcher places the processes itself (Ray, GKE) they come from variables instead.
"""

from __future__ import annotations

import dataclasses
import os
import select
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

from ...events import Channel, Event, Failed, Log, OutputPipes, ProcessExited, Started
from ...runtime import compile_cache
from .. import processes, worker
from ..output import NativeRelay, route_this_process
from ..processes import die_with_parent, stop_group

# -- the forked processes of one host --

def supervise_host(strategy: str, channel: Channel, output_fds: tuple[int, int],
                   env: dict[str, str | None], host: int, local_world: int, world: int,
                   function: Callable, args: tuple, pass_index: bool) -> None:
    """Body of one host's forked supervisor. Ends the process; never returns."""
    die_with_parent()
    if strategy != "debug":
        worker.supervise(strategy, channel, output_fds, env, local_world, function, args,
                         pass_index)  # ends with os._exit
    code = 0
    try:
        os.setsid()
        worker.prepare_process(channel, output_fds, env)
        code = _run_ranks(channel, host, local_world, world, function, args, pass_index,
                          env)
    except BaseException as error:  # noqa: BLE001 - report everything, then leave
        channel.send(Failed(None, type(error).__name__, str(error),
                            "".join(traceback.format_exception(error))))
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def _run_ranks(channel: Channel, host: int, local_world: int, world: int, function: Callable,
               args: tuple, pass_index: bool, env: dict[str, str | None]) -> int:
    """Fork this host's ranks of the gloo group; wait for them; 1 if one ended abnormally."""
    address, port = env["MASTER_ADDR"], env["MASTER_PORT"]
    pids = {}
    for local_rank in range(local_world):
        rank = host * local_world + local_rank
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                die_with_parent()
                worker.set_rank_variables(rank, local_rank, world)
                os.environ["LOCAL_WORLD_SIZE"] = str(local_world)
                route_this_process(channel, rank)
                # Through host 0's store (`HostLaunch.open_rendezvous`), held since before
                # any host forked.
                processes.join_gloo(rank, world, address, int(port))
                worker.run_rank(channel, rank, world, function, args, pass_index)
            except BaseException as error:  # noqa: BLE001
                channel.send(Failed(rank, type(error).__name__, str(error),
                                    traceback.format_exc()))
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids[pid] = rank
    worst = 0
    while pids:
        pid, status = os.wait()
        rank = pids.pop(pid, None)
        code = os.waitstatus_to_exitcode(status)
        if code:
            channel.send(ProcessExited(rank=rank, pid=pid, signal=-code if code < 0 else None,
                                       exitcode=code if code > 0 else None))
            worst = 1
    return worst


# -- the host's Ray actor --

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
        self._store: processes.StoreProcess | None = None  # host 0's (`open_rendezvous`)

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
        loaded two-host run failed to connect so (`processes.py`). It runs in a process
        of its own: this actor forks a supervisor per attempt, and a fork while a store's
        thread runs can leave the ranks' store clients waiting forever on a lock it held. A
        fresh store for each attempt: a relaunch must not read the last group's keys."""
        self.close_rendezvous()
        self._store = processes.StoreProcess(port)
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


# -- the slice's multi-host PJRT variables --

# How a host's chips are laid out (x, y, z), by chips per host.
CHIPS_PER_HOST_BOUNDS = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}


class SliceError(ValueError):
    """A slice description that no TPU slice has."""


def topology_dims(topology: str) -> tuple[int, int, int]:
    """`"4x4"` -> (4, 4, 1); `"2x2x4"` -> (2, 2, 4)."""
    try:
        dims = tuple(int(part) for part in topology.lower().split("x"))
    except ValueError:
        raise SliceError(f"topology {topology!r} is not like '4x4' or '2x2x4'.") from None
    if len(dims) not in (2, 3) or min(dims) < 1:
        raise SliceError(f"topology {topology!r} is not like '4x4' or '2x2x4'.")
    return (*dims, 1) if len(dims) == 2 else dims  # type: ignore[return-value]


def host_bounds(topology: str, chips_per_host: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(chips per host bounds, host bounds) for a slice of `topology` with `chips_per_host`."""
    if chips_per_host not in CHIPS_PER_HOST_BOUNDS:
        raise SliceError(f"{chips_per_host} chips per host: TPU hosts have 1, 4 or 8.")
    chips = CHIPS_PER_HOST_BOUNDS[chips_per_host]
    dims = topology_dims(topology)
    if any(d % c for d, c in zip(dims, chips, strict=True)):
        raise SliceError(
            f"topology {topology} cannot be cut into hosts of {chips_per_host} chips "
            f"({'x'.join(map(str, chips))}).")
    return chips, tuple(d // c for d, c in zip(dims, chips, strict=True))


def pjrt_env(accelerator_type: str, topology: str, chips_per_host: int, worker_id: int,
             hostnames: Sequence[str]) -> dict[str, str]:
    """The variables one host of a slice needs for multi-host PJRT.

    Args:
        accelerator_type: the slice's type as the TPU API names it ("v5litepod-16", "v4-32").
        topology: its chip topology ("4x4", "2x2x4").
        chips_per_host: chips on each host (4 on v4 and v5e slices).
        worker_id: this host's index in the slice (the TPU worker id).
        hostnames: every host's address, in worker id order.

    Returns:
        `TPU_SKIP_MDS_QUERY`, `TPU_ACCELERATOR_TYPE`, `TPU_HOST_BOUNDS`,
        `TPU_CHIPS_PER_HOST_BOUNDS`, `TPU_WORKER_ID`, `TPU_WORKER_HOSTNAMES`.

    Raises:
        SliceError: the figures do not describe a slice (hosts that do not fill the topology,
            a worker id out of range).
    """
    chips, hosts = host_bounds(topology, chips_per_host)
    count = hosts[0] * hosts[1] * hosts[2]
    if len(hostnames) != count:
        raise SliceError(f"a {accelerator_type} ({topology}, {chips_per_host} chips per host) "
                         f"has {count} hosts; {len(hostnames)} were given.")
    if not 0 <= worker_id < count:
        raise SliceError(f"worker id {worker_id} is not one of the slice's {count} hosts.")
    return {
        "TPU_SKIP_MDS_QUERY": "1",
        "TPU_ACCELERATOR_TYPE": accelerator_type,
        "TPU_HOST_BOUNDS": ",".join(map(str, hosts)),
        "TPU_CHIPS_PER_HOST_BOUNDS": ",".join(map(str, chips)),
        "TPU_WORKER_ID": str(worker_id),
        "TPU_WORKER_HOSTNAMES": ",".join(hostnames),
    }
