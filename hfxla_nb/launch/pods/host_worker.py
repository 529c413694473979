"""What the forked processes of one host of a multi-host launch run. Workers never draw.

The host's actor (`host.py`) forks a supervisor into its own session, as the launcher does on
one host. For `strategy="debug"` the supervisor forks one process per local rank, each joining
the gloo process group that spans every host (global rank = host x processes + local rank,
rendezvous at host 0); for "replicated" and "spmd" it runs the one-host supervisor
(`worker.supervise`) with the slice's multi-host PJRT variables in `env`.

Each process asks the kernel for SIGKILL when its parent dies (`PR_SET_PDEATHSIG`), so a host
whose actor is killed, or a node that leaves the cluster, leaves no process behind.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

from ...events import Channel, Failed, ProcessExited
from .. import rendezvous, worker
from ..native_output import route_this_process
from ..parent_watch import die_with_parent


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
                rendezvous.join_gloo(rank, world, address, int(port))
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
