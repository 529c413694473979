"""Where a multi-host launch runs: one placement-group bundle per host, one host per node.

On a TPU slice (the notebook's node knows its pod type and topology), Ray's slice placement
(`ray.util.tpu.slice_placement_group`) reserves the slice's hosts; elsewhere a STRICT_SPREAD
placement group of `hosts` bundles puts each bundle on a node of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..preflight import LaunchRefusedError

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
