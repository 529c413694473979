"""The installable wheel: `make dist` builds it and the sdist, twine's check passes, the wheel
holds every file of the package and declares the extras the README's install lines name, and,
installed in a fresh venv, it imports and tells what to install where torch_xla is missing and
finds torch_xla where it is there.

The wheel is built once per module, from this checkout, into a temporary folder. The fresh
venvs are made from this interpreter's base Python without pip (this process's pip installs into
them with `pip --python`), and they run with no PYTHONPATH and outside the checkout, so that only
the installed wheel can be imported. pip takes the base dependencies at the versions this test
environment has (a constraints file), which its cache holds: with PyPI out of reach and the
cache empty, the tests that need them are skipped and say so.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import urllib.request
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.launch

PACKAGE = ROOT / "hfxla_nb"
README = ROOT / "README.md"
# The extras a user installs (pyproject.toml); `test` is the project's own.
OWN_EXTRAS = frozenset({"test"})

# What the fresh venv runs: the import, `hx.detect()` and `%xla_info` through IPython's shell,
# printed as one JSON object.
PROBE = textwrap.dedent("""
    import contextlib, importlib.util, io, json, sys

    import hfxla_nb as hx

    info = hx.detect()
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        shell.run_line_magic("load_ext", "hfxla_nb")
        shell.run_line_magic("xla_info", "")
    print(json.dumps({
        "file": hx.__file__, "version": hx.__version__, "ok": info.ok,
        "versions": info.versions,
        "problems": [[p.title, p.fix] for p in info.problems],
        "xla_info": shown.getvalue(),
        "importable": {m: importlib.util.find_spec(m) is not None for m in ("torch", "torch_xla")},
        "imported": sorted(m for m in ("torch", "torch_xla", "transformers") if m in sys.modules),
    }))
    """)


def _index_reachable(timeout: float = 5.0) -> bool:
    url = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/") + "/pip/"
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def pip_env() -> dict[str, str]:
    """The environment of pip and build: where the index is out of reach, pip gives up at once
    (its cache may still hold what it needs)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if not _index_reachable():
        env.update(PIP_RETRIES="0", PIP_TIMEOUT="5", HFXLA_NB_OFFLINE="1")
    return env


def _run_or_skip(command: list[str], env: dict[str, str], what: str, timeout: int = 180,
                 cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run a pip or build command; its failure skips the test where the index is out of reach
    (nothing to install from), and fails it otherwise."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                            cwd=cwd)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip().splitlines()[-1:]
        if env.get("HFXLA_NB_OFFLINE"):
            pytest.skip(f"PyPI is unreachable and pip's cache lacks what {what} needs: {tail}")
        raise AssertionError(f"{what} failed ({result.returncode}):\n"
                             f"{(result.stdout + result.stderr)[-4000:]}")
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory, pip_env) -> dict[str, Path]:
    """`python -m build` on this checkout, as `make dist` runs it: the sdist, then the wheel
    built from that sdist (so the wheel holds only what the sdist carries)."""
    folder = tmp_path_factory.mktemp("dist")
    _run_or_skip([sys.executable, "-m", "build", "--outdir", str(folder), str(ROOT)], pip_env,
                 "building the wheel (setuptools in build's isolated environment)")
    (wheel,) = folder.glob("hfxla_nb-*.whl")
    (sdist,) = folder.glob("hfxla_nb-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(archive.read(name).decode())


def _install_lines() -> str:
    """The README's Install section."""
    return README.read_text().split("## Install", 1)[1].split("\n## ", 1)[0]


def test_the_wheel_and_sdist_pass_twine_and_hold_the_package(dist):
    """twine's strict check (the README renders as the PyPI page); every file of hfxla_nb/ is
    in the wheel (a .js or .json the package reads at run time, too), the license with it, and
    the metadata says Apache-2.0 and the Pythons it runs on."""
    pytest.importorskip("twine")
    result = subprocess.run([sys.executable, "-m", "twine", "check", "--strict",
                             str(dist["wheel"]), str(dist["sdist"])],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout

    with zipfile.ZipFile(dist["wheel"]) as archive:
        inside = set(archive.namelist())
    files = {path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*")
             if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}
    assert files - inside == set(), "files of hfxla_nb/ missing from the wheel"
    assert "hfxla_nb/py.typed" in inside
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in inside), sorted(inside)[-8:]
    assert not any(n.startswith("tests/") for n in inside)
    with tarfile.open(dist["sdist"]) as archive:
        carried = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"LICENSE", "README.md", "pyproject.toml", "hfxla_nb/py.typed"} <= carried
    assert not [name for name in carried if name.startswith("tests")]  # not half of them

    metadata = _metadata(dist["wheel"])
    assert metadata["Name"] == "hfxla_nb" and metadata["License-Expression"] == "Apache-2.0"
    assert set(metadata["Requires-Python"].split(",")) == {">=3.10", "<3.14"}
    assert metadata["Description-Content-Type"] == "text/markdown"


def test_every_extra_has_its_install_line_in_the_readme(dist):
    """Each extra the wheel declares (pyproject.toml, the one place they are written) is named
    by a `pip install "hfxla_nb[...]"` line of the README's Install section, and every extra
    those lines name exists."""
    declared = set(_metadata(dist["wheel"]).get_all("Provides-Extra")) - OWN_EXTRAS
    lines = re.findall(r'pip install [^\n`]*?"hfxla_nb\[([\w,]+)\]', _install_lines())
    named = {extra for line in lines for extra in line.split(",")}
    assert declared - named == set(), "extras without an install line in the README"
    assert named - declared == set(), "the README installs extras the package does not declare"
    assert {"xla", "train", "lora", "tasks", "ray", "vision", "audio", "tpu"} <= declared


def _fresh_venv(path: Path) -> Path:
    """A venv of this interpreter's base Python, without pip (this process's pip fills it)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(path)], check=True, timeout=60)
    return path / "bin" / "python"


def _probe(python: Path, cwd: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PJRT_DEVICE"] = "CPU"
    result = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True,
                            timeout=120, env=env, cwd=cwd)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_wheel_alone_imports_and_says_what_to_install(dist, pip_env, tmp_path):
    """`pip install hfxla_nb-*.whl` in a fresh venv (the base dependencies only: no torch):
    `import hfxla_nb`, `hx.detect()` and `%xla_info` work, import nothing heavy, and name the
    pip install line of torch and torch_xla."""
    python = _fresh_venv(tmp_path / "venv")
    # The versions this environment has, which pip's cache holds: no download where it does.
    versions: dict[str, set[str]] = {}
    for found in importlib.metadata.distributions():
        name = (found.metadata["Name"] or "").lower().replace("_", "-")
        versions.setdefault(name, set()).add(found.version)
    pins = [f"{name}=={version}" for name, (version, *more) in sorted(versions.items())
            if name and name != "hfxla-nb" and not more]  # a stale second copy: no pin
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    _run_or_skip([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                  "-c", str(constraints), str(dist["wheel"])], pip_env,
                 "installing the wheel's base dependencies (numpy, IPython, ipywidgets)")

    found = _probe(python, tmp_path)
    assert found["file"].startswith(str(tmp_path / "venv")), found["file"]
    assert found["version"] == _metadata(dist["wheel"])["Version"]
    assert found["importable"] == {"torch": False, "torch_xla": False}
    assert found["imported"] == []
    assert found["ok"] is False
    assert found["versions"]["torch_xla"] is None and found["versions"]["torch"] is None
    fixes = dict(found["problems"])
    assert "pip install 'torch==2.9.*' 'torch_xla==2.9.*'" in fixes["torch is not installed."]
    assert "'torch_xla==2.9.*'" in fixes["torch_xla is not installed."]
    shown = found["xla_info"]
    assert shown.startswith("hfxla_nb runtime: 2 errors"), shown
    assert "torch_xla not installed" in shown
    assert "fix: pip install 'torch==2.9.*' 'torch_xla==2.9.*'" in shown, shown


def test_the_wheel_beside_the_test_stack_finds_torch_xla(dist, pip_env, tmp_path):
    """The wheel alone (`--no-deps`) in a fresh venv that sees this environment's
    site-packages through a .pth file (torch, torch_xla): the wheel's hfxla_nb is the one
    imported, and `hx.detect()` and `%xla_info` find torch_xla, without importing it."""
    site_packages = Path(sysconfig.get_paths()["purelib"])
    if not (site_packages / "torch_xla").is_dir():
        pytest.skip(f"torch_xla is not in {site_packages}")
    python = _fresh_venv(tmp_path / "venv")
    _run_or_skip([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                  "--no-deps", str(dist["wheel"])], pip_env, "installing the wheel")
    # After the install: pip must not see (or touch) this environment's editable hfxla_nb.
    venv_site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    (venv_site / "test_stack.pth").write_text(f"{site_packages}\n")

    found = _probe(python, tmp_path)
    assert found["file"].startswith(str(venv_site)), found["file"]
    assert found["importable"] == {"torch": True, "torch_xla": True}
    assert found["imported"] == []
    xla_version = importlib.metadata.version("torch_xla")
    assert found["versions"]["torch_xla"] == xla_version
    assert not [m for m, _ in found["problems"] if "torch_xla" in m and "not installed" in m]
    assert f"torch_xla {xla_version}" in found["xla_info"], found["xla_info"]
    assert "torch_xla not installed" not in found["xla_info"]
