"""A real Ray cluster of 2 nodes on this machine, one for the whole session, with 4 TPU chips
declared on each node. `make test-pods` runs these tests in a network namespace of their own
(`unshare -n`, loopback up), so Ray binds 127.0.0.1 and no traffic leaves the loopback; a plain
`pytest` never collects them (tests/conftest.py).

What costs time here is starting Ray workers and importing torch in them (each launch starts
one host actor per node), so the tests share one cluster and as few launches as they can; the
one refusal that needs a fresh process (a kernel whose XLA runtime started) runs in the
background from the cluster's start on."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

ray = pytest.importorskip("ray")

STARTED_RUNTIME = r'''
import hfxla_nb as hx
from hfxla_nb import _xla
import torch

torch.ones(2, device=_xla.device()).sum().item()  # the kernel started the runtime
try:
    hx.notebook_launcher(lambda: 1, cluster="auto", hosts=2, strategy="debug")
except hx.LaunchRefusedError as error:
    print("STARTED:", error)
'''


def in_own_network_namespace() -> bool:
    """Whether this process's only network interface is the loopback."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def _start_cluster(attempts: int = 2):
    """Ray gives a node's agents about 15 s to start and the node 30 s to register with the
    GCS; on a machine busy with other work that can run out: start again."""
    from ray.cluster_utils import Cluster

    for attempt in range(attempts):
        try:
            nodes = Cluster(initialize_head=True,
                            head_node_args={"num_cpus": 2, "resources": {"TPU": 4}})
            nodes.add_node(num_cpus=2, resources={"TPU": 4})
            nodes.wait_for_nodes()
            return nodes
        except Exception:
            if attempt == attempts - 1:
                raise
            ray.shutdown()


@pytest.fixture(scope="session")
def cluster():
    """The cluster, and (`.started_runtime_refusal`) the refusal's process, started once the
    cluster is up so that it does not slow the nodes' registration."""
    if not in_own_network_namespace():
        pytest.skip("the pods tests run inside `unshare -n` only: `make test-pods`")
    nodes = _start_cluster()
    nodes.started_runtime_refusal = subprocess.Popen(
        [sys.executable, "-c", STARTED_RUNTIME], text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    yield nodes
    if nodes.started_runtime_refusal.poll() is None:
        nodes.started_runtime_refusal.kill()
        nodes.started_runtime_refusal.wait()
    ray.shutdown()
    nodes.shutdown()


@pytest.fixture(scope="session")
def started_runtime_refusal(cluster):
    """A process that started XLA, then launched with cluster= (runs in the background from
    the cluster's start on; `communicate()` waits for it)."""
    return cluster.started_runtime_refusal
