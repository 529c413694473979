"""A real Ray cluster of 2 nodes on this machine, one per test module, with 4 TPU chips
declared on each node. `make test-pods` runs these tests in a network namespace of their own
(`unshare -n`, loopback up), so Ray binds 127.0.0.1 and no traffic leaves the loopback; a plain
`pytest` never collects them (tests/conftest.py)."""

from __future__ import annotations

import socket

import pytest

ray = pytest.importorskip("ray")


def in_own_network_namespace() -> bool:
    """Whether this process's only network interface is the loopback."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


@pytest.fixture(scope="module")
def cluster():
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
