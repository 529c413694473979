"""Run code the way a notebook does (nbclient, a real ipykernel) or in a fresh Python process.

`run_notebook` executes cells in a real kernel and returns the outputs as nbconvert would store
them: `update_display_data` messages already applied to the outputs they update.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PJRT_DEVICE="CPU", **extra)
    env.pop("CPU_NUM_DEVICES", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_notebook(cells: list[str], timeout: int = 120) -> list[list[dict]]:
    """Execute `cells` in a fresh python3 kernel; returns each cell's outputs (errors included,
    as outputs of type "error"), after display updates were applied."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(textwrap.dedent(code)) for code in cells]
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(ROOT)}},
    )
    client.execute(env=_env())
    return [list(cell.get("outputs", [])) for cell in notebook.cells]


def stdout_of(outputs: list[dict]) -> str:
    """The stdout text of one cell's outputs."""
    return "".join(o.get("text", "") for o in outputs if o.get("name") == "stdout")


def stderr_of(outputs: list[dict]) -> str:
    """The stderr text of one cell's outputs (IPython prints a `UsageError` there)."""
    return "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")


def error_of(outputs: list[dict]) -> dict | None:
    """The error output of one cell, or None."""
    return next((o for o in outputs if o.get("output_type") == "error"), None)


def bundles_of(outputs: list[dict]) -> list[dict]:
    """The mime bundles (`data`) of a cell's display_data / execute_result outputs."""
    return [o["data"] for o in outputs if o.get("output_type") in ("display_data",
                                                                    "execute_result")]


def run_python(code: str, timeout: int = 120, **env: str) -> dict:
    """Run `code` in a fresh interpreter with XLA on the CPU; it must print one JSON object as
    its last line of stdout, which is returned."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(**env),
        cwd=str(ROOT),
    )
    if result.returncode != 0:
        raise AssertionError(f"subprocess failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])
