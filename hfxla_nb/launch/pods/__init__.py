"""Past one host: the same launch on every host of a Ray cluster (a TPU pod slice).

`notebook_launcher(..., cluster=..., hosts=N)` lands here (docs/pods.md). Nothing in this
package is imported by a launch on one host, and only its modules import `ray`, on first use.

- Checks, in the notebook, before anything starts on any host. Each refusal is a
  `LaunchRefusedError` that says what to do. The checks that need the cluster take what they
  read from it as arguments (node lists, versions), so tests drive each case.
- Placement: one placement-group bundle per host, one host per node. On a TPU slice, Ray's
  slice placement reserves the slice's hosts; elsewhere a STRICT_SPREAD placement group puts
  each bundle on a node of its own.
- The launch: one `HostLaunch` actor per host forks there what the kernel forks on one host.
  Each host gets its variables; every host's events go into one `LaunchReader` and display,
  as the local watch loop does, with ranks numbered across hosts (host h runs ranks
  h*P .. h*P+P-1) and output tagged `[host H rank R]`. However the launch ends, every host is
  stopped, its actor killed and the placement group removed before this returns.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ...events import Event, Generated, LibraryWarning, Log
from ...observe import tracing
from ...observe.reader import LaunchReader
from ...observe.tracking import Tracker
from ...runtime import detect
from ...states import Outcome
from ...ui import LaunchDisplay, launch_display
from .. import preflight as local_preflight
from ..errors import launch_error
from ..preflight import LaunchPlan, LaunchRefusedError
from ..supervision import LaunchRecord, LaunchWatch, RankRecord, end_launch, failure_message, shows
from .host import HostLaunch, installed_versions, pjrt_env

# -- checks before anything starts on any host --

INSTALL = 'pip install "hfxla_nb[ray]"'
CONNECT_SECONDS = 3.0


def import_ray() -> ModuleType:
    """Ray, or a refusal that says how to install it."""
    try:
        import ray
    except ImportError:
        raise LaunchRefusedError(
            f"cluster= runs the launch on the hosts of a Ray cluster, and Ray is not installed "
            f"in this kernel. Install it with `{INSTALL}` (on every host), restart the "
            f"kernel, and launch again.") from None
    return ray


def check_hosts(hosts: Any, strategy: str) -> int:
    """`hosts` as a positive int."""
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
        raise LaunchRefusedError(
            f"hosts={hosts!r}: give the number of hosts to run on (an int of at least 1; a "
            f"v5e-16 slice has 4).")
    return hosts


def check_restarts(max_restarts: Any) -> int:
    """`max_restarts` as an int of at least 0 (how many times a failed launch is relaunched
    on every host)."""
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise LaunchRefusedError(
            f"max_restarts={max_restarts!r}: give how many times to relaunch every host after "
            f"a failure (an int, 0 for none).")
    return max_restarts


def check_address(address: str, seconds: float = CONNECT_SECONDS) -> None:
    """Refuse a `host:port` where nothing answers within `seconds` (ray.init would retry for
    minutes). "auto" is left to Ray, which knows this machine's cluster."""
    if address == "auto" or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise LaunchRefusedError(
            f"cluster={address!r}: give the Ray cluster's GCS address as 'host:port' (what "
            f"`ray start --head` printed, port 6379 by default), or 'auto' on a node of the "
            f"cluster.")
    try:
        with socket.create_connection((host, int(port)), timeout=seconds):
            pass
    except OSError as error:
        raise LaunchRefusedError(
            f"cluster={address!r}: nothing answers at {host}:{port} within {seconds:g}s "
            f"({error.strerror or error}). Start the cluster (`ray start --head` on the first "
            f"host, `ray start --address={host}:{port}` on the others) or check the address."
        ) from None


def tpu_chips_per_host(nodes: Sequence[Mapping[str, Any]]) -> int:
    """The TPU chips of the cluster's TPU hosts (the most of any alive node; 0: no TPU)."""
    chips = [int(n.get("Resources", {}).get("TPU", 0)) for n in nodes if n.get("Alive")]
    return max(chips, default=0)


def check_capacity(nodes: Sequence[Mapping[str, Any]], hosts: int) -> int:
    """Refuse when the cluster has fewer (TPU) nodes than `hosts`; returns the TPU chips each
    host's bundle reserves (0 on a cluster without TPUs)."""
    alive = [n for n in nodes if n.get("Alive")]
    chips = tpu_chips_per_host(alive)
    usable = [n for n in alive if int(n.get("Resources", {}).get("TPU", 0)) >= chips]
    if len(usable) < hosts:
        what = (f"{len(usable)} with {chips} TPU chips" if chips
                else f"{len(alive)} alive, without TPUs")
        raise LaunchRefusedError(
            f"hosts={hosts} asks for {hosts} hosts{f' of {chips} TPU chips' if chips else ''}, "
            f"and the cluster has {len(alive)} node{'s' * (len(alive) != 1)} ({what}). Start "
            f"Ray on the missing hosts (`ray start --address=...`), or lower hosts=.")
    return chips


def check_versions(notebook: Mapping[str, str | None],
                   hosts: Sequence[Mapping[str, Any]]) -> None:
    """Refuse when a host runs other hfxla_nb, torch or torch_xla versions than the notebook:
    `hosts` are the actors' `describe()`s."""
    differences = []
    for info in hosts:
        for name, version in info["versions"].items():
            if version != notebook.get(name):
                differences.append(f"host {info['host']} ({info['address']}) has {name} "
                                   f"{version or 'not installed'}, the notebook "
                                   f"{notebook.get(name) or 'not installed'}")
    if differences:
        raise LaunchRefusedError(
            "every host must run the same hfxla_nb, torch and torch_xla as the notebook: "
            + "; ".join(differences) + ". Install the notebook's versions on those hosts "
            "(pip install hfxla_nb==... torch==... torch_xla==...) and restart Ray there.")


# -- placement: one bundle per host, one host per node --

RESERVE_SECONDS = 30.0


@dataclass
class Reservation:
    """The placement group and what each bundle holds."""

    group: Any
    bundle: dict[str, float]
    slice: dict[str, Any] | None = None  # pod type, topology, chips per host on a slice

    def release(self) -> None:
        import ray

        try:
            ray.util.remove_placement_group(self.group)
        except Exception:  # noqa: BLE001 - the cluster may be gone already
            pass


def this_slice() -> dict[str, Any] | None:
    """The TPU slice this node belongs to (Ray's TPU helpers), or None off a multi-host one."""
    try:
        from ray._private.accelerators.tpu import TPUAcceleratorManager as tpu
        from ray.util.tpu import get_chips_per_host
    except ImportError:
        return None
    try:
        pod_type = tpu.get_current_node_tpu_pod_type()
        topology = tpu.get_current_node_tpu_topology()
    except Exception:  # noqa: BLE001 - no metadata server, no TPU
        return None
    if not pod_type or not topology:
        return None
    version = pod_type.split("-")[0]
    chips = get_chips_per_host(topology, version)
    hosts = 1
    for dim in topology.split("x"):
        hosts *= int(dim)
    hosts //= chips
    if hosts < 2:
        return None
    return {"pod_type": pod_type, "topology": topology, "version": version,
            "chips_per_host": chips, "hosts": hosts}


def reserve(hosts: int, chips: int, seconds: float = RESERVE_SECONDS) -> Reservation:
    """Reserve one bundle per host; refuse when the cluster cannot give them in `seconds`."""
    import ray
    from ray.util.placement_group import placement_group

    tpu_slice = this_slice() if chips else None
    if tpu_slice is not None and tpu_slice["hosts"] == hosts:
        from ray.util.tpu import slice_placement_group

        handle = slice_placement_group(tpu_slice["topology"], tpu_slice["version"])
        group, bundle = handle.placement_group, dict(handle.bundle_resources)
    else:
        tpu_slice = None
        bundle = {"CPU": 1.0, **({"TPU": float(chips)} if chips else {})}
        group = placement_group([dict(bundle) for _ in range(hosts)], strategy="STRICT_SPREAD",
                                name="hfxla_nb-launch")
    reservation = Reservation(group, bundle, tpu_slice)
    try:
        ray.get(group.ready(), timeout=seconds)
    except Exception:  # noqa: BLE001 - GetTimeoutError, or the group was refused
        reservation.release()
        raise LaunchRefusedError(
            f"could not reserve {hosts} hosts ({bundle} each, one per node) within "
            f"{seconds:g}s: the nodes are busy with other Ray work, or fewer nodes have these "
            f"resources free. ray.available_resources(): {ray.available_resources()}.") from None
    return reservation


# -- the launch on every host, watched from the notebook --

POLL_WAIT = 0.2
STOP_SECONDS = 30.0


def launch_on_cluster(function: Callable, args: tuple, pass_index: bool, *, cluster: str,
                      hosts: int, strategy: str, num_processes: int | None,
                      mixed_precision: str, use_port: int | None, timeout: float | None,
                      shown_ranks: set[int] | str, progress: bool | str,
                      heartbeat_timeout: float | None, trace_compiles: bool,
                      keep_record: Callable[[LaunchRecord], None],
                      max_restarts: int = 0,
                      tracker: Tracker | None = None) -> tuple[Any, LaunchRecord]:
    """Run `function` on `hosts` hosts of the Ray cluster at `cluster`: rank 0's value and
    the launch's record.

    After a failure, `max_restarts` relaunches every host: each host's processes are stopped
    first, then all are started again on the same hosts (their actors are kept, so a relaunch
    costs no new Ray worker), each attempt on `last_launch().attempts`. A host that left the
    cluster ends the launch: there is nothing to relaunch it on. `tracker` (`report_to=`)
    follows the events, as on one host.

    Raises:
        LaunchRefusedError: before anything starts on any host (see `preflight`).
        LaunchError: a rank on some host failed, was killed, timed out, or its host left
            (after the last attempt).
    """
    hosts = check_hosts(hosts, strategy)
    max_attempts = check_restarts(max_restarts) + 1
    ray = import_ray()
    plan = _plan(strategy, num_processes, mixed_precision)
    connect(ray, cluster)
    chips = check_capacity(ray.nodes(), hosts)
    reservation = reserve(hosts, chips)
    actors: list[Any] = []
    try:
        actors, described = _start_actors(ray, reservation, hosts)
        check_versions(installed_versions(), described)
        earlier: list[LaunchRecord] = []
        while True:
            # A fresh rendezvous port for each attempt (the last one's may linger).
            envs = _host_envs(ray, actors, described, plan, strategy, use_port, trace_compiles,
                              reservation)
            record = _record(strategy, plan.world, described, earlier, max_attempts)
            keep_record(record)
            reader = LaunchReader(record, timeout, heartbeat_timeout,
                                  follower=tracker.handle if tracker else None)
            watch = _Watch(actors, described, reader,
                           progress, shown_ranks, timeout, plan.world)
            watch.run(lambda envs=envs, world=record.world: [
                actor.start.remote(host, strategy, envs[host], plan.world, world,
                                   function, tuple(args), pass_index)
                for host, actor in enumerate(actors)])
            if record.ok:
                return record.value, record
            message = watch.failure_message()
            # Only a failure is retried: `timeout=` and the stop button mean "stop".
            if record.outcome != Outcome.FAILED or record.attempt >= max_attempts or watch.left:
                break
            print(f"hfxla_nb: attempt {record.attempt} of {max_attempts} failed "
                  f"({message.splitlines()[0]}); stopping every host and relaunching "
                  f"(max_restarts={max_attempts - 1}): attempt {record.attempt + 1} of "
                  f"{max_attempts}.", file=sys.stderr, flush=True)
            earlier.append(record)
            _stop_hosts(ray, actors, watch.pending)
    finally:
        _release(ray, actors, reservation)
    raise launch_error(_last_words(message, record, max_attempts, bool(watch.left)), record)


def _plan(strategy: str, num_processes: int | None, mixed_precision: str) -> LaunchPlan:
    """The local plan every host runs (host 0 is this machine: its runtime must be free)."""
    try:
        local_preflight.check_runtime_not_started()
    except LaunchRefusedError as error:
        raise LaunchRefusedError(
            f"{error} With cluster=, host 0 runs on this machine and needs its TPU chips: "
            "restart the kernel and launch before using the XLA device here.") from None
    info = detect()
    return local_preflight.plan_launch(strategy, num_processes, mixed_precision,
                                       info.accelerator.kind, info.accelerator.devices,
                                       info.environment)


def _record(strategy: str, local_world: int, described: list[dict],
            earlier: list[LaunchRecord], max_attempts: int) -> LaunchRecord:
    """A new attempt's record: ranks numbered across hosts, and which host runs which."""
    world = len(described) * local_world
    hosts = [dict(info, ranks=list(range(info["host"] * local_world,
                                         (info["host"] + 1) * local_world)))
             for info in described]
    return LaunchRecord(strategy, world, [RankRecord(rank) for rank in range(world)],
                        attempt=len(earlier) + 1, max_attempts=max_attempts,
                        previous_attempts=list(earlier), hosts=hosts)


def _last_words(message: str, record: LaunchRecord, max_attempts: int, left: bool) -> str:
    """The `LaunchError`'s message after the last attempt: which attempt it was."""
    if max_attempts > 1:
        message += (f"\n\nThat was attempt {record.attempt} of {max_attempts} "
                    f"(max_restarts={max_attempts - 1}); every attempt is on "
                    "hfxla_nb.last_launch().attempts.")
        if left and record.attempt < max_attempts:
            message += (" Not relaunched: a host left the cluster, and a launch is relaunched "
                        "on the hosts it started on.")
    return message


def connect(ray: Any, cluster: str) -> None:
    """Join the cluster at `cluster` (or keep this process's connection to it)."""
    if not isinstance(cluster, str) or not cluster:
        raise LaunchRefusedError(
            f"cluster={cluster!r}: give a Ray address ('host:port', 'ray://host:10001') or "
            "'auto' (the Ray cluster this machine belongs to).")
    check_address(cluster)
    if ray.is_initialized():
        return
    try:
        ray.init(address=cluster, log_to_driver=False, logging_level="ERROR")
    except ConnectionError as error:
        raise LaunchRefusedError(
            f"cluster={cluster!r}: Ray found no cluster to join ({error}). Run `ray start "
            "--head` on the first host and `ray start --address=HEAD:6379` on the others, "
            "or pass the head's address.") from None


def _start_actors(ray: Any, reservation: Reservation,
                  hosts: int) -> tuple[list[Any], list[dict]]:
    """One actor per bundle, ordered so that the notebook's node is host 0 (on a slice: by
    TPU worker id); their `describe()`s, with `host` set."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    remote = ray.remote(HostLaunch)
    resources = {"TPU": reservation.bundle["TPU"]} if reservation.bundle.get("TPU") else {}
    actors = [
        remote.options(
            num_cpus=reservation.bundle.get("CPU", 0), resources=resources,
            max_concurrency=4, name=None,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=reservation.group, placement_group_bundle_index=index),
        ).remote()
        for index in range(hosts)
    ]
    described = ray.get([actor.describe.remote() for actor in actors], timeout=120)
    here = ray.get_runtime_context().get_node_id()

    def order(pair: tuple[Any, dict]) -> tuple:
        tpu = pair[1].get("tpu") or {}
        if reservation.slice is not None and tpu.get("worker_id") is not None:
            return (tpu["worker_id"],)
        return (pair[1]["node_id"] != here,)

    pairs = sorted(zip(actors, described, strict=True), key=order)
    for host, (_, info) in enumerate(pairs):
        info["host"] = host
    return [a for a, _ in pairs], [d for _, d in pairs]


def _host_envs(ray: Any, actors: list[Any], described: list[dict], plan: Any, strategy: str,
               use_port: int | None, trace_compiles: bool,
               reservation: Reservation) -> list[dict[str, str | None]]:
    """Each host's worker variables: the local plan's, the rendezvous at host 0, and on a TPU
    slice the multi-host PJRT variables (`slice_env.pjrt_env`)."""
    port = ray.get(actors[0].open_rendezvous.remote(use_port or 0), timeout=30)
    envs = []
    for info in described:
        env = dict(plan.env)
        env[tracing.SWITCH] = "1" if trace_compiles else "0"
        env.update(MASTER_ADDR=described[0]["address"], MASTER_PORT=str(port))
        if reservation.slice is not None:
            tpu_slice = reservation.slice
            env.update(pjrt_env(tpu_slice["pod_type"], tpu_slice["topology"],
                                tpu_slice["chips_per_host"], info["host"],
                                [d["address"] for d in described]))
        envs.append(env)
    return envs


def _name_ranks(reader: LaunchReader, local_world: int) -> None:
    """Bars and failure lines of the panel say "host H rank R"."""
    reader.rank_names = {rank: f"host {rank // local_world} rank {rank}"
                         for rank in range(reader.record.world)}


def _stop_hosts(ray: Any, actors: list[Any], pending: list[Any] = ()) -> None:
    """Stop every host's processes (each host on its own: one dead actor does not keep the
    others from stopping); the actors stay. `pending`: polls still in flight, drained first
    so that none takes the next attempt's events."""
    if pending:
        ray.wait(list(pending), num_returns=len(pending), timeout=5)
    if actors:
        stops = [actor.stop.remote() for actor in actors]
        # A dead actor's stop fails at once; its processes died with it (PDEATHSIG).
        ray.wait(stops, num_returns=len(stops), timeout=STOP_SECONDS)


def _release(ray: Any, actors: list[Any], reservation: Reservation) -> None:
    """Stop every host's processes, kill the actors, free the placement group."""
    _stop_hosts(ray, actors)
    for actor in actors:
        try:
            ray.kill(actor)
        except Exception:  # noqa: BLE001
            pass
    reservation.release()


@contextlib.contextmanager
def _interrupts_noted() -> Iterator[threading.Event]:
    """While the notebook side watches the hosts, SIGINT (the kernel's stop button) only sets
    the event it yields, and the watch loop raises KeyboardInterrupt itself: raised inside
    Ray's `wait`, the interrupt could be lost (measured: a launch ran on to its end). Outside
    the main thread signals cannot be handled, and the event is never set."""
    noted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.set())
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)
    if noted.is_set():  # a stop pressed before the watch began, or during its last poll
        raise KeyboardInterrupt


class _Watch(LaunchWatch):
    """The local watch loop's counterpart over hosts (see `supervision.Supervision._watch`)."""

    def __init__(self, actors: list[Any], described: list[dict],
                 reader: LaunchReader, progress: bool | str, shown_ranks: set[int] | str,
                 timeout: float | None, local_world: int) -> None:
        _name_ranks(reader, local_world)
        record = reader.record
        display: LaunchDisplay = launch_display(record.world, progress, reader=reader,
                                                attempt=record.attempt_text)
        super().__init__(reader, display, shown_ranks, timeout)
        self.actors = actors
        self.described = described
        self.local_world = local_world
        self.exited: dict[int, int] = {}
        self.left: dict[int, str] = {}
        self.polls: dict[Any, int] = {}  # poll -> host, in flight
        self.interrupted = threading.Event()  # set by SIGINT while `run` watches

    @property
    def pending(self) -> list[Any]:
        """The polls still in flight (after the watch ended: to drain before a relaunch)."""
        return list(self.polls)

    def run(self, start: Callable[[], list[Any]]) -> None:
        """Start every host (`start()` returns the actors' start calls), watch them until the
        launch ends, and end it in one place (`watching.end_launch`, as on one host): the
        record's outcome, the ranks still running, the final panel. "interrupted" (the stop
        button) raises KeyboardInterrupt again; any other exception ends the launch "failed"
        and is raised again. The hosts' processes are still to stop when this returns."""
        import ray

        began = time.monotonic()
        outcome = Outcome.FAILED
        try:
            with _interrupts_noted() as self.interrupted:
                for info, pid in zip(self.record.hosts, ray.get(start(), timeout=60),
                                     strict=True):
                    info["supervisor"] = pid
                outcome = self._watch(began)
        except KeyboardInterrupt:
            outcome = Outcome.INTERRUPTED
            raise
        finally:
            self._say_library_warnings()
            # The hosts' processes are stopped by the caller (`_stop_hosts`, `_release`).
            end_launch(self.reader, self.display, outcome, began,
                       interrupted_line=("hfxla_nb: interrupted; every host's worker "
                                         "processes were stopped."))

    def _watch(self, began: float) -> Outcome:
        """Relay every host's events until the launch ends; return how it ended.

        One poll per host is in flight at a time (`HostLaunch.poll`: its events, and its
        supervisor's exit code once it exited). Each turn waits up to `POLL_WAIT` for polls,
        applies their events (ranks numbered across hosts) and asks the host again unless its
        supervisor exited, then ends the turn as the local loop does
        (`LaunchWatch._turn_end`: a known failure, a host whose actor died being one (its
        ranks "killed"), then every host's supervisor exited, then `timeout`). The stop
        button, noted by `_interrupts_noted`, is raised here as KeyboardInterrupt. It stops
        nothing: `run` and the caller do.
        """
        import ray

        polls = {self.actors[h].poll.remote(POLL_WAIT): h for h in range(len(self.actors))}
        self.polls = polls  # updated in place: what is in flight when this returns
        while True:
            ready, _ = ray.wait(list(polls), num_returns=len(polls), timeout=POLL_WAIT)
            if self.interrupted.is_set():
                raise KeyboardInterrupt
            for ref in ready:
                host = polls.pop(ref)
                try:
                    events, code = ray.get(ref)
                except Exception as error:  # noqa: BLE001 - RayActorError: the node left
                    self._host_left(host, error)
                    continue
                for event in events:
                    self._handle(host, event)
                if code is None:
                    polls[self.actors[host].poll.remote(POLL_WAIT)] = host
                else:
                    self.exited[host] = code
            # No poll left: every host's supervisor exited, its events all read.
            outcome = self._turn_end(began, lambda: None if polls else
                                     max(self.exited.values(), default=1))
            if outcome is not None:
                return outcome

    def _handle(self, host: int, event: Event) -> None:
        self.reader.handle(event)
        if isinstance(event, Log):
            self._print(host, event)
        elif isinstance(event, LibraryWarning):
            self.record.warnings.append(event)  # said, folded, at the end of the launch
        elif isinstance(event, Generated):
            self._take_generated(event)
        else:
            self.display.handle(event)

    def _print(self, host: int, event: Log) -> None:
        rank = event.rank
        if not shows(self.shown_ranks, [] if rank is None else [rank]):
            return
        stream = sys.stderr if event.stream == "stderr" else sys.stdout
        tag = f"[host {host} rank {rank}] " if rank is not None else f"[host {host}] "
        stream.write("".join(tag + line for line in event.text.splitlines(keepends=True)))
        stream.flush()

    def _host_left(self, host: int, error: BaseException) -> None:
        """A host's actor died (its node left the cluster, or the process was killed)."""
        where = self.described[host]["address"]
        self.left[host] = where
        first = host * self.local_world
        self.reader.mark_killed(
            range(first, first + self.local_world), "host left",
            f"its host left the cluster or the host's Ray actor died "
            f"({type(error).__name__}); its processes died with it")

    def host_of(self, rank: int) -> int:
        return rank // self.local_world

    def failure_message(self) -> str:
        """The local message, with the host of the rank it names."""
        message = failure_message(self.reader)
        failed = self.reader.failure
        if failed is not None and message.startswith(f"rank {failed.rank} "):
            host = self.host_of(failed.rank)
            where = self.described[host]["address"]
            message = f"host {host} ({where}) {message}"
        return message
