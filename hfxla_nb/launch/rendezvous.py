"""The gloo group's rendezvous (`strategy="debug"`, on one host and on a cluster's hosts): one
`torch.distributed.TCPStore` server that every rank joins as a client.

Why not a port picked free and bound later by rank 0 (`init_method="tcp://..."`): the port is
closed in between, and on a busy host another connection can take it as its source port
before rank 0 binds it again; rank 0 then fails to listen and the other ranks fail to connect
(one loaded two-host run did, #29). The server is held by the process that forks the ranks
(the supervisor, or host 0's Ray actor) until the ranks are gone.

No process may fork while a store's server thread runs in it: a rank forked so could inherit
a lock that thread held, and its own store client then waited on it forever (every rank "not
started", #29). So on one host the store opens after the ranks are forked and hands them its
port through a pipe (`send_port`, `read_port`); host 0's Ray actor, which forks a supervisor
for each attempt, keeps its store in a process of its own (`StoreProcess`).
"""

from __future__ import annotations

import os
import select
import signal
from typing import Any

from .parent_watch import die_with_parent
from .processes import stop_child

STORE_START_TIMEOUT = 30.0  # seconds for a store process to say its port
STORE_STOP_TIMEOUT = 5.0  # seconds for it to close at SIGTERM before SIGKILL


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


class StoreProcess:
    """A store server (`open_store`) in a forked process of its own, so that the process that
    starts it can go on forking (host 0's Ray actor forks a supervisor per attempt). It dies
    with its parent (SIGKILL) and closes at `close()` (SIGTERM).

    Args:
        port: the port to listen on (0: a free one).

    Raises:
        RuntimeError: the store did not open (the port is taken, the message names it; or it
            said nothing within `STORE_START_TIMEOUT`).
    """

    def __init__(self, port: int = 0) -> None:
        said, say = os.pipe()
        pid = os.fork()
        if pid == 0:  # never returns
            os.close(said)
            _serve_store(port, say)
        os.close(say)
        self.pid: int | None = pid
        try:
            self.port = _read_port_or_error(said)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the store's process and reap it (closed already: nothing to do)."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        stop_child(pid, grace=STORE_STOP_TIMEOUT)


def _serve_store(port: int, say: int) -> None:
    """Body of a store's process: open the store, write its port (or the error) to `say`,
    then serve until SIGTERM. Ends the process; never returns."""
    code = 0
    try:
        die_with_parent()
        # SIGTERM is waited for, not handled: blocked before the server's thread starts.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            store = open_store(port)
            message = f"{int(store.port)}"
        except Exception as error:  # noqa: BLE001 - the parent raises it
            message, code = str(error) or type(error).__name__, 1
        os.write(say, message.encode())
        os.close(say)
        if not code:
            signal.sigwait({signal.SIGTERM})
            # Closed in order (its own client first): a killed store can leave its port in
            # TIME_WAIT, and the next attempt may ask for the same port (`use_port`).
            del store
    finally:
        os._exit(code)


def _read_port_or_error(said: int) -> int:
    """The port a store's process wrote to `said` (closed here), or its error raised."""
    data = b""
    try:
        while True:
            ready, _, _ = select.select([said], [], [], STORE_START_TIMEOUT)
            if not ready:
                raise RuntimeError(f"the rendezvous store did not open within "
                                   f"{STORE_START_TIMEOUT:.0f} s")
            chunk = os.read(said, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(said)
    text = data.decode(errors="replace")
    if not text.isdigit():
        raise RuntimeError(text or "the rendezvous store's process ended without a port")
    return int(text)
