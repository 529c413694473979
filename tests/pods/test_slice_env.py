"""The multi-host PJRT variables of a slice's hosts, against the values of a v5e-16 and a
v4-32 (what a TPU VM's metadata gives torch_xla there: `accelerator-type` and `tpu-env`'s
HOST_BOUNDS / CHIPS_PER_HOST_BOUNDS / WORKER_ID, the worker addresses in id order), and the
version check across hosts. Pure functions: no cluster needed."""

from __future__ import annotations

import pytest

from hfxla_nb.launch.pods import check_capacity, check_versions
from hfxla_nb.launch.pods.host import SliceError, pjrt_env
from hfxla_nb.launch.preflight import LaunchRefusedError

V5E_16_HOSTS = ["10.130.0.2", "10.130.0.3", "10.130.0.4", "10.130.0.5"]
V4_32_HOSTS = ["10.164.0.10", "10.164.0.11", "10.164.0.12", "10.164.0.13"]


def test_v5e_16_host_2():
    # v5litepod-16: 4x4 chips, 4 hosts of 2x2 chips, hosts laid out 2x2.
    assert pjrt_env("v5litepod-16", "4x4", 4, 2, V5E_16_HOSTS) == {
        "TPU_SKIP_MDS_QUERY": "1",
        "TPU_ACCELERATOR_TYPE": "v5litepod-16",
        "TPU_HOST_BOUNDS": "2,2,1",
        "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
        "TPU_WORKER_ID": "2",
        "TPU_WORKER_HOSTNAMES": ",".join(V5E_16_HOSTS),
    }


def test_v4_32_host_0():
    # v4-32: 16 chips (32 TensorCores) in 2x2x4, 4 hosts of 2x2x1 chips stacked along z.
    assert pjrt_env("v4-32", "2x2x4", 4, 0, V4_32_HOSTS) == {
        "TPU_SKIP_MDS_QUERY": "1",
        "TPU_ACCELERATOR_TYPE": "v4-32",
        "TPU_HOST_BOUNDS": "1,1,4",
        "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
        "TPU_WORKER_ID": "0",
        "TPU_WORKER_HOSTNAMES": ",".join(V4_32_HOSTS),
    }


def test_ray_agrees_on_chips_per_host():
    ray_tpu = pytest.importorskip("ray.util.tpu")
    assert ray_tpu.get_chips_per_host("4x4", "v5litepod") == 4
    assert ray_tpu.get_chips_per_host("2x2x4", "v4") == 4
    assert ray_tpu.infer_tpu_pod_type_from_topology("2x2x4", "v4") == "v4-32"


@pytest.mark.parametrize("hosts, worker, match", [
    (V5E_16_HOSTS[:3], 0, "has 4 hosts; 3 were given"),
    (V5E_16_HOSTS, 4, "worker id 4 is not one of the slice's 4 hosts"),
])
def test_a_slice_that_cannot_be_is_refused(hosts, worker, match):
    with pytest.raises(SliceError, match=match):
        pjrt_env("v5litepod-16", "4x4", 4, worker, hosts)


def test_hosts_with_other_versions_are_named():
    notebook = {"hfxla_nb": "0.1.0", "torch": "2.9.0", "torch_xla": "2.9.0"}
    hosts = [{"host": 0, "address": "10.0.0.1", "versions": dict(notebook)},
             {"host": 1, "address": "10.0.0.2",
              "versions": {**notebook, "torch_xla": "2.8.0", "hfxla_nb": None}}]
    with pytest.raises(LaunchRefusedError) as caught:
        check_versions(notebook, hosts)
    message = str(caught.value)
    assert "host 1 (10.0.0.2) has hfxla_nb not installed, the notebook 0.1.0" in message
    assert "host 1 (10.0.0.2) has torch_xla 2.8.0, the notebook 2.9.0" in message
    assert "host 0" not in message
    check_versions(notebook, hosts[:1])  # the same versions pass


def test_capacity_counts_alive_tpu_nodes():
    node = {"Alive": True, "Resources": {"CPU": 8.0, "TPU": 4.0}}
    assert check_capacity([node, node], 2) == 4
    with pytest.raises(LaunchRefusedError, match=r"the cluster has 2 nodes \(1 with 4 TPU"):
        check_capacity([node, {"Alive": True, "Resources": {"CPU": 8.0}}], 2)
    with pytest.raises(LaunchRefusedError, match=r"has 1 node \(1 alive, without TPUs\)"):
        check_capacity([{"Alive": True, "Resources": {"CPU": 2.0}},
                        {"Alive": False, "Resources": {"CPU": 2.0}}], 2)
