"""`detect()`: the hardware, environment, versions and problems, without starting the runtime.

A kernel that started the XLA runtime cannot fork workers that use XLA any more (they hang), so
`detect()` must be safe first thing in a notebook: it reads sysfs, `/dev` and package metadata,
and asks `_xla` only about an already imported torch_xla.

Problems are found by small checks, one per kind of problem, each with a concrete fix. A check
takes the gathered `Facts` and returns the problems it finds (usually none or one). Only
variable names and non-secret values (PJRT_DEVICE, CPU_NUM_DEVICES) go into the messages, so
the result is safe to show.

`detect()` also says which launches were stopped because their kernel died. A kernel killed
mid-launch (a crash, the out-of-memory killer, a forced restart) cannot stop its launch or say
so. The launch's supervisor notices that its parent is gone, stops every process of the launch
and writes down what it stopped: one small JSON file in the system's temporary folder. The
next `detect()` (`%xla_info`) reads these notes and shows them once; `forget` removes them.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from .. import _xla
from .._words import plural
from . import compile_cache
from .environment import (
    Accelerator,
    colab_installed,
    cpu_device_count,
    detect_accelerator,
    detect_environment,
    host_name,
    launch_plan,
    package_versions,
    redact_environment,
    relevant_environment,
)

# -- problems: one small check per kind, each with its fix --

RESTART_ADVICE = (
    "Restart the kernel and move device code (torch_xla.device(), "
    "transformers.TrainingArguments(...), met.metrics_report()) into the launched function"
)


@dataclass(frozen=True)
class Problem:
    """Something wrong (or worth knowing) about this runtime, with a concrete fix.

    Attributes:
        severity: "error" (a launch will fail or misbehave), "warning" (works, but not as
            intended) or "info".
        title: what is wrong, in one sentence.
        fix: what to do about it.
    """

    severity: Literal["error", "warning", "info"]
    title: str
    fix: str


@dataclass(frozen=True)
class Facts:
    """What the checks look at: the scans' results, versions and environment variables."""

    accelerator: Accelerator
    environment: str
    versions: Mapping[str, str | None]
    runtime_initialized: bool
    environ: Mapping[str, str]

    @property
    def on_tpu(self) -> bool:
        return self.accelerator.kind == "tpu"

    @property
    def pjrt(self) -> str:
        return self.environ.get("PJRT_DEVICE", "").strip()

    @property
    def torch_minor(self) -> tuple[int, int] | None:
        return major_minor(self.versions.get("torch"))

    @property
    def matching_xla(self) -> str:
        """The pip requirements that give this host a torch and torch_xla of one minor version."""
        return matching_pair(self.torch_minor, None, tpu=self.on_tpu)


Check = Callable[[Facts], Iterator[Problem]]


def major_minor(version: str | None) -> tuple[int, int] | None:
    """(2, 9) for "2.9.0+cpu"; None for a missing or odd version."""
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


#: The newest torch_xla release (2.9, built for torch 2.9): there is no torch_xla for a newer
#: torch, so pyproject.toml's [xla] and [tpu] extras cap torch below 2.10.
NEWEST_TORCH_XLA = (2, 9)


def matching_pair(torch_minor: tuple[int, int] | None, xla_minor: tuple[int, int] | None,
                  tpu: bool = False) -> str:
    """The pip line that makes torch and torch_xla match, changing as little as it can.

    torch_xla X.Y is built for torch X.Y only. When a torch_xla exists for the installed
    torch, that torch_xla is installed (torch stays: Colab and Kaggle ship it); when torch is
    newer than every torch_xla (pip's newest torch, say), torch goes back to the release
    torch_xla was built for.

    Args:
        torch_minor: the installed torch's (major, minor), or None.
        xla_minor: the installed torch_xla's (major, minor), or None.
        tpu: whether to name torch_xla's `[tpu]` extra (libtpu).

    Returns:
        A command such as `pip install 'torch_xla==2.9.*'`.
    """
    extra = "[tpu]" if tpu else ""
    if torch_minor and torch_minor <= NEWEST_TORCH_XLA:
        return f"pip install 'torch_xla{extra}=={torch_minor[0]}.{torch_minor[1]}.*'"
    minor = xla_minor if xla_minor and xla_minor <= NEWEST_TORCH_XLA else NEWEST_TORCH_XLA
    pair = f"{minor[0]}.{minor[1]}"
    torch_only = xla_minor == minor
    line = f"pip install 'torch=={pair}.*'"
    if not torch_only:
        line += f" 'torch_xla{extra}=={pair}.*'"
    if torch_minor:
        line += (f" (torch_xla {pair} is built for torch {pair}; no torch_xla exists for torch "
                 f"{torch_minor[0]}.{torch_minor[1]})")
    return line


def torch_missing(facts: Facts) -> Iterator[Problem]:
    if facts.versions.get("torch") is None:
        yield Problem("error", "torch is not installed.",
                      f"{matching_pair(None, None, tpu=facts.on_tpu)} (the same minor version "
                      "for both).")


def torch_xla_missing(facts: Facts) -> Iterator[Problem]:
    if facts.versions.get("torch_xla") is not None:
        return
    if facts.versions.get("torch_tpu") is not None:
        yield Problem("error", TORCH_TPU_ONLY.format(version=facts.versions["torch_tpu"]),
                      TORCH_TPU_FIX)
        return
    fix = facts.matching_xla
    if facts.torch_minor and facts.torch_minor <= NEWEST_TORCH_XLA:
        fix += f" to match torch {'.'.join(map(str, facts.torch_minor))}"
    if facts.environment == "colab":
        fix += (". On Colab choose Runtime > Change runtime type > TPU: its image ships "
                "matching torch and torch_xla; do not reinstall torch there")
    yield Problem("error", "torch_xla is not installed.", fix + ".")


#: What `%xla_info`, the doctor and every entry point that needs torch_xla say on a host that
#: has TorchTPU (`torch-tpu`) and no torch_xla.
TORCH_TPU_ONLY = (
    "TorchTPU (torch-tpu {version}) is installed, and torch_xla is not: hfxla_nb launches, "
    "trains and predicts with torch_xla only so far (docs/torchtpu.md: the design of a "
    "TorchTPU backend). TorchTPU's own distributed code cannot run inside a notebook kernel.")
TORCH_TPU_FIX = (
    "To launch from this notebook, use an environment with torch and torch_xla of the same "
    "minor version (a new venv: TorchTPU needs torch 2.11 to 2.13, torch_xla 2.9 needs torch "
    "2.9): pip install 'torch==2.9.*' 'torch_xla[tpu]==2.9.*'. hx.detect(), %xla_info, "
    "hx.doctor() and hx.plan_memory() work here as they are.")


def torch_tpu_too(facts: Facts) -> Iterator[Problem]:
    """TorchTPU beside torch_xla: said, since launches use torch_xla and not TorchTPU."""
    if facts.versions.get("torch_tpu") is not None and facts.versions.get("torch_xla"):
        yield Problem("info", f"TorchTPU (torch-tpu {facts.versions['torch_tpu']}) is installed "
                      "too: hfxla_nb's launches use torch_xla, and nothing of TorchTPU.",
                      "Nothing to do; do not mix the two in one launched function.")


def versions_mismatch(facts: Facts) -> Iterator[Problem]:
    problem = mismatch_problem(facts.versions, tpu=facts.on_tpu, environment=facts.environment)
    if problem is not None:
        yield problem


def mismatch_problem(versions: Mapping[str, str | None], tpu: bool = False,
                     environment: str = "") -> Problem | None:
    """The problem of a torch and a torch_xla of different minor versions, or None.

    Args:
        versions: package versions (`runtime.environment.package_versions()`).
        tpu: whether the host has a TPU (the fix then names torch_xla's `[tpu]` extra).
        environment: "colab", "kaggle", ... (Colab's image must not have torch reinstalled).
    """
    torch_version, xla_version = versions.get("torch"), versions.get("torch_xla")
    torch_minor, xla_minor = major_minor(torch_version), major_minor(xla_version)
    if not (torch_minor and xla_minor) or xla_minor == torch_minor:
        return None
    fix = matching_pair(torch_minor, xla_minor, tpu=tpu)
    if torch_minor <= NEWEST_TORCH_XLA:
        fix += f" to match torch {torch_minor[0]}.{torch_minor[1]}"
    fix += ", then restart the kernel."
    if environment == "colab":
        fix = ("Do not reinstall torch on Colab: the TPU runtime ships matching versions. " + fix
               + " If torch itself was upgraded, use Runtime > Disconnect and delete runtime.")
    return Problem("error", f"torch {torch_version} and torch_xla {xla_version} do not match: "
                   "torch_xla only works with the torch release of the same minor version.", fix)


def runtime_started(facts: Facts) -> Iterator[Problem]:
    if facts.runtime_initialized:
        yield Problem("error", "The XLA runtime has already started in this process: the "
                      "launcher will refuse to fork, since forked workers that use XLA hang "
                      "forever.",
                      RESTART_ADVICE + "; call hx.configure() and hx.detect() before anything "
                      "else.")


def libtpu_missing(facts: Facts) -> Iterator[Problem]:
    xla_version = facts.versions.get("torch_xla")
    if facts.on_tpu and xla_version is not None and facts.versions.get("libtpu") is None:
        yield Problem("error", "A TPU is attached but libtpu (the TPU runtime library) is not "
                      "installed.",
                      f"pip install 'torch_xla[tpu]=={xla_version}', then restart the kernel.")


def tpu_left_idle(facts: Facts) -> Iterator[Problem]:
    if facts.on_tpu and facts.pjrt.upper() == "CPU":
        chip = facts.accelerator.description.split(":")[0]
        yield Problem("warning", f"This machine has a {chip}, but PJRT_DEVICE=CPU: torch_xla "
                      "will run on the CPU and leave the TPU idle.",
                      "Call hx.configure(device='tpu') (or unset PJRT_DEVICE) before the runtime "
                      "starts; if it already started, restart the kernel first.")


def tpu_asked_but_missing(facts: Facts) -> Iterator[Problem]:
    if facts.on_tpu:
        return
    if facts.pjrt.upper() == "TPU":
        yield Problem("error", "PJRT_DEVICE=TPU, but no TPU was found (no Google device on the "
                      "PCI bus, no /dev/accel* or /dev/vfio/*).",
                      "On Colab or Kaggle pick a TPU runtime/accelerator. To rehearse on the CPU, "
                      "call hx.configure(device='cpu', cores=8), which sets PJRT_DEVICE=CPU.")
    elif facts.environ.get("TPU_ACCELERATOR_TYPE"):
        yield Problem("warning", "TPU_ACCELERATOR_TYPE is set, but no TPU is visible on the PCI "
                      "bus or in /dev.",
                      "Inside a container, start it with --privileged (or pass the /dev/accel* or "
                      "/dev/vfio devices and mount /sys); otherwise this is not a TPU host.")


def pjrt_device_unknown(facts: Facts) -> Iterator[Problem]:
    if facts.pjrt and facts.pjrt.upper() not in ("TPU", "CPU", "CUDA", "GPU"):
        yield Problem("error", f"PJRT_DEVICE={facts.pjrt} is not a device torch_xla knows.",
                      "Call hx.configure(device='auto') or set PJRT_DEVICE to TPU or CPU.")
    elif not facts.pjrt and not facts.on_tpu and facts.versions.get("torch_xla") is not None:
        yield Problem("info", "PJRT_DEVICE is not set: torch_xla will fall back to the CPU with "
                      "a warning.",
                      "Call hx.configure() (or hx.configure(device='cpu', cores=8)) before the "
                      "runtime starts.")


def device_files_hidden(facts: Facts) -> Iterator[Problem]:
    found_by = facts.accelerator.found_by
    if facts.on_tpu and found_by and not any(item.startswith("/dev/") for item in found_by):
        yield Problem("error", "TPU chips are on the PCI bus, but no /dev/accel* or /dev/vfio/* "
                      "device files are visible, so the runtime cannot open them.",
                      "Inside a container, run it with --privileged or pass the TPU device files "
                      "(--device /dev/vfio/0 ... or /dev/accel0 ...).")


def tpu_held_elsewhere(facts: Facts) -> Iterator[Problem]:
    holders = facts.accelerator.holders
    if holders:
        listing = ", ".join(f"{pid} ({name})" for pid, name in sorted(holders.items()))
        pids = " ".join(str(pid) for pid in sorted(holders))
        yield Problem("error", f"The TPU is held by another process: {listing}. Only one "
                      "process can open the TPU at a time.",
                      "Shut down the other notebook's kernel or the stale worker (Kernel > Shut "
                      f"Down, or `kill {pids}`), then run your cell again.")


def retired_tpu_node_variables(facts: Facts) -> Iterator[Problem]:
    stale = [name for name in ("COLAB_TPU_ADDR", "XRT_TPU_CONFIG") if name in facts.environ]
    if stale:
        one = len(stale) == 1
        unset = "; ".join(f"os.environ.pop({name!r}, None)" for name in stale)
        yield Problem("warning", f"{' and '.join(stale)} {'is' if one else 'are'} set: leftovers "
                      "of the retired TPU Node (XRT) setup, which torch_xla 2.x ignores.",
                      f"Unset {'it' if one else 'them'} ({unset}) and drop old notebook code "
                      "that reads them; PJRT_DEVICE=TPU (hx.configure()) replaces them.")


def kaggle_process_addresses(facts: Facts) -> Iterator[Problem]:
    names = ("TPU_PROCESS_ADDRESSES", "CLOUD_TPU_TASK_ID")
    if facts.environment == "kaggle" and any(name in facts.environ for name in names):
        yield Problem("warning", "TPU_PROCESS_ADDRESSES / CLOUD_TPU_TASK_ID are set by Kaggle's "
                      "TPU image; xmp.spawn on Kaggle misbehaves with them.",
                      "hx.notebook_launcher removes them in its workers. With xmp.spawn directly, "
                      "do as pytorch/xla's Kaggle notebook: os.environ.pop("
                      "'TPU_PROCESS_ADDRESSES', None); os.environ.pop('CLOUD_TPU_TASK_ID', None).")


def deprecated_bf16_variables(facts: Facts) -> Iterator[Problem]:
    for name in ("XLA_USE_BF16", "XLA_DOWNCAST_BF16"):
        if facts.environ.get(name, "0") not in ("", "0"):
            yield Problem("warning", f"{name} is deprecated since torch_xla 2.6 and changes "
                          "every float tensor.",
                          f"Unset {name} and convert the model itself (model.to(torch.bfloat16)),"
                          " or use torch.autocast('xla', dtype=torch.bfloat16).")


def cpu_device_count_odd(facts: Facts) -> Iterator[Problem]:
    if "CPU_NUM_DEVICES" not in facts.environ:
        return
    count = cpu_device_count(facts.environ)
    host_cores = facts.accelerator.host_cores
    if count is None:
        yield Problem("error", f"CPU_NUM_DEVICES={facts.environ['CPU_NUM_DEVICES']!r} is not a "
                      "positive integer.",
                      "Call hx.configure(device='cpu', cores=N) or set CPU_NUM_DEVICES to a "
                      "number such as 8.")
    elif not facts.on_tpu and host_cores and count > host_cores:
        yield Problem("info", f"CPU_NUM_DEVICES={count} is more than the "
                      f"{plural(host_cores, 'host core')}.",
                      "That is fine for rehearsing sharding over a TPU-sized mesh; steps just run "
                      "slower than on fewer devices.")


def gpu_unused(facts: Facts) -> Iterator[Problem]:
    gpus = facts.accelerator.gpus
    if facts.accelerator.kind == "cpu" and gpus:
        yield Problem("info", f"{plural(gpus, 'NVIDIA GPU')} found: hfxla_nb runs XLA on the CPU "
                      "here, to rehearse TPU code.",
                      "For GPU training use plain PyTorch; for TPUs pick a TPU runtime.")


CHECKS: tuple[Check, ...] = (
    torch_missing,
    torch_xla_missing,
    torch_tpu_too,
    versions_mismatch,
    runtime_started,
    libtpu_missing,
    tpu_left_idle,
    tpu_asked_but_missing,
    pjrt_device_unknown,
    device_files_hidden,
    tpu_held_elsewhere,
    retired_tpu_node_variables,
    kaggle_process_addresses,
    deprecated_bf16_variables,
    cpu_device_count_odd,
    gpu_unused,
)
_ORDER = {"error": 0, "warning": 1, "info": 2}


def find_problems(
    *,
    accelerator: Accelerator,
    environment: str,
    versions: Mapping[str, str | None],
    runtime_initialized: bool,
    environ: Mapping[str, str],
) -> list[Problem]:
    """Everything wrong with these facts, errors first, each with a concrete fix."""
    facts = Facts(accelerator, environment, versions, runtime_initialized, environ)
    problems = [problem for check in CHECKS for problem in check(facts)]
    return sorted(problems, key=lambda problem: _ORDER[problem.severity])


# -- launches stopped because their kernel died --

#: Notes older than this are not shown (a machine's temporary folder outlives many sessions).
SHOWN_FOR = 7 * 24 * 3600.0


@dataclass(frozen=True)
class StoppedLaunch:
    """A launch stopped because the kernel that started it died.

    Attributes:
        kernel_pid: the process id the kernel had.
        supervisor_pid: the launch's supervisor, which stopped it.
        stopped_at: when (seconds since the epoch).
        processes: every process it stopped, `processes.describe`'s words for each.
        path: the note's file (empty until read back).
    """

    kernel_pid: int
    supervisor_pid: int
    stopped_at: float
    processes: list[str] = field(default_factory=list)
    path: str = ""

    def sentence(self) -> str:
        """One line for a person: whose launch, when, and what was stopped."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.stopped_at))
        stopped = ", ".join(self.processes) or "nothing else"
        return (f"a launch of a kernel that died (pid {self.kernel_pid}) was stopped at "
                f"{when}: {stopped}")


def notes_folder() -> Path:
    """Where the notes go: one folder per user in the system's temporary folder."""
    return Path(tempfile.gettempdir()) / f"hfxla_nb-{os.getuid()}" / "stopped-launches"


def record(launch: StoppedLaunch, folder: Path | None = None) -> Path:
    """Write `launch` as a note, whole or not at all (a temporary file renamed into place).

    Returns:
        The note's path.
    """
    folder = notes_folder() if folder is None else folder
    folder.mkdir(parents=True, exist_ok=True)
    data = {key: value for key, value in asdict(launch).items() if key != "path"}
    path = folder / f"{launch.supervisor_pid}-{int(launch.stopped_at * 1000)}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data))
    os.replace(partial, path)
    return path


def read(folder: Path | None = None, now: float | None = None) -> list[StoppedLaunch]:
    """The notes not yet forgotten and younger than `SHOWN_FOR`, oldest first; unreadable
    ones are skipped."""
    folder = notes_folder() if folder is None else folder
    now = time.time() if now is None else now
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            data = json.loads(path.read_text())
            launch = StoppedLaunch(int(data["kernel_pid"]), int(data["supervisor_pid"]),
                                   float(data["stopped_at"]),
                                   [str(line) for line in data.get("processes", [])],
                                   str(path))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if now - launch.stopped_at <= SHOWN_FOR:
            found.append(launch)
    return sorted(found, key=lambda launch: launch.stopped_at)


def forget(launches: Iterable[StoppedLaunch]) -> None:
    """Remove the notes of `launches` (after they were shown)."""
    for launch in launches:
        if launch.path:
            Path(launch.path).unlink(missing_ok=True)


# -- detect(): every fact and problem, without starting the runtime --

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


WARM_MODEL = ("It holds the fine-tuned model on the devices between cells, so that predict, "
              "generate and evaluate start at once. release() on the run's result frees "
              "them; a launch or fine_tune frees them first.")
WARM_SESSION = ("It holds what its runs left on the devices between cells. close() on the "
                "session frees them; a launch or fine_tune frees them first.")


def warm_sessions() -> list[Problem]:
    """The warm sessions of this kernel, each a note: what they hold, for how long, with which
    processes (`launch.sessions`; a kernel that never opened one never imported it)."""
    sessions = sys.modules.get("hfxla_nb.launch.sessions")
    if sessions is None:
        return []
    return [Problem("info", f"A warm session holds the devices: {info}.",
                    WARM_MODEL if info.holds_model else WARM_SESSION)
            for info in sessions.open_sessions()]


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
    stopped = read() if sys_root == "/" else []
    problems += [Problem("warning", launch.sentence() + ".", STOPPED_LAUNCH_FIX)
                 for launch in stopped]
    problems += warm_sessions()
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
