"""A throwaway JupyterLab server for browser tests.

It listens on 127.0.0.1 on a free port with a random token, serves a temporary root folder,
and keeps every Jupyter, JupyterLab and IPython folder (config, data, runtime, settings,
workspaces) in a temporary directory, so nothing of the user's setup leaks in and the run
leaves nothing behind. The theme is a user setting written before the start.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat

from . import procs

ROOT = Path(__file__).resolve().parents[2]
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}

# User settings of the run, by plugin. Besides the theme: no news or update checks (no popup
# over the notebook, no network), and every cell kept in the DOM (the default windowing mode
# drops cells scrolled out of view, which the tests read).
SETTINGS = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                    "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class JupyterLab:
    """`jupyter lab` in a temporary home; `stop()` ends it (and its kernels) by pid.

    Args:
        theme: "light" or "dark".
        log_dir: where the server's log goes (it outlives the temporary home).
        start_timeout: seconds to wait for the server to answer.
    """

    def __init__(self, theme: str, log_dir: Path, start_timeout: float = 60.0) -> None:
        self.theme = theme
        self._tmp = tempfile.TemporaryDirectory(prefix="hfxla-browser-")
        home = Path(self._tmp.name)
        self.root = home / "root"
        self.root.mkdir()
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self._write_settings(home / "lab-settings")
        env = dict(os.environ)
        env.pop("CPU_NUM_DEVICES", None)  # the launcher sets the device count itself
        env.update(
            JUPYTER_CONFIG_DIR=str(home / "config"),
            JUPYTER_DATA_DIR=str(home / "data"),
            JUPYTER_RUNTIME_DIR=str(home / "runtime"),
            JUPYTERLAB_SETTINGS_DIR=str(home / "lab-settings"),
            JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
            IPYTHONDIR=str(home / "ipython"),
            PJRT_DEVICE="CPU",
            # Kernels import this checkout's hfxla_nb, whatever the editable install points at.
            PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p),
        )
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"jupyterlab-{theme}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._popen = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
             f"--port={self.port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
             # Root on CI machines; no extension manager or news (they would go online).
             "--allow-root", "--LabApp.extension_manager=readonly", "--LabApp.news_url="],
            env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        self.proc = procs.proc(self._popen.pid)
        self.kernels_seen: dict[int, procs.Proc] = {}
        try:
            self._wait_ready(start_timeout)
        except BaseException:
            self.stop()
            raise

    def _write_settings(self, folder: Path) -> None:
        settings = dict(SETTINGS)
        settings["@jupyterlab/apputils-extension/themes"] = {"theme": THEMES[self.theme]}
        for plugin, values in settings.items():
            path = folder / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._popen.poll() is not None:
                raise RuntimeError(f"jupyter lab exited ({self._popen.returncode}):\n"
                                   + self.log_path.read_text()[-3000:])
            try:
                self.api("status")
                return
            except (OSError, urllib.error.URLError):
                time.sleep(0.1)
        raise TimeoutError(f"jupyter lab did not answer in {timeout}s:\n"
                           + self.log_path.read_text()[-3000:])

    def api(self, path: str, method: str = "GET") -> object:
        """Call the server's REST API (`/api/<path>`); the decoded JSON answer, or None."""
        request = urllib.request.Request(f"{self.url}/api/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def write_notebook(self, name: str, cells: list[str]) -> str:
        """Write a python3 notebook of code `cells` into the root; returns its name."""
        notebook = nbformat.v4.new_notebook()
        notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                           "language": "python"}
        notebook.cells = [nbformat.v4.new_code_cell(code) for code in cells]
        nbformat.write(notebook, self.root / name)
        return name

    def copy_notebook(self, source: Path, name: str) -> str:
        """Copy a notebook file (a tutorial) into the root as `name`; returns the name."""
        nbformat.write(nbformat.read(source, as_version=4), self.root / name)
        return name

    def notebook_url(self, name: str) -> str:
        """The notebook alone in a workspace of its own (the default workspace would reopen
        the notebooks of earlier pages, whose kernels are shut down)."""
        workspace = name.rsplit(".", 1)[0]
        return f"{self.url}/lab/workspaces/{workspace}/tree/{name}?token={self.token}"

    def kernel_processes(self) -> list[procs.Proc]:
        """The live processes below the server (kernels and what they started); each one is
        remembered in `kernels_seen`, for `leftovers()`."""
        found = procs.descendants(self._popen.pid)
        for process in found:
            self.kernels_seen.setdefault(process.pid, process)
        return found

    def shutdown_kernels(self, timeout: float = 20.0) -> list[procs.Proc]:
        """Shut every kernel down through the API; returns the kernel processes still alive
        after `timeout` s (the tests assert there are none)."""
        self.kernel_processes()
        for kernel in self.api("kernels") or []:
            try:
                self.api(f"kernels/{kernel['id']}", method="DELETE")
            except urllib.error.HTTPError:  # it ended meanwhile
                pass
        return procs.wait_gone(list(self.kernels_seen.values()), timeout)

    def leftovers(self) -> list[procs.Proc]:
        """Processes of this run (the server, every kernel process seen) still alive."""
        seen = list(self.kernels_seen.values()) + ([self.proc] if self.proc else [])
        return [p for p in seen if procs.alive(p)]

    def stop(self) -> None:
        """End the server by its pid (it shuts its kernels down on SIGTERM), then any kernel
        process that outlived it, by pid too."""
        if self.proc is not None and procs.alive(self.proc):
            self.kernel_processes()  # remember them: the server may leave some behind
        if self.proc is not None:
            procs.stop(self.proc, grace=10.0)
        self._popen.poll()
        for process in procs.wait_gone(list(self.kernels_seen.values()), 5.0):
            procs.stop(process)
        self._log.close()
        self._tmp.cleanup()
