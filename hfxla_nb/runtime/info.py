"""`detect()`: the hardware, environment, versions and problems, without starting the runtime.

A kernel that started the XLA runtime cannot fork workers that use XLA any more (they hang), so
`detect()` must be safe first thing in a notebook: it reads sysfs, `/dev` and package metadata,
and asks `_xla` only about an already imported torch_xla.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import _xla
from .._words import plural
from . import compile_cache, stopped_launches
from .environment import (
    colab_installed,
    detect_environment,
    package_versions,
    redact_environment,
    relevant_environment,
)
from .hardware import Accelerator, detect_accelerator
from .hosts import host_name, launch_plan
from .problems import Problem, find_problems
from .stopped_launches import StoppedLaunch


@dataclass(repr=False)
class RuntimeInfo:
    """Everything `detect()` found. Shows as a panel in a notebook, as text elsewhere.

    Attributes:
        accelerator: the hardware (`Accelerator`).
        environment: where this runs: one of "colab", "kaggle", "tpu-vm", "vscode",
            "jupyter", "terminal".
        versions: python and package versions (None for a package that is not installed).
        runtime_initialized: whether this process already started the XLA runtime.
        env: the environment variables that matter, secrets replaced by "<hidden>".
        problems: what is wrong, each with a fix.
        host: which host this is ("Colab TPU v5e-1", "Kaggle TPU v5e-8", ...).
        launch_plan: what `notebook_launcher` and `fine_tune` will do here.
        compile_cache: where launches keep compiled programs, or why they do not.
        stopped_launches: launches whose kernel died, stopped by their supervisor since the
            last `%xla_info` (each also a warning in `problems`).
    """

    accelerator: Accelerator
    environment: str
    versions: dict[str, str | None]
    runtime_initialized: bool
    env: dict[str, str]
    problems: list[Problem] = field(default_factory=list)
    host: str = ""
    launch_plan: str = ""
    compile_cache: str = ""
    stopped_launches: list[StoppedLaunch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem is an error."""
        return not any(problem.severity == "error" for problem in self.problems)

    @property
    def device_count(self) -> int:
        """XLA devices available to a launch (TPU cores, or CPU virtual devices)."""
        return self.accelerator.devices

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready), with `ok` and `device_count` included."""
        data = asdict(self)
        data["accelerator"]["holders"] = {
            str(pid): name for pid, name in self.accelerator.holders.items()
        }
        data["ok"] = self.ok
        data["device_count"] = self.device_count
        return data

    def summary(self) -> str:
        """One sentence: the accelerator, where it runs and how many problems it has."""
        errors = sum(problem.severity == "error" for problem in self.problems)
        state = "started" if self.runtime_initialized else "not started"
        found = plural(errors, "error") if errors else "no errors"
        return f"{self.accelerator.description}; {self.environment}; runtime {state}; {found}"

    def __repr__(self) -> str:
        return f"<RuntimeInfo: {self.summary()}>"


STOPPED_LAUNCH_FIX = (
    "Nothing of that launch is left running and its results are lost: run its cell again. A "
    "kernel that dies mid-launch is most often out of memory (docs/memory.md).")


def _torch_xla_importable() -> bool:
    try:
        return _xla.is_installed()
    except (ImportError, ValueError):  # an import blocker, or a half-removed package
        return False


def detect(*, sys_root: str = "/", environ: Mapping[str, str] | None = None) -> RuntimeInfo:
    """Find the hardware, environment, versions and problems, without starting the runtime.

    Safe to call first thing in a notebook: nothing here imports torch, torch_xla or
    transformers, or starts the XLA runtime, so the launcher can still fork workers afterwards.

    Args:
        sys_root: root of the file system to read `/sys`, `/dev` and `/proc` from (tests pass a
            fake tree).
        environ: environment variables (default `os.environ`).

    Returns:
        A `RuntimeInfo`; it shows as a panel in a notebook and as text in a terminal.

    Example:
        ```python
        info = hx.detect()
        if not info.ok:
            print(info)
        ```
    """
    environ = os.environ if environ is None else environ
    accelerator = detect_accelerator(sys_root, environ)
    versions = package_versions(environ)
    if not _torch_xla_importable():
        versions["torch_xla"] = None  # metadata may outlive the package; what counts is import
    environment = detect_environment(
        environ,
        modules=sys.modules,
        tpu_present=accelerator.kind == "tpu",
        colab_installed=colab_installed(),
    )
    initialized = _xla.runtime_is_initialized()
    problems = find_problems(
        accelerator=accelerator,
        environment=environment,
        versions=versions,
        runtime_initialized=initialized,
        environ=environ,
    )
    stopped = stopped_launches.read() if sys_root == "/" else []
    problems += [Problem("warning", launch.sentence() + ".", STOPPED_LAUNCH_FIX)
                 for launch in stopped]
    return RuntimeInfo(
        accelerator=accelerator,
        environment=environment,
        versions=versions,
        runtime_initialized=initialized,
        env=redact_environment(relevant_environment(environ)),
        problems=problems,
        host=host_name(accelerator, environment),
        launch_plan=launch_plan(accelerator, environment),
        compile_cache=compile_cache.describe(accelerator=accelerator, environment=environment,
                                             versions=versions, environ=environ),
        stopped_launches=stopped,
    )
