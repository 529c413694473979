"""What the tests share: a real Jupyter kernel (start it, run cells, read what a notebook
shows), notebooks run the way nbclient runs them, fresh Python processes with XLA on the CPU,
the guard of the refusal tests, small readers of a run's result and of a panel's HTML, a
stand-in for IPython's display, and a clock the test moves by hand. (The fixtures the tests
share are in tests/conftest.py.)

`run_notebook` executes cells in a real kernel and returns the outputs as nbconvert would store
them: `update_display_data` messages already applied to the outputs they update.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from bench.cell_messages import cell_messages

ROOT = Path(__file__).resolve().parents[1]
# What ipykernel logs when a forked worker sends on the kernel's sockets: a worker never does.
FORK_SEND = "send message from fork"


def subprocess_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child: XLA on the CPU (its default device count), the
    repository importable, and `extra` on top."""
    env = dict(os.environ, PJRT_DEVICE="CPU", **extra)
    env.pop("CPU_NUM_DEVICES", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_python(code: str, timeout: int = 180, **env: str) -> dict:
    """Run `code` (dedented) in a fresh interpreter with XLA on the CPU; it must print one JSON
    object as its last line of stdout, which is returned.

    Raises:
        AssertionError: the process failed (the end of its stderr is the message).
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(**env),
        cwd=str(ROOT),
    )
    if result.returncode != 0:
        raise AssertionError(f"subprocess failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- a real Jupyter kernel -------------------------------------------------------------------


@dataclass
class CellOutput:
    """What one executed cell produced."""

    stdout: str = ""
    stderr: str = ""
    error: dict | None = None  # {"ename", "evalue", "traceback"} when the cell raised
    displays: list[dict] = field(default_factory=list)  # display_data / execute_result bundles
    updates: list[dict] = field(default_factory=list)  # update_display_data bundles
    duration: float = 0.0
    after_interrupt: float | None = None  # seconds from the stop button to the cell's end
    msg_id: str = ""  # the execute request's id: its late output is matched by it

    @property
    def text(self) -> str:
        return self.stdout + self.stderr

    def add_stream(self, content: dict) -> None:
        """A `stream` message's text, on the stream it names."""
        if content["name"] == "stdout":
            self.stdout += content["text"]
        else:
            self.stderr += content["text"]


class Kernel:
    """A python3 kernel running this interpreter (the test virtualenv), with PJRT_DEVICE=CPU."""

    def __init__(self, **env: str) -> None:
        from jupyter_client.manager import KernelManager  # imported by the tests that use it

        self.manager = KernelManager(kernel_name="python3")
        kernel_env = dict(os.environ, PJRT_DEVICE="CPU", **env)
        kernel_env.pop("CPU_NUM_DEVICES", None)
        # The kernel's own log (what a terminal running `jupyter lab` would show).
        self._log = tempfile.TemporaryFile(mode="w+")
        self.manager.start_kernel(env=kernel_env, stdout=self._log, stderr=self._log)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    @property
    def pid(self) -> int:
        return self.manager.provisioner.process.pid

    def run(
        self, code: str, timeout: float = 120, interrupt_after: float | None = None,
        interrupt_on: str | None = None,
    ) -> CellOutput:
        """Execute `code` as one cell; optionally press the stop button after some seconds,
        or `interrupt_after` seconds after `interrupt_on` first appears in the cell's output
        (a machine under load may take longer than usual to get there). Returns when the
        kernel is idle again (every message of the cell received); past `timeout`, presses the
        stop button, waits for the kernel (`_stop_stuck_cell`) and raises TimeoutError."""
        output = CellOutput()
        start = time.monotonic()
        msg_id = output.msg_id = self.client.execute(code)
        interrupted: float | bool = False
        seen_at: float | None = None
        for message in cell_messages(self.client, msg_id, poll=0.5):
            kind, content = message or ("", {})
            if kind == "stream":
                output.add_stream(content)
            elif kind == "error":
                output.error = content
            elif kind in ("display_data", "execute_result"):
                output.displays.append(content)
            elif kind == "update_display_data":
                output.updates.append(content)
            if time.monotonic() - start > timeout:
                stuck = self._stop_stuck_cell(msg_id)
                raise TimeoutError(f"cell did not finish in {timeout}s:\n{code}\n{output.text}"
                                   f"\n{stuck}")
            if interrupt_on is not None and seen_at is None and interrupt_on in output.text:
                seen_at = time.monotonic()
            since = start if interrupt_on is None else seen_at
            if (
                interrupt_after is not None
                and not interrupted
                and since is not None
                and time.monotonic() - since > interrupt_after
            ):
                self.manager.interrupt_kernel()
                interrupted = time.monotonic()
        output.duration = time.monotonic() - start
        if interrupted:
            output.after_interrupt = time.monotonic() - interrupted
        return output

    def _late_streams(self, output: CellOutput, quiet: float = 0.2) -> None:
        """Output of the cell that arrives after its idle status: older ipykernels (Colab's
        6.17) flush stdout from a thread and can send it late on a busy machine. Reads until
        no message came for `quiet` seconds."""
        while True:
            try:
                message = self.client.get_iopub_msg(timeout=quiet)
            except Exception:  # noqa: BLE001 - queue.Empty: nothing more
                return
            if (message["parent_header"].get("msg_id") == output.msg_id
                    and message["msg_type"] == "stream"):
                output.add_stream(message["content"])

    def _stop_stuck_cell(self, msg_id: str, wait: float = 30) -> str:
        """Press the stop button on a cell that ran too long and wait for the kernel to be idle,
        so one stuck cell fails one test, not every later test that shares the kernel.
        Returns what helps to find out why it was stuck: the kernel's log and the cell's end."""
        self.manager.interrupt_kernel()
        deadline = time.monotonic() + wait
        ended = "still busy 30 s after the interrupt"
        for message in cell_messages(self.client, msg_id, poll=0.5):
            if time.monotonic() > deadline:
                break
            if message is not None and message[0] == "error":
                ended = "interrupted:\n" + "\n".join(message[1]["traceback"][-6:])
        return f"{ended}\nkernel log (end):\n{self.log()[-2000:]}"

    def value(self, expression: str, timeout: float = 60):
        """Evaluate `expression` in the kernel and return it (through its repr)."""
        import ast

        result = self.run(f"print(repr({expression}))", timeout=timeout)
        if not result.stdout.strip():
            self._late_streams(result, quiet=2.0)
        if result.error:
            raise RuntimeError(f"{result.error['ename']}: {result.error['evalue']}")
        return ast.literal_eval(result.stdout.strip().splitlines()[-1])

    def log(self) -> str:
        """Everything the kernel process wrote to its own stdout and stderr so far."""
        self._log.flush()
        self._log.seek(0)
        return self._log.read()

    def close(self) -> None:
        """Stop the channels and the kernel (one its test killed too), and drop the manager's
        sockets: left open, their context waits on them for ever when the interpreter
        collects it at exit (`zmq_ctx_term`), and pytest never ends."""
        self.client.stop_channels()
        try:
            self.manager.shutdown_kernel(now=True)
        finally:
            self.manager.context.destroy(linger=0)

    def run_ok(self, code: str, timeout: float = 120) -> CellOutput:
        """Run `code` (dedented) as one cell; fail the test with the cell's traceback if it
        raised."""
        output = self.run(textwrap.dedent(code), timeout=timeout)
        assert output.error is None, (output.error or {}).get("traceback")
        return output


def run_ok(kernel: Kernel, code: str, timeout: float = 180) -> CellOutput:
    """`kernel.run_ok`: run `code` (dedented) as one cell, fail the test if it raised."""
    return kernel.run_ok(code, timeout)


def started_kernel(setup: str = "", fork_quiet: bool = False, **env: str) -> Iterator[Kernel]:
    """The body of a kernel fixture: a kernel that ran `setup` (dedented) without error, closed
    after the fixture's scope.

    Args:
        setup: the first cell (imports, functions the tests launch); none when empty.
        fork_quiet: at the end, also fail when the kernel's log shows that a forked worker sent
            on the kernel's sockets.
        env: variables set in the kernel's environment.
    """
    kernel = Kernel(**env)
    if setup.strip():
        done = kernel.run(textwrap.dedent(setup))
        assert done.error is None, done.error
    yield kernel
    log = kernel.log()
    kernel.close()
    if fork_quiet:
        assert FORK_SEND not in log, log[-2000:]


def kernel_fixture(setup: str = "", scope: str = "module", fork_quiet: bool = False,
                   **env: str) -> Callable:
    """A pytest fixture named by the name it is assigned to (`kernel = kernel_fixture(SETUP)`):
    `started_kernel(setup, fork_quiet, **env)` for each `scope` (one kernel per module by
    default)."""

    @pytest.fixture(scope=scope)
    def kernel() -> Iterator[Kernel]:
        yield from started_kernel(setup, fork_quiet, **env)

    return kernel


# -- notebooks through nbclient --------------------------------------------------------------


def run_notebook(cells: list[str], timeout: int = 120) -> list[list[dict]]:
    """Execute `cells` in a fresh python3 kernel; returns each cell's outputs (errors included,
    as outputs of type "error"), after display updates were applied."""
    import nbformat  # imported by the tests that use it: jsonschema's takes seconds
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(textwrap.dedent(code)) for code in cells]
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(ROOT)}},
    )
    client.execute(env=subprocess_env())
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




# -- launches ---------------------------------------------------------------------------------


def refuse_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any launch fail the test (bad input must be refused before anything is forked):
    `notebook_launcher` where the launch package defines it and where `fine_tune` uses it, and
    the launcher's attempts, which `hx.notebook_launcher` (bound at import) reaches after its
    checks."""
    import hfxla_nb.launch
    import hfxla_nb.launch.launcher
    import hfxla_nb.train.finetune

    def refuse(*args, **kwargs):
        raise AssertionError("notebook_launcher was called")

    def refuse_attempts(*args, **kwargs):
        raise AssertionError("a launch was started")

    monkeypatch.setattr(hfxla_nb.launch, "notebook_launcher", refuse)
    monkeypatch.setattr(hfxla_nb.launch, "launch", refuse)  # what fine_tune calls
    monkeypatch.setattr(hfxla_nb.train.finetune, "launch", refuse)
    monkeypatch.setattr(hfxla_nb.launch.launcher, "_Attempts", refuse_attempts)


def losses(result) -> np.ndarray:
    """The training losses of a `FineTuneResult`, in step order."""
    return np.array([loss for _, loss in result.loss_history])


def formatted_by_a_shell(value: object) -> dict:
    """`value`'s display bundle as a real IPython shell with hfxla_nb's formatters makes it."""
    from IPython.core.interactiveshell import InteractiveShell

    from hfxla_nb.ui.panels import register

    shell = InteractiveShell.instance()
    try:
        assert register(shell)
        bundle, _ = shell.display_formatter.format(value)
    finally:
        InteractiveShell.clear_instance()
    return bundle


#: Where a `Clock` starts: any fixed wall time.
T0 = 1_000_000.0


class Clock:
    """A wall clock the test moves by hand (`clock.now += 2.0`), for readers and panels.

    Args:
        start: The time it shows first.
    """

    def __init__(self, start: float = T0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class Elements(HTMLParser):
    """Every element of a piece of HTML as `[tag, attributes, text inside it]`, in order, the
    text of the whole as a browser's `textContent` gives it, and how many elements are at the
    top (a panel has one: its box).

    Args:
        html: The HTML to read.
        boxed: Whether text outside every element fails the test (a panel's text is all
            inside its box).
    """

    VOID = ("br", "polyline")  # elements that hold nothing, written without an end tag

    def __init__(self, html: str, boxed: bool = False) -> None:
        super().__init__()
        self.elements: list[list] = []
        self.open: list[list] = []
        self.text = ""
        self.tops = 0
        self.boxed = boxed
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        element = [tag, dict(attrs), ""]
        self.elements.append(element)
        self.tops += not self.open
        if tag not in self.VOID:
            self.open.append(element)

    def handle_startendtag(self, tag: str, attrs: list) -> None:  # `<polyline .../>`
        self.elements.append([tag, dict(attrs), ""])
        self.tops += not self.open

    def handle_endtag(self, tag: str) -> None:
        if any(element[0] == tag for element in self.open):
            while self.open.pop()[0] != tag:
                pass

    def handle_data(self, data: str) -> None:
        assert self.open or not self.boxed or not data.strip(), (
            f"text outside the panel's box: {data!r}")
        self.text += data
        for element in self.open:
            element[2] += data

    def texts(self, tag: str) -> list[str]:
        """The text inside each `tag` element, in order."""
        return [text for name, _, text in self.elements if name == tag]

    def styles(self, tag: str) -> list[str | None]:
        """The `style` attribute of each `tag` element, in order (None where it has none)."""
        return [attrs.get("style") for name, attrs, _ in self.elements if name == tag]


class Shown:
    """`IPython.display.display(obj, display_id=True)` and its handle's `update`, recorded as
    the mime bundles a notebook would get, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, dict]] = []
        monkeypatch.setattr("IPython.display.display", self.display)

    def display(self, obj, display_id=None):
        assert display_id is True
        self.calls.append(("display", obj._repr_mimebundle_()))
        calls = self.calls

        class Handle:
            def update(self, new):
                calls.append(("update", new._repr_mimebundle_()))

        return Handle()
