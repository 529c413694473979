"""The gloo rendezvous (`launch/processes.py`): the store's port is bound from before any rank
is forked until the launch ends, so no other connection can take it in between (a loaded
two-host run's gloo mesh once failed to connect because one did)."""

from __future__ import annotations

import errno
import os
import socket

import pytest

from hfxla_nb.launch import processes
from hfxla_nb.launch.pods.host import HostLaunch


def _bind(port: int) -> None:
    with socket.socket() as sock:
        sock.bind(("", port))


def test_the_store_holds_its_port_while_it_lives():
    store = processes.open_store(0)
    port = int(store.port)
    assert port > 0
    with pytest.raises(OSError) as taken:
        _bind(port)
    assert taken.value.errno == errno.EADDRINUSE
    del store
    _bind(port)  # released with the store


@pytest.mark.launch
@pytest.mark.launch  # forks the store's process (`StoreProcess`)
def test_host_0_binds_the_rendezvous_before_any_host_starts_and_frees_it_at_stop():
    host = HostLaunch()
    port = host.open_rendezvous()
    with pytest.raises(OSError):
        _bind(port)  # the old free_port() returned a port nobody held
    again = host.open_rendezvous()  # the next attempt: a fresh store, the last one closed
    _bind(port)
    host.stop()  # the launch's end: nothing started, the store closed
    _bind(again)


def _listening_here(port: int) -> bool:
    """Whether this process holds the socket that listens on `port` (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                    inodes.add(fields[9])
    assert inodes, f"nothing listens on {port}"
    mine = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}
    return any(f"socket:[{inode}]" in mine for inode in inodes)


@pytest.mark.launch
@pytest.mark.launch  # forks the store's process and five clients
def test_host_0_keeps_its_store_in_a_process_of_its_own_and_forks_safely():
    # The actor forks a supervisor per attempt: a fork while a store's server thread ran in it
    # left a rank's store client waiting forever on a lock that thread held.
    host = HostLaunch()
    port = host.open_rendezvous()
    try:
        assert not _listening_here(port)
        for _ in range(5):  # forked children join the store and use it
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    import torch.distributed as dist

                    client = dist.TCPStore("127.0.0.1", port, None, False)
                    client.set(f"key{os.getpid()}", "value")
                    code = 0 if client.get(f"key{os.getpid()}") == b"value" else 1
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
    finally:
        host.stop()
    _bind(port)  # the store's process is gone with its port


@pytest.mark.launch
@pytest.mark.launch  # forks the store's process
def test_a_store_process_on_a_taken_port_raises_naming_it():
    with socket.socket() as sock:
        sock.bind(("", 0))
        sock.listen()
        taken = sock.getsockname()[1]
        with pytest.raises(RuntimeError, match=str(taken)):
            processes.StoreProcess(taken)


def test_a_port_asked_for_that_is_taken_is_refused_at_once():
    with socket.socket() as sock:
        sock.bind(("", 0))
        sock.listen()
        with pytest.raises(RuntimeError, match=str(sock.getsockname()[1])):
            processes.open_store(sock.getsockname()[1])
