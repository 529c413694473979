"""notebook_launcher(cluster=..., hosts=2) on a real 2-node Ray cluster (tests/pods/conftest.py):
the debug strategy's gloo group spans both hosts; output, failures and interrupts of every
host reach the notebook side; nothing of a launch is left on any node."""

from __future__ import annotations

import _thread
import os
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


def _nothing_left(record) -> None:
    """No rank process, host supervisor or host actor of the launch is running (the nodes
    share this machine's pid namespace)."""
    pids = [r.pid for r in record.ranks if r.pid] + [h["pid"] for h in record.hosts]
    pids += [h["supervisor"] for h in record.hosts if "supervisor" in h]
    deadline = time.monotonic() + 15  # ray.kill of an actor returns before its process exits
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [pid for pid in pids if _alive(pid)] == []


def _train(scratch):
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
    return {"sum": total.item(), "params": params.tolist(), "world": world,
            "host_rank": int(os.environ["RANK"]), "local": int(os.environ["LOCAL_RANK"])}


def test_allreduce_and_data_parallel_step_agree_on_every_host(cluster, capsys, tmp_path):
    value = hx.notebook_launcher(_train, (str(tmp_path),), cluster=cluster.address,
                                 output="all", **LAUNCH)
    record = hx.last_launch()
    assert value["sum"] == 1 + 2 + 3 + 4
    assert record.world == 4 and [r.exit_state for r in record.ranks] == ["finished"] * 4
    results = [r.result for r in record.ranks]
    assert {res["sum"] for res in results} == {10.0}
    assert all(res["params"] == results[0]["params"] for res in results)
    assert [(res["host_rank"], res["local"]) for res in results] == [(0, 0), (1, 1), (2, 0),
                                                                     (3, 1)]
    assert [h["ranks"] for h in record.hosts] == [[0, 1], [2, 3]]
    assert len({h["node_id"] for h in record.hosts}) == 2  # one host per node
    out = capsys.readouterr().out
    for host, rank in [(0, 0), (0, 1), (1, 2), (1, 3)]:
        assert f"[host {host} rank {rank}] hello from rank {rank} of 4" in out
    _nothing_left(record)


def _fail_on_host_1(scratch):
    import torch.distributed as dist

    if dist.get_rank() == 2:
        raise ValueError("bad batch on host 1")
    time.sleep(300)


def test_failure_on_host_1_stops_every_host_and_is_named(cluster):
    began = time.monotonic()
    with pytest.raises(hx.LaunchError) as caught:
        hx.notebook_launcher(_fail_on_host_1, ("",), cluster=cluster.address, **LAUNCH)
    elapsed = time.monotonic() - began
    message = str(caught.value)
    assert message.startswith("host 1 (127.0.0.1) rank 2 failed: ValueError: bad batch on "
                              "host 1.")
    assert "Remote traceback (rank 2)" in message and "in _fail_on_host_1" in message
    record = caught.value.record
    assert [r.exit_state for r in record.ranks] == ["stopped", "stopped", "failed", "stopped"]
    assert elapsed < 120  # the others sleep 300 s: they were stopped
    _nothing_left(record)


def _wait_forever(scratch):
    import torch.distributed as dist

    open(os.path.join(scratch, f"started-{dist.get_rank()}"), "w").close()
    time.sleep(300)


def test_interrupt_stops_every_host(cluster, tmp_path):
    def interrupt_when_all_started():
        deadline = time.monotonic() + 120
        while len(os.listdir(tmp_path)) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        _thread.interrupt_main()

    threading.Thread(target=interrupt_when_all_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        hx.notebook_launcher(_wait_forever, (str(tmp_path),), cluster=cluster.address,
                             **LAUNCH)
    record = hx.last_launch()
    assert record.outcome == "interrupted"
    assert [r.exit_state for r in record.ranks] == ["interrupted"] * 4
    _nothing_left(record)


def test_more_hosts_than_nodes_is_refused_before_anything_starts(cluster):
    before = hx.last_launch()
    with pytest.raises(LaunchRefusedError, match=r"hosts=3 asks for 3 hosts of 4 TPU chips, "
                       r"and the cluster has 2 nodes \(2 with 4 TPU chips\)"):
        hx.notebook_launcher(_train, ("",), cluster=cluster.address, **{**LAUNCH, "hosts": 3})
    assert hx.last_launch() is before


def test_an_address_that_does_not_answer_is_refused_within_seconds(cluster):
    began = time.monotonic()
    with pytest.raises(LaunchRefusedError, match=r"nothing answers at 127.0.0.1:9 within 3s"):
        hx.notebook_launcher(_train, ("",), cluster="127.0.0.1:9", **LAUNCH)
    assert time.monotonic() - began < 5


def test_timeout_stops_every_host_and_names_the_ranks(cluster, tmp_path):
    with pytest.raises(hx.LaunchError, match=r"the launch timed out after 8s and was stopped. "
                       r"Still running: rank 0 before its first step, rank 1 before"):
        hx.notebook_launcher(_wait_forever, (str(tmp_path),), cluster=cluster.address,
                             timeout=8, **LAUNCH)
    record = hx.last_launch()
    assert record.outcome == "timeout"
    assert [r.exit_state for r in record.ranks] == ["timeout"] * 4
    _nothing_left(record)
