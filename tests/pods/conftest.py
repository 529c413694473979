"""A real Ray cluster of 2 nodes on this machine, one for the whole session, with 4 TPU chips
declared on each node. `make test-pods` runs these tests in a network namespace of their own
(`unshare -n`, loopback up), so Ray binds 127.0.0.1 and no traffic leaves the loopback; a plain
`pytest` never collects them (tests/conftest.py).

What costs time here is starting Ray workers and importing torch in them (each launch starts
one host actor per node), so the tests share one cluster and as few launches as they can; the
one refusal that needs a fresh process (a kernel whose XLA runtime started) runs in the
background while the cluster starts."""

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


@pytest.fixture(scope="session")
def started_runtime_refusal():
    """A process that started XLA, then launched with cluster=: started at once, read by the
    test that needs it (`communicate()`)."""
    process = subprocess.Popen([sys.executable, "-c", STARTED_RUNTIME], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    yield process
    if process.poll() is None:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def cluster(started_runtime_refusal):
    if not in_own_network_namespace():
        pytest.skip("the pods tests run inside `unshare -n` only: `make test-pods`")
    from ray.cluster_utils import Cluster

    nodes = Cluster(initialize_head=True,
                    head_node_args={"num_cpus": 2, "resources": {"TPU": 4}})
    nodes.add_node(num_cpus=2, resources={"TPU": 4})
    nodes.wait_for_nodes()
    yield nodes
    ray.shutdown()
    nodes.shutdown()
