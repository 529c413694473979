"""`%load_ext hfxla_nb`: the magics in IPython's own shell and in a real kernel (nbclient)."""

from __future__ import annotations

import os
import re

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from hfxla_nb import magics
from hfxla_nb.magics import RUNTIME_STARTED
from tests.helpers import bundles_of, error_of, run_notebook, stderr_of, stdout_of


@pytest.fixture
def shell():
    """IPython's shell with the extension loaded; removed afterwards so no other test sees a
    shell (the launcher and `ui.select_mode` look for one)."""
    saved_env = dict(os.environ)
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "hfxla_nb")
    yield shell
    shell.run_line_magic("unload_ext", "hfxla_nb")
    InteractiveShell.clear_instance()
    os.environ.clear()
    os.environ.update(saved_env)


def test_load_registers_and_unload_removes(shell):
    line = shell.magics_manager.magics["line"]
    cell = shell.magics_manager.magics["cell"]
    assert {"xla_info", "xla_config"} <= set(line) and "xla_metrics" in cell
    magics.unload_ipython_extension(shell)
    assert not {"xla_info", "xla_doctor", "xla_config"} & set(shell.magics_manager.magics["line"])
    assert "xla_metrics" not in shell.magics_manager.magics["cell"]
    magics.load_ipython_extension(shell)


def test_every_magic_is_named_where_the_extension_is_described(shell):
    """`%load_ext hfxla_nb`'s docstrings and docs/panels.md name every magic it registers,
    and say how many there are."""
    from pathlib import Path

    import hfxla_nb

    registered = {("%%" if kind == "cell" else "%") + name
                  for kind, names in magics.XlaMagics.magics.items() for name in names}
    assert registered == {"%xla_info", "%xla_doctor", "%xla_config", "%%xla_metrics"}
    line, cell = shell.magics_manager.magics["line"], shell.magics_manager.magics["cell"]
    assert {name.lstrip("%") for name in registered} <= set(line) | set(cell)
    page = (Path(__file__).resolve().parents[1] / "docs/panels.md").read_text()
    magics_section = page[page.index("## Magics"):]
    assert "registers four magics" in magics_section
    for text in (hfxla_nb.load_ipython_extension.__doc__,
                 magics.load_ipython_extension.__doc__, magics_section):
        for name in registered:  # `%xla_info` by itself, not as part of `%%xla_info`
            assert re.search(rf"(?<!%){name}\b", text), (name, text[:80])


def test_help_comes_from_docstrings(shell, capsys):
    shell.run_cell("%xla_info?")
    assert "Show the hardware, runtime, versions and problems found" in capsys.readouterr().out
    info_doc = shell.find_line_magic("xla_info").__doc__
    assert "hfxla_nb.detect()" in info_doc and "Never starts the XLA runtime" in info_doc
    config_doc = shell.find_line_magic("xla_config").__doc__
    assert "--device {auto,tpu,cpu}" in config_doc and "--cores CORES" in config_doc
    metrics_doc = shell.find_cell_magic("xla_metrics").__doc__
    assert "starts the XLA runtime" in metrics_doc and "--steps STEPS" in metrics_doc


def test_xla_info_shows_detects_problems_with_their_fixes(shell, monkeypatch):
    from hfxla_nb.runtime import detect
    from hfxla_nb.ui.panels import runtime_text

    monkeypatch.setenv("CPU_NUM_DEVICES", "two")  # a problem in this kernel's environment
    with capture_output() as captured:
        shell.run_line_magic("xla_info", "")
    (output,) = captured.outputs
    text = output.data["text/plain"]
    assert "CPU_NUM_DEVICES='two' is not a positive integer" in text  # the problem
    assert "Call hx.configure(device='cpu', cores=N)" in text  # and its fix
    assert text == runtime_text(detect())  # the same panel as hx.detect()
    with pytest.raises(UsageError):
        shell.run_line_magic("xla_info", "--verbose")


def test_xla_config_sets_and_shows(shell, monkeypatch):
    monkeypatch.delenv("CPU_NUM_DEVICES", raising=False)
    with capture_output() as captured:
        shell.run_line_magic("xla_config", "--device cpu --cores 4 --debug")
    assert "PJRT_DEVICE=CPU" in captured.stdout and "CPU_NUM_DEVICES=4" in captured.stdout
    assert os.environ["CPU_NUM_DEVICES"] == "4"


@pytest.mark.parametrize("line", ["--device gpu", "--cores 0", "--cores two", "extra"])
def test_xla_config_bad_arguments_are_usage_errors(shell, line):
    with pytest.raises(UsageError):
        shell.run_line_magic("xla_config", line)


@pytest.mark.parametrize("line", ["--steps 0", "--steps x", "--warmup -1", "--nope"])
def test_xla_metrics_bad_arguments_are_usage_errors(shell, line):
    with pytest.raises(UsageError):
        shell.run_cell_magic("xla_metrics", line, "x = 1")


# -- in a real kernel ----------------------------------------------------------------------------

XLA_CELL = """%%xla_metrics --steps 4
import torch, torch_xla, hfxla_nb as hx
dev = torch_xla.device()
w = torch.ones(3, device=dev)
for step in range(1, 5):
    x = torch.ones(2, step + 1, device=dev)          # a new shape every step
    loss = (x.sum(1) * w[:2]).sum()
    hx.report(step=step, loss=loss, inputs={"x": x}, log_every=100)
    torch_xla.sync()
    value = loss.item()                              # a fetch every step
value
"""


FALLBACK_CELL = """%%xla_metrics
import torch, torch_xla
x = torch.tensor([0.0, 1.0, 2.0], device=torch_xla.device())
print(torch.nonzero(x).flatten().tolist())   # nonzero runs on the CPU
"""


@pytest.mark.kernel
def test_magics_in_a_real_kernel():
    cells = run_notebook([
        "%load_ext hfxla_nb",
        # A problem in the kernel's environment: %xla_info names it with its fix.
        "os = __import__('os'); os.environ['XLA_USE_BF16'] = '1'\n%xla_info\n"
        "del os.environ['XLA_USE_BF16']",
        "%xla_config --device cpu",
        XLA_CELL,
        "%%xla_metrics --steps nope\nprint('ran')",
        "%xla_config --cores -3",
        "%%xla_metrics\nraise KeyError('inside')",
        "import hfxla_nb._xla as x; print(x.runtime_is_initialized())",
        FALLBACK_CELL,
    ], timeout=180)
    assert error_of(cells[0]) is None
    (info,) = bundles_of(cells[1])
    assert "XLA_USE_BF16 is deprecated" in info["text/plain"]  # the problem
    assert "Unset XLA_USE_BF16 and convert the model itself" in info["text/plain"]  # its fix
    assert "XLA_USE_BF16 is deprecated" in info["text/html"]
    assert "PJRT_DEVICE=CPU" in stdout_of(cells[2])

    assert error_of(cells[3]) is None, error_of(cells[3])
    panel, value = bundles_of(cells[3])
    assert value["text/plain"] == "10.0"  # the cell's last expression still shows
    page, plain = panel["text/html"], panel["text/plain"]
    assert plain.startswith("XLA metrics for this cell\nXLA in 4 steps:")
    assert "transfers: device → host 4 transfers, " in plain and ", 4 .item() calls;" in plain
    assert "Device-to-host transfers: 4 in 4 steps, .item() at cell 4, line 10" in plain
    assert "Fix: At cell 4, line 10: fetch values only every N steps" in plain
    # Lines are named as IPython numbers the cell (In [4]), never by the next count.
    assert "cell 5" not in plain and "cell 4, line 9: 4 graphs" in plain  # the recompiling line
    # The first cell to start the runtime says what that means for launches; later ones not.
    assert plain.endswith("\nℹ " + RUNTIME_STARTED) and RUNTIME_STARTED[:40] in page
    assert "input 'x' shapes: (2, 2), (2, 3), (2, 4), (2, 5)" in plain  # from hx.report
    assert "<table" in page and "device memory" in page and "not available" in page

    # IPython shows a UsageError as one line, without a traceback.
    assert stderr_of(cells[4]).startswith("UsageError: argument --steps: invalid int value")
    assert "ran" not in stdout_of(cells[4])
    assert stderr_of(cells[5]).startswith("UsageError: cores must be a positive integer")
    # A failing cell still shows its metrics, then fails like any cell.
    assert error_of(cells[6])["ename"] == "KeyError"
    assert bundles_of(cells[6])[0]["text/plain"].startswith("XLA metrics for this cell")
    assert "runtime" not in bundles_of(cells[6])[0]["text/plain"]
    assert stdout_of(cells[7]).strip() == "True"  # %%xla_metrics ran XLA in the kernel

    # torch.nonzero falls back to the CPU on XLA: the panel names the op and warns.
    assert error_of(cells[8]) is None, error_of(cells[8])
    assert stdout_of(cells[8]).strip() == "[1, 2]"
    (fallback,) = bundles_of(cells[8])
    assert "CPU fallbacks: aten::nonzero x1" in fallback["text/plain"]
    assert "⚠ Operations ran on the CPU: aten::nonzero" in fallback["text/plain"]
    assert "aten::nonzero" in fallback["text/html"]


@pytest.mark.kernel
def test_detect_and_a_result_show_their_panels_without_the_extension():
    # The data classes import nothing from `ui`: IPython's formatters draw them
    # (`hfxla_nb.ui.panels`), registered when a public name is first used.
    cells = run_notebook([
        "import hfxla_nb as hx\nhx.detect()",
        "from hfxla_nb.train.result import FineTuneResult\n"
        "FineTuneResult(None, [(1, 0.7), (2, 0.5)], {'eval_accuracy': 0.9}, 2, 1.0, 10.0, 1.0, 2,"
        " 1, 1.0, 0.1, ['a', 'b'], 'spmd', 4, 'fp32', [16])",
    ])
    (info,) = bundles_of(cells[0])
    assert info["text/plain"].startswith("hfxla_nb runtime:")
    assert "torch_xla" in info["text/html"] and "<" in info["text/html"]
    (result,) = bundles_of(cells[1])
    assert result["text/plain"].startswith("FineTuneResult\n  training")
    assert "eval_accuracy  0.9000" in result["text/plain"]
    assert "<svg" in result["text/html"] and "spmd over 4 devices" in result["text/html"]
