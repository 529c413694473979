"""Binder: the environment binder/ describes, built from nothing, runs a tutorial.

mybinder.org builds with repo2docker: it copies the repository, runs
`pip install -r binder/requirements.txt` from its root (the file has local references, so the
whole repository is there first), then `binder/postBuild`, and starts Jupyter through
`binder/start`. This test takes the same steps in a fresh virtualenv: a copy of the files git
tracks (or would track), `python3 -m venv`, the same pip install, postBuild, then tutorial 3
through binder/start with nbval, using that virtualenv only (no PYTHONPATH, nothing of .venv).
Each phase is timed; the times are printed and written to artifacts/binder/timing.json. The
first run downloads torch and torch_xla from PyPI (a few GB). The virtualenv holds about 8 GB
(PyPI's torch is the CUDA build): the test checks for the room first and removes it afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "binder"
PYTHON = os.environ.get("BINDER_PYTHON") or shutil.which("python3") or sys.executable
TUTORIAL = "notebooks/03_your_own_loop.ipynb"
# What the virtualenv takes (8.0 GB measured: torch's CUDA libraries are 4.3 GB), with a margin.
NEEDED_BYTES = 10 * 2**30


def copy_repository(target: Path) -> None:
    """The files git tracks, and untracked ones it does not ignore (what a push would hold
    once committed)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    """Run `command`; its standard output (the test fails, with both streams, on an error)."""
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)} failed ({result.returncode}):\n" + (
        (result.stdout + result.stderr)[-6000:])
    return result.stdout


@pytest.fixture
def build_dir(tmp_path: Path):
    """A folder with room for the environment, emptied afterwards (pytest keeps tmp_path)."""
    free = shutil.disk_usage(tmp_path).free
    assert free >= NEEDED_BYTES, (
        f"the binder environment needs about {NEEDED_BYTES / 2**30:.0f} GB in {tmp_path}, and "
        f"{free / 2**30:.1f} GB are free: free some space, or point TMPDIR at a larger disk")
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.timeout(3600)
def test_the_binder_environment_runs_tutorial_3(build_dir):
    tmp_path = build_dir
    repo, venv = tmp_path / "repo", tmp_path / "venv"
    copy_repository(repo)
    env = {name: value for name, value in os.environ.items()
           if name not in ("PYTHONPATH", "VIRTUAL_ENV", "PJRT_DEVICE", "CPU_NUM_DEVICES",
                           "TOKENIZERS_PARALLELISM", "PYTHONHOME")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               HFXLA_NB_CACHE=str(tmp_path / "hfxla_nb_cache"))
    times: dict[str, float] = {}

    def phase(name: str, command: list[str], timeout: float) -> str:
        start = time.monotonic()
        output = run(command, repo, env, timeout)
        times[name] = round(time.monotonic() - start, 1)
        return output

    phase("venv", [PYTHON, "-m", "venv", str(venv)], 120)
    phase("pip install -r binder/requirements.txt",
          ["python", "-m", "pip", "install", "--quiet", "--no-cache-dir", "-r",
           "binder/requirements.txt"], 3000)
    built = phase("binder/postBuild", [str(repo / "binder" / "postBuild")], 300)
    assert "demo model:" in built
    where = phase("check", ["python", "-c", "import hfxla_nb, torch, torch_xla, transformers; "
                            "print(hfxla_nb.__file__, torch.__version__, torch_xla.__version__)"],
                  120)
    module, torch_version, xla_version = where.split()[-3:]
    assert module.startswith(str(repo)), where  # this repository's hfxla_nb, installed
    assert torch_version.split("+")[0] == xla_version == "2.9.0", where
    ran = phase(f"binder/start pytest --nbval-lax {TUTORIAL}",
                [str(repo / "binder" / "start"), "python", "-m", "pytest", "-q", "-p",
                 "no:cacheprovider", "--nbval-lax", "--nbval-current-env", TUTORIAL], 900)
    assert " passed" in ran, ran[-3000:]

    times["total"] = round(sum(times.values()), 1)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "timing.json").write_text(json.dumps(times, indent=2))
    print("binder build and run, seconds:", json.dumps(times, indent=2))
