"""`make demo` with the network blocked: nothing is downloaded at run time, and the figures
docs/fine-tune.md quotes for it are the ones it prints.

The demo runs as `make demo` runs it (`python -m hfxla_nb.demo`, its defaults), in a fresh
process with fresh caches (hfxla_nb's and the Hugging Face hub's), so the tokenizer and the
model are built here and any download would have to go through the network. The network is
cut by a new network namespace (`unshare -n`: no interface is up in it) where this machine
allows one, otherwise by a `sitecustomize` that makes every non-local connection fail; either
way a probe first checks that the Hugging Face hub cannot be reached.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.launch

ROOT = Path(__file__).resolve().parents[1]

# Loaded into every Python process started with it on PYTHONPATH (forked workers inherit it):
# a connection anywhere but this machine or a Unix socket raises, as on a host without network.
BLOCK_SOCKETS = textwrap.dedent(
    """
    import socket

    _connect = socket.socket.connect
    _LOCAL = ("127.0.0.1", "::1", "localhost")

    def _local_only(self, address):
        if self.family != socket.AF_UNIX and address[0] not in _LOCAL:
            raise OSError(101, f"network blocked by the test: {address!r}")
        return _connect(self, address)

    socket.socket.connect = _local_only
    """
)


def offline_command(folder: Path) -> tuple[list[str], dict[str, str]]:
    """The command prefix and environment that run a process without network."""
    env = {**os.environ, "HFXLA_NB_CACHE": str(folder / "cache"), "HF_HOME": str(folder / "hf")}
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE",
                 "CPU_NUM_DEVICES"):
        env.pop(name, None)  # the demo must not need them: a download would be attempted
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return [unshare, "-n"], env
    (folder / "blocker").mkdir()
    (folder / "blocker" / "sitecustomize.py").write_text(BLOCK_SOCKETS)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder / "blocker"),
                                                      env.get("PYTHONPATH")]))
    return [], env


def test_make_demo_runs_with_the_network_blocked(tmp_path):
    prefix, env = offline_command(tmp_path)
    probe = subprocess.run(
        [*prefix, sys.executable, "-c",
         "import socket; socket.create_connection(('huggingface.co', 443), timeout=10)"],
        env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0, "the network is not blocked: this test would prove nothing"

    demo = subprocess.run(
        [*prefix, sys.executable, "-m", "hfxla_nb.demo", "--output-dir", str(tmp_path / "out")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    output = demo.stdout
    assert demo.returncode == 0, (output[-3000:], demo.stderr[-3000:])
    assert {"config.json", "model.safetensors"} <= set(os.listdir(tmp_path / "out"))
    assert list((tmp_path / "cache").glob("demo-tokenizer-*"))  # built here, not fetched

    # The figures docs/fine-tune.md quotes for `make demo`, read from the page itself, are the ones
    # the demo printed (so the sentence and the run cannot drift apart).
    graphs, eval_graphs, executions, transfers, accuracy = readme_demo_figures()
    assert "spmd over 4 devices" in output and "150 steps" in output
    assert (f"{graphs} training + {eval_graphs} evaluation graphs compiled; per step after "
            f"warm-up: {executions} executions, {transfers} device-to-host transfers") in output
    (printed,) = re.findall(r"final accuracy: ([\d.]+)", output)
    assert float(printed) == float(accuracy)


def readme_demo_figures() -> tuple[str, ...]:
    """What docs/fine-tune.md says `make demo` measured: training graphs, evaluation graphs,
    executions per step, transfers per step, validation accuracy (as written)."""
    readme = " ".join((ROOT / "docs" / "fine-tune.md").read_text().split())
    (figures,) = re.findall(
        r"\(`make demo`, tiny BERT, SPMD over 4 virtual devices, 150 steps\): (\d+) training "
        r"graphs? \+ (\d+) evaluation graphs? in total, ([\d.]+) executions? and ([\d.]+) "
        r"device-to-host transfers per step, validation accuracy ([\d.]+)", readme)
    return figures


def test_the_fallback_blocker_refuses_a_remote_connection_and_allows_a_local_one(tmp_path):
    """Where `unshare -n` is not allowed, the sitecustomize is the block: it must hold."""
    (tmp_path / "sitecustomize.py").write_text(BLOCK_SOCKETS)
    code = textwrap.dedent(
        """
        import socket
        server = socket.create_server(("127.0.0.1", 0))
        socket.create_connection(server.getsockname(), timeout=5).close()  # local: allowed
        try:
            socket.create_connection(("192.0.2.1", 443), timeout=5)  # TEST-NET-1, never local
        except OSError as error:
            print("blocked" if "network blocked by the test" in str(error) else error)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=60)
    assert done.stdout.strip() == "blocked", done.stderr
