"""A real Jupyter kernel for the bench: where a notebook's figures are measured (a cell's
output goes through ipykernel's streams, a launch forks the kernel process itself)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from jupyter_client.manager import KernelManager

from .cell_messages import cell_messages


@dataclass
class Cell:
    """What one executed cell printed, and whether it raised."""

    stdout: str
    stderr: str
    error: str | None
    seconds: float


class BenchKernel:
    """A python3 kernel of this interpreter, with the bench's environment (`bench_environment`
    ran first) and the repository on its path."""

    def __init__(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        env.pop("CPU_NUM_DEVICES", None)
        self.manager = KernelManager(kernel_name="python3")
        self._log = open(os.devnull, "w")  # noqa: SIM115 - kept open while the kernel runs
        self.manager.start_kernel(env=env, stdout=self._log, stderr=self._log, cwd=root)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)

    def run(self, code: str, timeout: float = 600) -> Cell:
        """Execute `code` as one cell; returns when the kernel is idle again (all of the
        cell's output received)."""
        stdout, stderr, error = [], [], None
        start = time.monotonic()
        msg_id = self.client.execute(code)
        for message in cell_messages(self.client, msg_id, poll=1.0):
            kind, content = message or ("", {})
            if kind == "stream":
                (stdout if content["name"] == "stdout" else stderr).append(content["text"])
            elif kind == "error":
                error = f"{content['ename']}: {content['evalue']}"
            if time.monotonic() - start > timeout:
                self.manager.interrupt_kernel()
                raise TimeoutError(f"cell did not finish in {timeout} s:\n{code}")
        return Cell("".join(stdout), "".join(stderr), error, time.monotonic() - start)

    def value(self, expression: str, timeout: float = 600) -> object:
        """`expression` evaluated in the kernel (through its repr on the cell's last line)."""
        import ast

        cell = self.run(f"print(repr({expression}))", timeout)
        if cell.error:
            raise RuntimeError(cell.error)
        return ast.literal_eval(cell.stdout.strip().splitlines()[-1])

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)
        self._log.close()
