"""Checks of a multi-host launch, in the notebook, before anything starts on any host.

Each refusal is a `LaunchRefusedError` that says what to do. The checks that need the cluster
take what they read from it as arguments (node lists, versions), so tests drive each case.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from ..preflight import LaunchRefusedError

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
