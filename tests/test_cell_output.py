"""What the cell shows while and after a launch runs, in real Jupyter kernels: XLA's C++ log
lines folded, one count of steps, panels for stopped ranks and for launches that ran no XLA.

One kernel serves every launch here (each leaves it usable); the relay's folding is also
driven directly, on real pipes.
"""

from __future__ import annotations

import os
import re
import textwrap

import pytest

from hfxla_nb.launch.output import NativeRelay
from tests.helpers import kernel_fixture, run_ok

GSPMD = "Please consider migrating to Shardy"

SPMD_LOOP = """
import hfxla_nb as hx

def shapes_loop(index):
    import numpy as np
    import torch, torch_xla
    import torch_xla.runtime as xr
    import torch_xla.distributed.spmd as xs
    device = torch_xla.device()
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (n,), ("data",))
    for step in range(12):  # 12 shapes: 12 SPMD compilations, each warned about by XLA
        x = torch.ones(4 * (step + 1), 8, device=device)
        xs.mark_sharding(x, mesh, ("data", None))
        loss = (x * 2).sum()
        torch_xla.sync()
        hx.report(step=step + 1, total=12, loss=loss)

hx.configure(cores=4)
"""


kernel = kernel_fixture(SPMD_LOOP)


@pytest.mark.kernel
def test_a_repeated_xla_warning_is_one_muted_line_at_the_end_with_its_count(kernel):
    output = run_ok(kernel, 'hx.notebook_launcher(shapes_loop, strategy="spmd", progress=False)')
    # Not while the run goes on, no raw timestamp: one muted line, at the end, with the count
    # (XLA's GSPMD notice comes with every SPMD launch).
    muted = [line for line in output.stderr.splitlines() if line.startswith("\x1b[2m")]
    assert [line.removeprefix("\x1b[2m").removesuffix("\x1b[0m") for line in muted] == [
        "XLA warning ×12 (sharding_propagation.cc:3120): GSPMD sharding propagation is going to "
        "be deprecated",
        "    and not supported in the future. Please … (hx.last_launch().native_log has them "
        "all)"], muted  # wrapped at spaces: the browser breaks no word
    assert output.stderr.count("GSPMD") == 1
    assert output.stderr.rstrip().endswith(muted[-1])
    assert not re.search(r"\d\d:\d\d:\d\d\.\d+", output.stderr), output.stderr
    # Every line, verbatim, on the record.
    log = kernel.value("hx.last_launch().native_log")
    assert len(log) == 12 and all(GSPMD in line for line in log)
    assert all("sharding_propagation.cc" in line for line in log)


@pytest.mark.kernel
def test_tf_cpp_min_log_level_still_decides_what_xla_writes(kernel):
    output = run_ok(kernel, """
        import os
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        try:
            hx.notebook_launcher(shapes_loop, strategy="spmd", progress=False)
        finally:
            del os.environ["TF_CPP_MIN_LOG_LEVEL"]
        """)
    assert "Shardy" not in output.text and "the same XLA" not in output.text
    assert kernel.value("hx.last_launch().native_log") == []


def relay_of(lines: list[bytes], tagged: bool = False) -> NativeRelay:
    """A relay of one process's real stderr pipe after `lines` were written to it."""
    read, write = os.pipe()
    relay = NativeRelay(ranks_of=lambda pid: [0], shown=lambda ranks: True, tagged=tagged)
    relay.add(read, "stderr", pid=123)
    for line in lines:
        os.write(write, line)
    os.close(write)
    relay.close()
    return relay


def test_other_native_lines_pass_and_different_warnings_are_counted_apart(capsys):
    warn = b"2026-12-01 22:15:33.746046: W external/xla/a.cc:7] the same words\n"
    other = b"W1201 22:15:33.746046  4242 b.cc:9] another message\n"
    error = b"2026-12-01 22:15:34.000001: E external/xla/c.cc:3] a real error\n"
    relay = relay_of([warn, b"plain native line\n", warn, other, error, warn, error,
                      b"x" * 150 + b"\n"], tagged=True)
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "[rank 0] plain native line",
        "[rank 0] 2026-12-01 22:15:34.000001: E external/xla/c.cc:3] a real error",  # at once
        "[rank 0] " + "x" * 150,  # not an XLA log line: relayed as it is, unwrapped
        "\x1b[2m[rank 0] XLA warning ×3 (a.cc:7): the same words (hx.last_launch().native_log "
        "has them all)\x1b[0m",
        "\x1b[2m[rank 0] XLA warning ×1 (b.cc:9): another message "
        "(hx.last_launch().native_log has them all)\x1b[0m",
        "[rank 0] (the same XLA error 1 more time; all on hx.last_launch().native_log)",
    ]
    assert relay.kept == [line.decode().strip() for line in (warn, warn, other, error, warn,
                                                              error)]


def test_a_warning_repeated_by_several_processes_is_counted_once_for_all(capsys):
    read_0, write_0 = os.pipe()
    read_1, write_1 = os.pipe()
    relay = NativeRelay(ranks_of=lambda pid: [pid], shown=lambda ranks: True, tagged=True)
    relay.add(read_0, "stderr", pid=0)
    relay.add(read_1, "stderr", pid=1)
    warn = b"2026-12-01 22:15:33.746046: W external/xla/a.cc:7] the same words\n"
    for write in (write_0, write_1, write_1):
        os.write(write, warn)
    os.close(write_0)
    os.close(write_1)
    relay.close()
    assert capsys.readouterr().err.splitlines() == [
        "\x1b[2mXLA warning ×3 (a.cc:7): the same words (hx.last_launch().native_log has them "
        "all)\x1b[0m",
    ]


def final_panel(output) -> str:
    """The text of the last panel the cell drew (its final state)."""
    bundles = [bundle for bundle in output.displays + output.updates
               if "text/plain" in bundle.get("data", {})]
    return bundles[-1]["data"]["text/plain"]


@pytest.mark.kernel
def test_a_loop_counted_from_0_ends_with_the_same_count_everywhere(kernel):
    output = run_ok(kernel, """
        def from_zero(index):
            import torch, torch_xla
            weights = torch.ones(4, device=torch_xla.device())
            for i in range(30):  # counted from 0, as tqdm(range(30)) is
                weights = weights * 0.9
                loss = weights.sum()
                torch_xla.sync()
                hx.report(step=i, total=30, loss=loss)

        hx.notebook_launcher(from_zero, num_processes=1)
        """)
    panel = final_panel(output)
    assert "train ✔ |" in panel and "| 30/30 · " in panel, panel
    assert "XLA in 30 steps: " in panel and "30 executions" in panel, panel
    assert "count from 0" not in panel
    rank = "hx.last_launch().ranks[0]"
    assert kernel.value(f"({rank}.last_step, {rank}.metrics.steps, {rank}.metrics.executions)"
                        ) == (30, 30, 30)


@pytest.mark.kernel
def test_ranks_stopped_because_another_failed_look_stopped(kernel):
    output = kernel.run(textwrap.dedent("""
        import time
        def one_fails(index):
            for step in range(1, 21):
                time.sleep(0.05)
                if index == 1 and step == 3:
                    raise ValueError("rank 1 gives up")
                hx.report(step=step, total=20)

        hx.notebook_launcher(one_fails, num_processes=2, strategy="debug")
        """), timeout=180)
    assert output.error is not None and output.error["ename"] == "LaunchError"
    panel = final_panel(output)
    assert panel.startswith("✖ launch of 2 ranks failed after "), panel
    assert "rank 1 raised ValueError" in panel
    stopped, failed = (line for line in panel.splitlines() if line.startswith("train [rank"))
    assert stopped.startswith("train [rank 0] ■ |") and "· stopped after " in stopped, panel
    assert "elapsed" not in stopped and "✖" not in stopped
    assert failed.startswith("train [rank 1] ✖ |") and "elapsed" in failed, panel
    assert kernel.value("[r.exit_state for r in hx.last_launch().ranks]") == ["stopped", "failed"]


@pytest.mark.kernel
def test_a_launch_that_ran_no_xla_has_no_xla_line(kernel):
    output = run_ok(kernel, """
        def no_xla(index):
            hx.report(step=1, total=2)
            hx.report(step=2, total=2)

        hx.notebook_launcher(no_xla, num_processes=2)
        """)
    panel = final_panel(output)
    assert panel.startswith("✔ launch of 2 ranks finished in "), panel
    # No XLA metrics line ("XLA in 2 steps: ...", "XLA (process of ranks 0-1) ..."); the note
    # that replicated CPU ranks are threads may name XLA.
    assert not re.search(r"^XLA (in |\()", panel, re.M), panel
    assert "nothing compiled" not in panel, panel


@pytest.mark.kernel
def test_compilations_after_the_last_step_are_not_recompiles_of_the_step(kernel):
    output = run_ok(kernel, """
        def then_saves(index):
            import torch, torch_xla
            device = torch_xla.device()
            weights = torch.ones(4, device=device)
            for step in range(1, 13):  # one graph, then cache hits
                weights = weights * 0.9
                hx.report(step=step, total=12, loss=weights.sum())  # then the step's sync
                torch_xla.sync()
            saved = []
            for size in range(1, 21):  # "saving": 20 new graphs after the last step
                saved.append(weights.sum() * torch.arange(size, device=device))
                torch_xla.sync()

        hx.notebook_launcher(then_saves, num_processes=1)
        """)
    panel = final_panel(output)
    assert "XLA in 12 steps: " in panel, panel
    assert "\nafter the last step: 20 of the compiles (" in panel, panel
    assert "saving, evaluation; not rated per step" in panel
    assert "Recompiling" not in panel and "⚠" not in panel, panel
