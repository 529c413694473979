"""The tutorials in notebooks/: stored clean, set up as the tutorials promise, and once executed,
readable without a kernel (nbconvert HTML) and reproducible (nbval, with the sanitize file).

`make test-notebooks` (part of `make test`) runs every tutorial top to bottom with nbval, whose
assert cells check what each one teaches; this module checks what that run cannot see. The
executed copies live in a temporary folder: outputs are never stored in the repository.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.helpers import ROOT, error_of, run_notebook, stdout_of, subprocess_env

NOTEBOOKS = ROOT / "notebooks"
TUTORIALS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
EXPECTED = ["01_runtime", "02_fine_tune", "03_your_own_loop", "04_why_is_it_slow", "05_trainer",
            "06_causal_lm", "07_lora", "08_beyond_classification", "09_images_and_speech"]
SANITIZE = NOTEBOOKS / "nbval_sanitize.cfg"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def code_cells(notebook: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def stored_problems(notebook: nbformat.NotebookNode) -> list[str]:
    """Why a notebook is not stored clean (empty when it is): outputs, execution counts or
    widget state, which belong to a run, not to the repository."""
    problems = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        if cell.get("outputs"):
            problems.append(f"cell {index} has {len(cell.outputs)} output(s)")
        if cell.get("execution_count") is not None:
            problems.append(f"cell {index} has execution count {cell.execution_count}")
    if "widgets" in notebook.metadata:
        problems.append("the metadata holds widget state")
    return problems


def nbstripout_verify(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nbstripout", "--verify", *map(str, paths)],
                          capture_output=True, text=True, timeout=60)


# -- stored form -------------------------------------------------------------------------------


def test_the_tutorials_are_there():
    assert [path.stem for path in TUTORIALS] == EXPECTED


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda path: path.stem)
def test_stored_clean(path):
    notebook = read(path)
    nbformat.validate(notebook)
    assert stored_problems(notebook) == []
    assert notebook.metadata.kernelspec.name == "python3"


@pytest.mark.launch
def test_nbstripout_would_change_nothing():
    """`make strip-notebooks` (nbstripout) is what stores them; it finds nothing to strip."""
    result = nbstripout_verify(*TUTORIALS)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.launch
def test_a_notebook_stored_with_outputs_is_caught(tmp_path):
    notebook = read(NOTEBOOKS / "01_runtime.ipynb")
    cell = code_cells(notebook)[0]
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hfxla_nb 0.1.0\n")]
    cell.execution_count = 1
    path = tmp_path / "with_outputs.ipynb"
    nbformat.write(notebook, path)
    assert stored_problems(read(path)) == ["cell 1 has 1 output(s)", "cell 1 has execution count 1"]
    assert nbstripout_verify(path).returncode == 1


# -- what every tutorial starts with -------------------------------------------------------------


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda path: path.stem)
def test_the_first_cell_installs_only_what_is_missing(path):
    cells = code_cells(read(path))
    first = cells[0].source
    assert 'if importlib.util.find_spec("hfxla_nb") is None:' in first
    # Every install is guarded by a check for the missing package, and only the first cell
    # installs anything.
    for line in first.splitlines():
        if "%pip" in line:
            assert line.startswith("    %pip install --quiet "), line
    assert not any(re.search(r"^\s*[%!]\s*pip\b", cell.source, re.M) for cell in cells[1:])
    # torch, torch_xla and transformers come with hfxla_nb's extras only where torch_xla is
    # missing: a TPU runtime (Colab, Kaggle) keeps its own. A tutorial may add an extra of its
    # own on both (tutorial 9: vision and audio, Pillow and jiwer).
    extras = re.search(r'extras = "(\[([\w,]+)\])?" if importlib.util.find_spec\("torch_xla"\) '
                       r'else "\[train,xla(,([\w,]+))?\]"', first)
    assert extras is not None, first
    assert extras.group(2) == extras.group(4)


FAKE_PIP = """
from IPython.core.magic import register_line_magic

pip_calls = []

@register_line_magic
def pip(line):
    pip_calls.append(line)
"""


@pytest.mark.kernel
def test_the_setup_cells_install_nothing_here_and_only_hfxla_nb_where_it_is_missing(tmp_path):
    """Run each tutorial's first cell in a real kernel with `%pip` recorded instead of run:
    here nothing is installed; where hfxla_nb and accelerate are missing but torch_xla is there
    (a TPU runtime), only those two are: from the source the user set, else from the package
    index where it has hfxla_nb, and the cell says which; with neither, it says to set
    HFXLA_NB_SOURCE. The package index is a local folder (`pip index` reads it, no network):
    empty, then holding a hfxla_nb wheel's name."""
    setups = {path.stem: code_cells(read(path))[0].source for path in TUTORIALS}
    outputs = run_notebook([FAKE_PIP, *setups.values(), "print(pip_calls)"], timeout=180)
    for name, cell_outputs in zip(setups, outputs[1:-1], strict=True):
        assert error_of(cell_outputs) is None, (name, error_of(cell_outputs))
        assert stdout_of(cell_outputs).startswith(f"hfxla_nb 0.1.0 from {ROOT / 'hfxla_nb'}")
    assert stdout_of(outputs[-1]).strip() == "[]"

    empty, published = tmp_path / "empty", tmp_path / "published"
    empty.mkdir()
    published.mkdir()
    (published / "hfxla_nb-0.1.0-py3-none-any.whl").write_bytes(b"")  # pip reads only the name
    missing = textwrap.dedent(f"""
        import importlib.util, os
        real_find_spec = importlib.util.find_spec
        missing = ("hfxla_nb", "accelerate")
        importlib.util.find_spec = (
            lambda name, *a: None if name in missing else real_find_spec(name, *a))
        os.environ.update(PIP_NO_INDEX="1", PIP_FIND_LINKS={str(empty)!r},
                          HFXLA_NB_SOURCE="/content/hfxla_nb")
        """)
    unset = 'os.environ.pop("HFXLA_NB_SOURCE")'
    publish = f'os.environ["PIP_FIND_LINKS"] = {str(published)!r}; pip_calls.clear()'
    setup = setups["03_your_own_loop"]
    outputs = run_notebook([FAKE_PIP, missing, setup, "print(pip_calls)", unset, setup,
                            publish, setup, "print(pip_calls)"], timeout=180)
    assert stdout_of(outputs[2]).startswith(
        "hfxla_nb is not installed: installing hfxla_nb @ file:///content/hfxla_nb from "
        "HFXLA_NB_SOURCE\n"), stdout_of(outputs[2])
    assert eval(stdout_of(outputs[3])) == [  # noqa: S307 - a list of str printed by the kernel
        'install --quiet "hfxla_nb @ file:///content/hfxla_nb"', "install --quiet accelerate"]
    refused = error_of(outputs[5])
    assert refused is not None and "set HFXLA_NB_SOURCE" in refused["evalue"], refused
    assert "the package index does not have it" in refused["evalue"], refused
    assert error_of(outputs[7]) is None, error_of(outputs[7])
    assert stdout_of(outputs[7]).startswith(
        "hfxla_nb is not installed: installing hfxla_nb from the package index (PyPI)\n")
    assert eval(stdout_of(outputs[8])) == [  # noqa: S307
        'install --quiet "hfxla_nb"', "install --quiet accelerate"]


@pytest.mark.launch
def test_tutorial_3_imports_tqdm_at_the_top_and_uses_it_in_the_launched_function():
    cells = code_cells(read(NOTEBOOKS / "03_your_own_loop.ipynb"))
    assert "from tqdm.auto import tqdm" in cells[0].source
    launched = next(cell.source for cell in cells if "hx.notebook_launcher(train)" in cell.source)
    assert 'for epoch in tqdm(range(epochs), desc="epochs"):' in launched


def test_the_readme_table_links_every_tutorial():
    readme = (NOTEBOOKS / "README.md").read_text()
    for path in TUTORIALS:
        row = next((line for line in readme.splitlines() if f"]({path.name})" in line), None)
        assert row is not None, f"{path.name} is not linked from notebooks/README.md"
        assert re.search(r"\| about \d+ (s|min)", row), row  # its run time here


# -- the sanitize file ---------------------------------------------------------------------------


def test_the_sanitize_file_hides_times_and_rates_but_not_counts():
    from nbval.plugin import get_sanitize_patterns

    patterns = get_sanitize_patterns(SANITIZE.read_text())

    def sanitize(text: str) -> str:
        for regex, replace in patterns:
            text = re.sub(regex, replace, text)
        return text

    line = ("train ✔ |████| 60/60 · 42.4 s elapsed · overall 3.46 it/s · 111 samples/s · "
            "loss=0.3637")
    assert sanitize(line) == ("train ✔ |████| 60/60 · <TIME> elapsed · overall <RATE> · <RATE> "
                              "· loss=0.3637")
    assert sanitize("✔ launch of 4 ranks finished in 1 min 04 s") == (
        "✔ launch of 4 ranks finished in <TIME>")
    metrics = "XLA in 60 steps: 3 compiles (25.0 s), 64 executions (172 µs), compile 59%"
    assert sanitize(metrics) == (
        "XLA in 60 steps: 3 compiles (<TIME>), 64 executions (<TIME>), compile <PERCENT>")
    assert sanitize("  rank 0: finished, 0.1s") == "  rank 0: finished, <TIME>"
    assert sanitize("/tmp/ipykernel_30239/3939921337.py:10: UserWarning") == (
        "<CELL-FILE>:10: UserWarning")
    assert sanitize("4 XLA devices; accuracy 1.000 after 60 steps") == (
        "4 XLA devices; accuracy 1.000 after 60 steps")


# -- executed copies -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> dict[str, Path]:
    """Tutorials 1 and 3 run top to bottom in a temporary folder, as Run All and Save would
    leave them (display updates applied)."""
    folder = tmp_path_factory.mktemp("executed")
    paths = {}
    for name in ("01_runtime", "03_your_own_loop"):
        path = folder / f"{name}.ipynb"
        shutil.copy(NOTEBOOKS / path.name, path)
        notebook = read(path)
        NotebookClient(notebook, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(folder)}}).execute(env=subprocess_env())
        nbformat.write(notebook, path)
        paths[name] = path
    return paths


def _outputs_of(notebook, marker: str) -> list[dict]:
    return next(cell.outputs for cell in code_cells(notebook) if marker in cell.source)


@pytest.mark.kernel
def test_executed_notebooks_show_the_final_panels_without_a_kernel(executed):
    """No widget view is left in the outputs (it would need the kernel's widget models): each
    launch panel is static HTML with a text form, and nbconvert's HTML shows it."""
    from nbconvert import HTMLExporter

    notebook = read(executed["03_your_own_loop"])
    for cell in code_cells(notebook):
        for output in cell.outputs:
            assert WIDGET_VIEW not in output.get("data", {}), cell.source[:80]
    html, _ = HTMLExporter().from_notebook_node(notebook)
    assert html.count('class="hfxla-launch"') >= 3, "three launch panels as HTML"

    (panel,) = [o for o in _outputs_of(notebook, "result = hx.notebook_launcher(train)")
                if "text/html" in o.get("data", {})]
    text = panel["data"]["text/plain"]
    assert text.startswith("✔ launch finished in "), text  # one rank: no rank count, no tags
    assert "[rank" not in text, text
    assert re.search(r"^train +✔ \|█{20}\| 80/80 · ", text, re.M), text
    assert re.search(r"^epochs +✔ \|█{20}\| 2/2 · ", text, re.M), text  # the tqdm bar
    assert re.search(r"XLA in 80 steps: \d+ compiles", text), text
    assert 'aria-valuenow="80" aria-valuemin="0" aria-valuemax="80"' in panel["data"]["text/html"]

    failure = _outputs_of(notebook, "hx.notebook_launcher(train_with_a_bug)")
    (panel,) = [o for o in failure if "text/html" in o.get("data", {})]
    assert panel["data"]["text/plain"].startswith("✖ launch failed after ")
    assert error_of(failure) is None  # the lesson cell catches the LaunchError and prints it
    printed = stdout_of(failure)
    assert printed.startswith("LaunchError: ") and "rank 0 failed: ValueError" in printed
    assert "Remote traceback (rank 0)" in printed
    assert "rank 0 failed: ValueError" in html and "Remote traceback (rank 0)" in html

    runtime = read(executed["01_runtime"])
    (panel,) = _outputs_of(runtime, "%xla_info")
    assert panel["data"]["text/plain"].startswith("hfxla_nb runtime: OK")
    html, _ = HTMLExporter().from_notebook_node(runtime)
    assert "XLA runtime" in html and "not started in this process" in html


@pytest.mark.kernel
@pytest.mark.launch
def test_an_executed_tutorial_reruns_to_the_same_outputs(executed):
    """nbval in strict mode on the executed copy of tutorial 1: every output outside the live
    cells (tagged nbval-ignore-output) comes out the same again, once times are sanitized."""
    path = executed["01_runtime"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval",
         "--nbval-current-env", f"--nbval-sanitize-with={SANITIZE}", str(path)],
        capture_output=True, text=True, timeout=600, cwd=path.parent, env=subprocess_env())
    assert result.returncode == 0, result.stdout[-6000:]
    assert re.search(r"\b\d+ passed", result.stdout), result.stdout
