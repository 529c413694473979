"""notebook_launcher(cluster=..., hosts=2) on a real 2-node Ray cluster (tests/pods/conftest.py):
the debug strategy's gloo group spans both hosts; output, failures, frozen ranks, restarts,
interrupts, timeouts and a host that dies reach the notebook side, named by host; nothing of a
launch is left on any node. Each launch starts one Ray worker per host and imports torch in it
(the cost of these tests), so one launch checks as much as it can: the restart test's three
attempts (a failure, a frozen rank, then the all-reduce) run on the same host actors, and
its console panel shows each rank's bar with its host."""

from __future__ import annotations

import _thread
import ctypes
import glob
import os
import re
import signal
import threading
import time

import pytest

import hfxla_nb as hx
from hfxla_nb.launch.preflight import LaunchRefusedError

LAUNCH = dict(strategy="debug", num_processes=2, hosts=2, progress=False)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _nothing_left(*records) -> None:
    """No rank process, host supervisor or host actor of the launch is running (the nodes
    share this machine's pid namespace)."""
    pids = []
    for record in records:
        pids += [r.pid for r in record.ranks if r.pid] + [h["pid"] for h in record.hosts]
        pids += [h["supervisor"] for h in record.hosts if "supervisor" in h]
    deadline = time.monotonic() + 15  # ray.kill of an actor returns before its process exits
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [pid for pid in pids if _alive(pid)] == []


def _when_all_started(scratch, then, ranks=4):
    """Run `then()` in a thread once `ranks` ranks wrote their start file into `scratch`."""
    def wait():
        deadline = time.monotonic() + 120
        while len(glob.glob(os.path.join(scratch, "started-*"))) < ranks:
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)
        then()

    threading.Thread(target=wait, daemon=True).start()


def _train():
    """An all-reduce, then one data-parallel SGD step; every rank returns what it holds."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"hello from rank {rank} of {world} on pid {os.getpid()}")
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    inputs = torch.randn(8, 4, generator=generator)
    model(inputs).pow(2).mean().backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
        parameter.grad /= world
    with torch.no_grad():
        for parameter in model.parameters():
            parameter -= 0.1 * parameter.grad
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    hx.report(step=1, total=1, loss=float(params.abs().sum()))  # a bar per rank in the panel
    if rank == 0:  # a generation's text as it streams, as `hx.generate(stream=True)` sends it
        from hfxla_nb.events import Generated, emit

        emit(Generated(rank, 2, 4, ("Hello",), prompts=("Say",)))
        emit(Generated(rank, 4, 4, (" hosts",), done=True))
    return {"sum": total.item(), "params": params.tolist(), "world": world,
            "host_rank": int(os.environ["RANK"]), "local": int(os.environ["LOCAL_RANK"])}


def _flaky(scratch):
    """Attempt 1: rank 2 (host 1) raises. Attempt 2: rank 2 hangs in native code holding the
    GIL (no heartbeat). Attempt 3: the all-reduce and the data-parallel step."""
    import torch.distributed as dist

    rank = dist.get_rank()
    attempt = len(glob.glob(os.path.join(scratch, f"rank{rank}-*"))) + 1
    open(os.path.join(scratch, f"rank{rank}-{attempt}"), "w").close()
    if attempt < 3:
        dist.barrier()  # every rank counted its attempt before rank 2 fails
        if rank == 2 and attempt == 1:
            raise ValueError("bad batch on host 1")
        if rank == 2:
            ctypes.PyDLL(None).sleep(300)  # PyDLL keeps the GIL: the heartbeat thread stops
        time.sleep(300)
    return _train()


@pytest.mark.filterwarnings("error::UserWarning")  # max_restarts is not "ignored" there
def test_failures_on_host_1_stop_every_host_and_max_restarts_relaunches_them(
        cluster, capfd, tmp_path):
    value = hx.notebook_launcher(_flaky, (str(tmp_path),), cluster=cluster.address,
                                 output="all", max_restarts=2, heartbeat_timeout=10,
                                 **{**LAUNCH, "progress": "console"})
    record = hx.last_launch()
    first, frozen, last = record.attempts
    assert [a.attempt for a in record.attempts] == [1, 2, 3] and last is record
    # Attempt 1: rank 2 on host 1 failed, every other rank (host 0's too) was stopped.
    assert [r.exit_state for r in first.ranks] == ["stopped", "stopped", "failed", "stopped"]
    assert first.ranks[2].error == "ValueError: bad batch on host 1"
    assert "in _flaky" in first.ranks[2].traceback
    # Attempt 2: rank 2 froze; heartbeat_timeout stopped it and every host.
    assert [r.exit_state for r in frozen.ranks] == ["stopped", "stopped", "timeout", "stopped"]
    assert frozen.ranks[2].reason == "froze"
    out, err = capfd.readouterr()
    assert ("hfxla_nb: attempt 1 of 3 failed (host 1 (127.0.0.1) rank 2 failed: ValueError: "
            "bad batch on host 1. Ranks 0, 1 and 3 were stopped.); stopping every host and "
            "relaunching (max_restarts=2): attempt 2 of 3.") in err
    assert re.search(r"hfxla_nb: attempt 2 of 3 failed \(host 1 \(127\.0\.0\.1\) rank 2 "
                     r"failed: no heartbeat for 1\ds: the process is frozen\. Ranks 0, 1 and 3 "
                     r"were stopped\.\); stopping every host and relaunching", err), err
    # Attempt 3: the gloo group spans both hosts; every rank holds the same parameters.
    assert value["sum"] == 1 + 2 + 3 + 4
    assert last.world == 4 and [r.exit_state for r in last.ranks] == ["finished"] * 4
    results = [r.result for r in last.ranks]
    assert {res["sum"] for res in results} == {10.0}
    assert all(res["params"] == results[0]["params"] for res in results)
    assert [(res["host_rank"], res["local"]) for res in results] == [(0, 0), (1, 1), (2, 0),
                                                                     (3, 1)]
    assert [h["ranks"] for h in last.hosts] == [[0, 1], [2, 3]]
    assert len({h["node_id"] for h in last.hosts}) == 2  # one host per node
    # A relaunch keeps each host's actor and forks a new supervisor there.
    assert [h["pid"] for h in first.hosts] == [h["pid"] for h in last.hosts]
    assert {h["supervisor"] for h in first.hosts}.isdisjoint(h["supervisor"] for h in last.hosts)
    for host, rank in [(0, 0), (0, 1), (1, 2), (1, 3)]:
        assert out.count(f"[host {host} rank {rank}] hello from rank {rank} of 4") == 1
        # The panel (console here) names each bar's host and rank.
        assert re.search(rf"^train \[host {host} rank {rank}\] ✔ \|█+\| 1/1", out, re.M), out
    # A generation's text streams from a host as from one: printed as it comes, then drawn
    # under the panel's bars with its prompt, and kept on the record.
    assert out.count("Hello") == 2 and out.count("> Say\n  Hello hosts\n") == 1, out
    assert [event.texts for event in last.streamed] == [("Hello",), (" hosts",)]
    assert "✖ launch of 4 ranks failed after" in out  # attempt 1's panel, by host and rank:
    assert re.search(r"failed after [^:\n]+: host 1 rank 2 raised ValueError\n", out), out
    _nothing_left(*record.attempts)


def _wait_forever(scratch):
    import torch.distributed as dist

    open(os.path.join(scratch, f"started-{dist.get_rank()}"), "w").close()
    time.sleep(300)


def test_interrupt_stops_every_host(cluster, tmp_path, capsys):
    _when_all_started(str(tmp_path), _thread.interrupt_main)
    with pytest.raises(KeyboardInterrupt):
        hx.notebook_launcher(_wait_forever, (str(tmp_path),), cluster=cluster.address,
                             max_restarts=1, **LAUNCH)
    assert "hfxla_nb: interrupted; every host's worker processes were stopped." in (
        capsys.readouterr().err)
    record = hx.last_launch()
    assert record.outcome == "interrupted" and record.attempt == 1  # the stop is not retried
    assert [r.exit_state for r in record.ranks] == ["interrupted"] * 4
    _nothing_left(record)


def test_a_host_whose_actor_dies_is_named_and_the_other_host_stopped(cluster, tmp_path):
    def kill_host_1():
        os.kill(hx.last_launch().hosts[1]["pid"], signal.SIGKILL)

    _when_all_started(str(tmp_path), kill_host_1)
    began = time.monotonic()
    with pytest.raises(hx.LaunchError) as caught:
        hx.notebook_launcher(_wait_forever, (str(tmp_path),), cluster=cluster.address,
                             max_restarts=1, **LAUNCH)
    killed_after = time.monotonic() - began
    message = str(caught.value)
    assert message.startswith(
        "host 1 (127.0.0.1) rank 2 failed: its host left the cluster or the host's Ray actor "
        "died (ActorDiedError); its processes died with it. Ranks 0 and 1 were stopped.")
    assert message.endswith("Not relaunched: a host left the cluster, and a launch is "
                            "relaunched on the hosts it started on.")
    record = caught.value.record
    assert record.attempt == 1
    assert [r.exit_state for r in record.ranks] == ["stopped", "stopped", "killed", "killed"]
    assert killed_after < 60  # the others sleep 300 s
    _nothing_left(record)


def test_timeout_stops_every_host_and_names_the_ranks(cluster, tmp_path):
    with pytest.raises(hx.LaunchError, match=r"the launch timed out after 8s and was stopped. "
                       r"Still running: rank 0 before its first step, rank 1 before"):
        hx.notebook_launcher(_wait_forever, (str(tmp_path),), cluster=cluster.address,
                             timeout=8, **LAUNCH)
    record = hx.last_launch()
    assert record.outcome == "timeout"
    assert [r.exit_state for r in record.ranks] == ["timeout"] * 4
    _nothing_left(record)


def test_more_hosts_than_nodes_is_refused_before_anything_starts(cluster):
    before = hx.last_launch()
    with pytest.raises(LaunchRefusedError, match=r"hosts=3 asks for 3 hosts of 4 TPU chips, "
                       r"and the cluster has 2 nodes \(2 with 4 TPU chips\)"):
        hx.notebook_launcher(_train, (), cluster=cluster.address, **{**LAUNCH, "hosts": 3})
    assert hx.last_launch() is before


def test_an_address_that_does_not_answer_is_refused_within_seconds():
    began = time.monotonic()
    with pytest.raises(LaunchRefusedError, match=r"nothing answers at 127.0.0.1:9 within 3s"):
        hx.notebook_launcher(_train, (), cluster="127.0.0.1:9", **LAUNCH)
    assert time.monotonic() - began < 5
