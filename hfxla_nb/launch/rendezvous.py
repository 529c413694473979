"""The gloo group's rendezvous (`strategy="debug"`, on one host and on a cluster's hosts): one
`torch.distributed.TCPStore` server that every rank joins as a client.

Why not a port picked free and bound later by rank 0 (`init_method="tcp://..."`): the port is
closed in between, and on a busy host another connection can take it as its source port
before rank 0 binds it again; rank 0 then fails to listen and the other ranks fail to connect
(one loaded two-host run did, #29). The server is held by the process that forks the ranks
(the supervisor, or host 0's Ray actor) until the ranks are gone. On one host it opens after
the ranks are forked, and hands them its port through a pipe (`send_port`, `read_port`): a
rank forked while the server's thread ran could inherit a lock that thread held, and its own
store client then waited on it forever (every rank "not started", #29).
"""

from __future__ import annotations

import os
from typing import Any


def open_store(port: int = 0) -> Any:
    """A store server listening on `port` of every interface (0: a free port, chosen as it is
    bound); its `port` attribute is the port. Kept alive by the caller for the launch.

    Raises:
        RuntimeError: `port` is taken (the message names it).
    """
    import torch.distributed as dist
    from torch.distributed.constants import default_pg_timeout

    return dist.TCPStore("127.0.0.1", port, None, True, timeout=default_pg_timeout,
                         wait_for_workers=False)


# A port as the supervisor hands it to its debug ranks: fixed-size records on one pipe, so
# each rank's read takes exactly one (a write this small is atomic).
_PORT_RECORD = 8


def send_port(fd: int, port: int, ranks: int) -> None:
    """Hand `port` to `ranks` ranks waiting in `read_port`, then close `fd`."""
    try:
        os.write(fd, f"{port:07d}\n".encode() * ranks)
    finally:
        os.close(fd)


def read_port(fd: int) -> int | None:
    """In a debug rank: wait for the store's port from the supervisor, close `fd`, and make it
    this process's `MASTER_PORT`; None when the supervisor could not open the store."""
    data = os.read(fd, _PORT_RECORD)
    os.close(fd)
    if len(data) < _PORT_RECORD:
        return None
    port = int(data)
    os.environ["MASTER_PORT"] = str(port)
    return port


def join_gloo(rank: int, world: int, address: str, port: int) -> None:
    """Join the gloo group of `world` ranks as `rank`, through the store at `address:port`."""
    import torch.distributed as dist
    from torch.distributed.constants import default_pg_timeout

    store = dist.TCPStore(address, int(port), world, False, timeout=default_pg_timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
