"""The gloo rendezvous (`launch/rendezvous.py`): the store's port is bound from before any rank
is forked until the launch ends, so no other connection can take it in between (a loaded
two-host run's gloo mesh once failed to connect because one did, #29)."""

from __future__ import annotations

import errno
import socket

import pytest

from hfxla_nb.launch import rendezvous
from hfxla_nb.launch.pods.host import HostLaunch


def _bind(port: int) -> None:
    with socket.socket() as sock:
        sock.bind(("", port))


def test_the_store_holds_its_port_while_it_lives():
    store = rendezvous.open_store(0)
    port = int(store.port)
    assert port > 0
    with pytest.raises(OSError) as taken:
        _bind(port)
    assert taken.value.errno == errno.EADDRINUSE
    del store
    _bind(port)  # released with the store


def test_host_0_binds_the_rendezvous_before_any_host_starts_and_frees_it_at_stop():
    host = HostLaunch()
    port = host.open_rendezvous()
    with pytest.raises(OSError):
        _bind(port)  # the old free_port() returned a port nobody held
    again = host.open_rendezvous()  # the next attempt: a fresh store, the last one closed
    _bind(port)
    host.stop()  # the launch's end: nothing started, the store closed
    _bind(again)


def test_a_port_asked_for_that_is_taken_is_refused_at_once():
    with socket.socket() as sock:
        sock.bind(("", 0))
        sock.listen()
        with pytest.raises(RuntimeError, match=str(sock.getsockname()[1])):
            rendezvous.open_store(sock.getsockname()[1])
