"""Refusals that need a fresh kernel-like process: no Ray installed, and a kernel whose XLA
runtime already started. No cluster is started: both are refused before connecting."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r'''
import sys
import hfxla_nb as hx

def train():
    return 1

sys.modules["ray"] = None  # as if Ray were not installed
try:
    hx.notebook_launcher(train, cluster="auto", hosts=2, strategy="debug")
except hx.LaunchRefusedError as error:
    print("NO RAY:", error)
del sys.modules["ray"]

from hfxla_nb import _xla
_xla.device()
import torch
torch.ones(2, device=_xla.device()).sum().item()  # the kernel started the runtime
try:
    hx.notebook_launcher(train, cluster="auto", hosts=2, strategy="debug")
except hx.LaunchRefusedError as error:
    print("STARTED:", error)
'''


def test_no_ray_and_a_started_runtime_are_refused():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=300)
    lines = {line.split(":", 1)[0]: line for line in done.stdout.splitlines() if ":" in line}
    assert 'Install it with `pip install "hfxla_nb[ray]"`' in lines["NO RAY"], done.stderr
    assert "With cluster=, host 0 runs on this machine" in lines["STARTED"], done.stderr
