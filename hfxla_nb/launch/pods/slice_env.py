"""The variables multi-host PJRT reads on each host of a TPU slice, as a pure function.

On a TPU VM, libtpu and torch_xla learn the slice from the VM's metadata server; where a
launcher places the processes itself (Ray, GKE) they come from variables instead
(`torch_xla._internal.tpu.build_tpu_env_from_vars`, read when `TPU_SKIP_MDS_QUERY` is set).
The figures of a slice (its type, topology, chips per host) come from Ray's TPU helpers
(`ray.util.tpu`) in `cluster_launch`; this module only turns them into the variables.
"""

from __future__ import annotations

from collections.abc import Sequence

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
