"""Refusals before anything starts on any host: no Ray installed (in this process, with `ray`
hidden), and a kernel whose XLA runtime already started (a process of its own, started in the
background by tests/pods/conftest.py). Neither connects to a cluster."""

from __future__ import annotations

import sys

import pytest

import hfxla_nb as hx


def test_no_ray_is_refused_with_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(hx.LaunchRefusedError, match=r"Ray is not installed in this kernel\. "
                       r'Install it with `pip install "hfxla_nb\[ray\]"` \(on every host\)'):
        hx.notebook_launcher(lambda: 1, cluster="auto", hosts=2, strategy="debug")


def test_a_started_runtime_is_refused(started_runtime_refusal):
    out, err = started_runtime_refusal.communicate(timeout=300)
    lines = {line.split(":", 1)[0]: line for line in out.splitlines() if ":" in line}
    assert "STARTED" in lines, err
    assert "The XLA runtime is already initialized in this kernel" in lines["STARTED"]
    assert "With cluster=, host 0 runs on this machine" in lines["STARTED"]
