"""What hardware and runtime this notebook has, what is wrong with it, and how to set it up.

```python
import hfxla_nb as hx
hx.detect()              # a RuntimeInfo panel: accelerator, where it runs, versions, problems
hx.configure(cores=8)    # before any device use: on the CPU, 8 virtual XLA devices
```

Nothing here starts the XLA runtime, and nothing here imports torch, torch_xla or transformers:
the hardware is read from sysfs and `/dev`, versions from package metadata, and the runtime
state through `_xla` (which only looks at an already imported torch_xla). A kernel that started
the runtime cannot fork workers that use XLA any more (they hang), so `detect()` must be safe to
call first thing in a notebook.

The facts are gathered by small pure functions that take the file-system root (`sys_root`) and
the environment as arguments, so tests drive them with fake trees and dicts.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import platform
import re
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from . import _xla

# ---------------------------------------------------------------------------------------------
# Hardware tables (TPU-HARDWARE.md, from tpu-info and torch_xla/_internal/tpu.py)
# ---------------------------------------------------------------------------------------------

GOOGLE_PCI_VENDOR = "0x1ae0"


@dataclass(frozen=True)
class TpuGeneration:
    """One TPU generation as the PCI bus shows it.

    Attributes:
        name: "v2", "v3", "v4", "v5e", "v5p", "v6e" or "7x".
        pci_device: PCI device id of its chips (vendor 0x1ae0).
        pci_subsystem: subsystem id, where the device id is shared (v2 and v3).
        cores_per_chip: XLA devices per chip (2 on v2/v3/7x, else 1).
        hbm_gib: HBM per chip, GiB.
    """

    name: str
    pci_device: str
    pci_subsystem: str | None
    cores_per_chip: int
    hbm_gib: int


TPU_GENERATIONS: tuple[TpuGeneration, ...] = (
    TpuGeneration("v2", "0x0027", "0x004e", 2, 8),
    TpuGeneration("v3", "0x0027", "0x004f", 2, 16),
    TpuGeneration("v4", "0x005e", None, 1, 32),
    TpuGeneration("v5e", "0x0063", None, 1, 16),
    TpuGeneration("v5p", "0x0062", None, 1, 95),
    TpuGeneration("v6e", "0x006f", None, 1, 32),
    TpuGeneration("7x", "0x0076", None, 2, 192),
)
_GENERATIONS_BY_NAME = {generation.name: generation for generation in TPU_GENERATIONS}

# Environment variables worth showing (exact names) and families of them (prefixes).
_RELEVANT_NAMES = frozenset(
    {
        "PJRT_DEVICE",
        "CPU_NUM_DEVICES",
        "GPU_NUM_DEVICES",
        "XLA_FLAGS",
        "LIBTPU_INIT_ARGS",
        "PT_XLA_DEBUG",
        "PT_XLA_DEBUG_LEVEL",
        "PT_XLA_DEBUG_FILE",
        "COLAB_TPU_ADDR",
        "XRT_TPU_CONFIG",
        "CLOUD_TPU_TASK_ID",
        "USE_TORCH_XLA",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HOME",
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "TF_CPP_MIN_LOG_LEVEL",
    }
)
_RELEVANT_PREFIXES = ("TPU_", "XLA_", "PT_XLA_", "PJRT_", "XRT_", "ACCELERATE_")
_SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
HIDDEN = "<hidden>"

# Distribution names per reported package; the first one installed wins.
_PACKAGES: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "torch_xla": ("torch_xla",),
    "libtpu": ("libtpu", "libtpu-nightly"),
    "transformers": ("transformers",),
    "datasets": ("datasets",),
    "accelerate": ("accelerate",),
    "ipywidgets": ("ipywidgets",),
    "ipykernel": ("ipykernel",),
    "IPython": ("ipython",),
    "hfxla_nb": ("hfxla_nb",),
}

ENVIRONMENTS = ("colab", "kaggle", "tpu-vm", "vscode", "jupyter", "terminal")
DEVICES = ("auto", "tpu", "cpu")

_RESTART_ADVICE = (
    "Restart the kernel and move device code (torch_xla.device(), "
    "transformers.TrainingArguments(...), met.metrics_report()) into the launched function"
)


# ---------------------------------------------------------------------------------------------
# Result types
# ---------------------------------------------------------------------------------------------


class RuntimeAlreadyStartedError(RuntimeError):
    """`configure()` was called after the XLA runtime started in this process."""


class TpuNotFoundError(RuntimeError):
    """`configure(device="tpu")` on a machine where no TPU was found."""


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


@dataclass
class Accelerator:
    """The hardware a launch runs on.

    Attributes:
        kind: "tpu", "cpu", or "gpu" (only when `PJRT_DEVICE` asks for CUDA and a GPU exists).
        generation: TPU generation ("v2" ... "7x"); None when not a TPU or not known.
        chips: TPU chips (GPUs for "gpu"; 0 on the CPU).
        cores_per_chip: XLA devices per chip.
        devices: XLA devices a launch gets: chips x cores per chip, or on the CPU the virtual
            devices of `CPU_NUM_DEVICES` (default 1).
        hbm_per_chip_gib: HBM per TPU chip in GiB; None when unknown or not a TPU.
        found_by: how it was found ("PCI 0x1ae0:0x0063 x4", "/dev/vfio x4", "PJRT_DEVICE=TPU").
        host_cores: CPU cores of the host (`os.cpu_count()`).
        gpus: NVIDIA GPUs seen on the host (noted even when the launch uses the CPU).
        holders: other processes holding the TPU device files, pid -> command name.
    """

    kind: Literal["tpu", "cpu", "gpu"]
    generation: str | None = None
    chips: int = 0
    cores_per_chip: int = 1
    devices: int = 1
    hbm_per_chip_gib: int | None = None
    found_by: list[str] = field(default_factory=list)
    host_cores: int | None = None
    gpus: int = 0
    holders: dict[int, str] = field(default_factory=dict)

    @property
    def description(self) -> str:
        """One line: "TPU v5e: 4 chips x 1 core = 4 devices, 16 GiB HBM per chip"."""
        if self.kind == "tpu":
            name = f"TPU {self.generation}" if self.generation else "TPU (generation unknown)"
            text = (
                f"{name}: {_plural(self.chips, 'chip')} x {_plural(self.cores_per_chip, 'core')}"
                f" = {_plural(self.devices, 'device')}"
            )
            if self.hbm_per_chip_gib:
                text += f", {self.hbm_per_chip_gib} GiB HBM per chip"
            return text
        if self.kind == "gpu":
            return f"GPU: {_plural(self.devices, 'device')}"
        text = f"CPU: {_plural(self.devices, 'virtual XLA device')}"
        if self.host_cores:
            text += f" on {_plural(self.host_cores, 'host core')}"
        if self.gpus:
            text += f" (also {_plural(self.gpus, 'NVIDIA GPU')}, unused by XLA here)"
        return text


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
    """

    accelerator: Accelerator
    environment: str
    versions: dict[str, str | None]
    runtime_initialized: bool
    env: dict[str, str]
    problems: list[Problem] = field(default_factory=list)

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

    def _repr_html_(self) -> str:
        from .ui.runtime_panel import runtime_html

        return runtime_html(self)

    def __str__(self) -> str:
        from .ui.runtime_panel import runtime_text

        return runtime_text(self)

    __repr__ = __str__


# ---------------------------------------------------------------------------------------------
# Hardware: pure functions of a file-system root
# ---------------------------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read().strip().lower()
    except OSError:
        return None


def _under(sys_root: str, path: str) -> str:
    return os.path.join(sys_root, path.lstrip("/"))


def tpu_generation(pci_device: str, pci_subsystem: str | None = None) -> TpuGeneration | None:
    """The TPU generation of a Google PCI device id (and subsystem id, for v2 vs v3).

    Returns:
        The `TpuGeneration`, or None for ids that are not TPUs (or a v2/v3 whose subsystem id is
        unknown).
    """
    for generation in TPU_GENERATIONS:
        if generation.pci_device != pci_device:
            continue
        if generation.pci_subsystem is None or generation.pci_subsystem == pci_subsystem:
            return generation
    return None


def scan_pci(sys_root: str = "/") -> list[tuple[str, str | None]]:
    """Google TPU chips on the PCI bus, as `(device id, subsystem id)` pairs, one per chip.

    Reads `<sys_root>/sys/bus/pci/devices/*/{vendor,device,subsystem_device}` (what torch_xla and
    tpu-info read), so it needs neither the runtime nor the GCE metadata server.
    """
    chips = []
    pattern = _under(sys_root, "/sys/bus/pci/devices/*/vendor")
    for vendor_path in sorted(glob.glob(pattern)):
        if _read(vendor_path) != GOOGLE_PCI_VENDOR:
            continue
        folder = os.path.dirname(vendor_path)
        device = _read(os.path.join(folder, "device"))
        if device is None or device not in {g.pci_device for g in TPU_GENERATIONS}:
            continue
        chips.append((device, _read(os.path.join(folder, "subsystem_device"))))
    return chips


def scan_device_files(sys_root: str = "/") -> list[str]:
    """TPU device files: `/dev/accel<N>` (v2-v4) and `/dev/vfio/<N>` (v5e and later).

    Returned as absolute paths as seen inside `sys_root` (e.g. "/dev/vfio/0"). `/dev/vfio/vfio`
    is VFIO's control file, not a chip, so it is left out.
    """
    found = []
    for path in sorted(glob.glob(_under(sys_root, "/dev/accel*"))):
        name = os.path.basename(path)
        # /dev/accel/ (a directory) is the kernel's generic accelerator class, not a TPU.
        if re.fullmatch(r"accel\d+", name) and not os.path.isdir(path):
            found.append(f"/dev/{name}")
    for path in sorted(glob.glob(_under(sys_root, "/dev/vfio/*"))):
        name = os.path.basename(path)
        if name.isdigit():
            found.append(f"/dev/vfio/{name}")
    return found


def scan_gpus(sys_root: str = "/") -> int:
    """NVIDIA GPUs on the host: `/dev/nvidia<N>` files, or 1 when only the driver is present."""
    count = sum(
        1
        for path in glob.glob(_under(sys_root, "/dev/nvidia*"))
        if re.fullmatch(r"nvidia\d+", os.path.basename(path))
    )
    if count == 0 and os.path.isdir(_under(sys_root, "/proc/driver/nvidia")):
        return 1
    return count


def find_device_holders(sys_root: str = "/", own_pid: int | None = None) -> dict[int, str]:
    """Processes other than `own_pid` that hold TPU device files open.

    A forgotten kernel or a stale worker holding `/dev/accel*` or `/dev/vfio/*` makes the TPU
    unusable for everyone else; tpu-info finds them the same way, through `/proc/*/fd` links.

    Returns:
        pid -> command name (from `/proc/<pid>/comm`), for every holder found.
    """
    own_pid = os.getpid() if own_pid is None else own_pid
    holders: dict[int, str] = {}
    for proc in glob.glob(_under(sys_root, "/proc/[0-9]*")):
        pid = int(os.path.basename(proc))
        if pid == own_pid:
            continue
        try:
            fds = os.listdir(os.path.join(proc, "fd"))
        except OSError:  # other users' processes, or gone since the glob
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(proc, "fd", fd))
            except OSError:
                continue
            if target.startswith("/dev/accel") or target.startswith("/dev/vfio/"):
                comm = _read(os.path.join(proc, "comm"))
                holders[pid] = comm or "?"
                break
    return holders


def generation_from_accelerator_type(accelerator_type: str | None) -> str | None:
    """The generation named by `TPU_ACCELERATOR_TYPE` ("v3-8" -> "v3", "v5litepod-8" -> "v5e")."""
    if not accelerator_type:
        return None
    value = accelerator_type.strip().lower()
    patterns = (
        (r"v5(litepod|lite|e)\b", "v5e"),
        (r"v5p\b", "v5p"),
        (r"v6e\b", "v6e"),
        (r"(tpu)?v?7x?\b", "7x"),
        (r"v2\b", "v2"),
        (r"v3\b", "v3"),
        (r"v4\b", "v4"),
    )
    for pattern, name in patterns:
        if re.match(pattern, value):
            return name
    return None


def cpu_device_count(environ: Mapping[str, str]) -> int | None:
    """Virtual CPU devices `CPU_NUM_DEVICES` asks for (1 when unset); None when it is invalid."""
    value = environ.get("CPU_NUM_DEVICES", "").strip()
    if not value:
        return 1
    try:
        count = int(value)
    except ValueError:
        return None
    return count if count > 0 else None


def accelerator_from_facts(
    pci_chips: list[tuple[str, str | None]],
    device_files: list[str],
    environ: Mapping[str, str],
    *,
    host_cores: int | None = None,
    gpus: int = 0,
    holders: dict[int, str] | None = None,
) -> Accelerator:
    """Decide the accelerator from what the scans found (pure).

    PCI is the authority on chips and generation; device files count chips where PCI is not
    visible (some containers), with the generation then taken from `TPU_ACCELERATOR_TYPE`.
    Environment variables alone never make a TPU: `PJRT_DEVICE=TPU` on a machine without one
    is a problem, not a TPU.
    """
    found_by: list[str] = []
    generation: TpuGeneration | None = None
    generation_name: str | None = None
    chips = 0
    if pci_chips:
        chips = len(pci_chips)
        names = [tpu_generation(device, subsystem) for device, subsystem in pci_chips]
        known = [g for g in names if g is not None]
        if known:
            generation = max(set(known), key=known.count)
            generation_name = generation.name
        device, _ = pci_chips[0]
        found_by.append(f"PCI {GOOGLE_PCI_VENDOR}:{device} x{chips}")
    if device_files:
        accel = [path for path in device_files if path.startswith("/dev/accel")]
        vfio = [path for path in device_files if path.startswith("/dev/vfio/")]
        if accel:
            found_by.append(f"/dev/accel* x{len(accel)}")
        if vfio:
            found_by.append(f"/dev/vfio/* x{len(vfio)}")
        if not chips:
            chips = max(len(accel), len(vfio))
    if chips:
        accelerator_type = environ.get("TPU_ACCELERATOR_TYPE")
        if generation is None:
            generation_name = generation_from_accelerator_type(accelerator_type)
            generation = _GENERATIONS_BY_NAME.get(generation_name or "")
            if generation is not None:
                found_by.append(f"TPU_ACCELERATOR_TYPE={accelerator_type}")
        if environ.get("PJRT_DEVICE", "").upper() == "TPU":
            found_by.append("PJRT_DEVICE=TPU")
        cores = generation.cores_per_chip if generation else 1
        if generation is None and pci_chips and pci_chips[0][0] == "0x0027":
            # v2 or v3 with an unknown subsystem id: both have two cores per chip.
            generation_name, cores = "v2/v3", 2
        return Accelerator(
            kind="tpu",
            generation=generation_name,
            chips=chips,
            cores_per_chip=cores,
            devices=chips * cores,
            hbm_per_chip_gib=generation.hbm_gib if generation else None,
            found_by=found_by,
            host_cores=host_cores,
            gpus=gpus,
            holders=dict(holders or {}),
        )
    pjrt = environ.get("PJRT_DEVICE", "").upper()
    if gpus and pjrt in ("CUDA", "GPU"):
        count = _positive_int(environ.get("GPU_NUM_DEVICES")) or gpus
        return Accelerator(
            kind="gpu",
            chips=gpus,
            devices=count,
            found_by=[f"PJRT_DEVICE={pjrt}", "/dev/nvidia*"],
            host_cores=host_cores,
            gpus=gpus,
        )
    found_by = ["no TPU on the PCI bus or in /dev"]
    if "CPU_NUM_DEVICES" in environ:
        found_by.append(f"CPU_NUM_DEVICES={environ['CPU_NUM_DEVICES']}")
    return Accelerator(
        kind="cpu",
        devices=cpu_device_count(environ) or 1,
        found_by=found_by,
        host_cores=host_cores,
        gpus=gpus,
    )


def detect_accelerator(
    sys_root: str = "/", environ: Mapping[str, str] | None = None
) -> Accelerator:
    """Scan `sys_root` for TPU chips, device files, holders and GPUs; never starts the runtime."""
    environ = os.environ if environ is None else environ
    pci_chips = scan_pci(sys_root)
    device_files = scan_device_files(sys_root)
    # Scanning every process's fds is only worth it where there is a TPU to hold.
    holders = find_device_holders(sys_root) if device_files else {}
    return accelerator_from_facts(
        pci_chips,
        device_files,
        environ,
        host_cores=os.cpu_count(),
        gpus=scan_gpus(sys_root),
        holders=holders,
    )


# ---------------------------------------------------------------------------------------------
# Where it runs, versions, environment variables
# ---------------------------------------------------------------------------------------------


def shell_class_names(modules: Mapping[str, Any] | None = None) -> list[str]:
    """Class names (MRO) of the running IPython shell, or [] outside IPython.

    Uses IPython only when something already imported it: importing it here would cost time
    in a plain script and prove nothing.
    """
    modules = sys.modules if modules is None else modules
    ipython = modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    if get_ipython is None:
        return []
    try:
        shell = get_ipython()
    except Exception:  # noqa: BLE001 - a broken IPython must not break detection
        return []
    if shell is None:
        return []
    return [cls.__name__ for cls in type(shell).__mro__]


def _colab_installed() -> bool:
    if "google.colab" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("google.colab") is not None
    except (ImportError, ValueError):
        return False


def detect_environment(
    environ: Mapping[str, str],
    *,
    modules: Mapping[str, Any] | None = None,
    tpu_present: bool = False,
    colab_installed: bool = False,
) -> str:
    """Where this runs: "colab", "kaggle", "tpu-vm", "vscode", "jupyter" or "terminal".

    The hosted notebooks come first (they are also Jupyter kernels, often on TPU VMs), then a
    bare TPU VM, then editors and plain Jupyter.

    Args:
        environ: the environment variables.
        modules: `sys.modules` (or a stand-in); used to tell an ipykernel from a script.
        tpu_present: whether TPU hardware was found on this host.
        colab_installed: whether `google.colab` can be imported.
    """
    if colab_installed or "COLAB_RELEASE_TAG" in environ or "COLAB_GPU" in environ:
        return "colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in environ or "KAGGLE_URL_BASE" in environ:
        return "kaggle"
    if tpu_present or "TPU_ACCELERATOR_TYPE" in environ or "TPU_WORKER_ID" in environ:
        return "tpu-vm"
    if any(name.startswith("VSCODE_") for name in environ):
        return "vscode"
    modules = sys.modules if modules is None else modules
    if modules.get("ipykernel") is not None and any(
        name == "ZMQInteractiveShell" for name in shell_class_names(modules)
    ):
        return "jupyter"
    return "terminal"


def _distribution_version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def package_versions(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """Versions of python and the packages that matter, from metadata (nothing is imported).

    libtpu counts as present when torch_xla would find it: `TPU_LIBRARY_PATH`, a libtpu.so
    bundled inside torch_xla, or the libtpu / libtpu-nightly package (torch_xla's own order).
    """
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for key, names in _PACKAGES.items():
        versions[key] = _distribution_version(names)
    if versions["hfxla_nb"] is None:
        from . import __version__

        versions["hfxla_nb"] = __version__
    if versions["libtpu"] is None:
        versions["libtpu"] = _libtpu_elsewhere(os.environ if environ is None else environ)
    return versions


def _libtpu_elsewhere(environ: Mapping[str, str]) -> str | None:
    if environ.get("TPU_LIBRARY_PATH"):
        return "TPU_LIBRARY_PATH"
    try:
        spec = importlib.util.find_spec("torch_xla")  # finds the folder; imports nothing
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if os.path.isfile(os.path.join(folder, "lib", "libtpu.so")):
            return "bundled with torch_xla"
    return None


def is_secret_name(name: str) -> bool:
    """Whether a variable's value must never be shown (its name mentions a token, key...)."""
    upper = name.upper()
    return any(marker in upper for marker in _SECRET_MARKERS)


def redact_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of `environ` with the values of secret-looking names replaced by "<hidden>".

    A name is secret when it contains TOKEN, KEY, SECRET, PASSWORD (or PASSWD) or CREDENTIAL,
    in any case. The name stays visible so users can see that, say, HF_TOKEN is set.
    """
    return {name: HIDDEN if is_secret_name(name) else value for name, value in environ.items()}


def relevant_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that change what torch_xla, the TPU runtime or the Hub do (unredacted)."""
    return {
        name: environ[name]
        for name in sorted(environ)
        if name in _RELEVANT_NAMES or name.startswith(_RELEVANT_PREFIXES)
    }


# ---------------------------------------------------------------------------------------------
# Problems: a pure function of the gathered facts
# ---------------------------------------------------------------------------------------------


def _major_minor(version: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def find_problems(
    *,
    accelerator: Accelerator,
    environment: str,
    versions: Mapping[str, str | None],
    runtime_initialized: bool,
    environ: Mapping[str, str],
) -> list[Problem]:
    """Everything wrong with these facts, errors first, each with a concrete fix.

    Only variable names and non-secret values (PJRT_DEVICE, CPU_NUM_DEVICES) go into the
    messages, so the result is safe to show.
    """
    problems: list[Problem] = []
    on_tpu = accelerator.kind == "tpu"
    on_colab = environment == "colab"
    torch_version = versions.get("torch")
    xla_version = versions.get("torch_xla")
    torch_mm = _major_minor(torch_version)
    match_spec = f"{torch_mm[0]}.{torch_mm[1]}.*" if torch_mm else "2.9.*"
    tpu_extra = "[tpu]" if on_tpu else ""

    if torch_version is None:
        problems.append(
            Problem(
                "error",
                "torch is not installed.",
                f"pip install 'torch==2.9.*' 'torch_xla{tpu_extra}==2.9.*' (the same minor "
                "version for both).",
            )
        )
    if xla_version is None:
        fix = f"pip install 'torch_xla{tpu_extra}=={match_spec}'"
        if torch_mm:
            fix += f" to match torch {torch_mm[0]}.{torch_mm[1]}"
        if on_colab:
            fix += (
                ". On Colab choose Runtime > Change runtime type > TPU: its image ships "
                "matching torch and torch_xla; do not reinstall torch there"
            )
        problems.append(Problem("error", "torch_xla is not installed.", fix + "."))
    elif torch_mm and _major_minor(xla_version) and _major_minor(xla_version) != torch_mm:
        fix = (
            f"pip install 'torch_xla{tpu_extra}=={match_spec}' to match torch "
            f"{torch_mm[0]}.{torch_mm[1]}, then restart the kernel."
        )
        if on_colab:
            fix = (
                "Do not reinstall torch on Colab: the TPU runtime ships matching versions. "
                + fix
                + " If torch itself was upgraded, use Runtime > Disconnect and delete runtime."
            )
        problems.append(
            Problem(
                "error",
                f"torch {torch_version} and torch_xla {xla_version} do not match: torch_xla "
                "only works with the torch release of the same minor version.",
                fix,
            )
        )

    if runtime_initialized:
        problems.append(
            Problem(
                "error",
                "The XLA runtime has already started in this process: the launcher will refuse "
                "to fork, since forked workers that use XLA hang forever.",
                _RESTART_ADVICE + "; call hx.configure() and hx.detect() before anything else.",
            )
        )

    pjrt = environ.get("PJRT_DEVICE", "").strip()
    pjrt_upper = pjrt.upper()
    if on_tpu and xla_version is not None and versions.get("libtpu") is None:
        problems.append(
            Problem(
                "error",
                "A TPU is attached but libtpu (the TPU runtime library) is not installed.",
                f"pip install 'torch_xla[tpu]=={xla_version}', then restart the kernel.",
            )
        )
    if on_tpu and pjrt_upper == "CPU":
        problems.append(
            Problem(
                "warning",
                f"This machine has a {accelerator.description.split(':')[0]}, but "
                "PJRT_DEVICE=CPU: torch_xla will run on the CPU and leave the TPU idle.",
                "Call hx.configure(device='tpu') (or unset PJRT_DEVICE) before the runtime "
                "starts; if it already started, restart the kernel first.",
            )
        )
    if not on_tpu and pjrt_upper == "TPU":
        problems.append(
            Problem(
                "error",
                "PJRT_DEVICE=TPU, but no TPU was found (no Google device on the PCI bus, no "
                "/dev/accel* or /dev/vfio/*).",
                "On Colab or Kaggle pick a TPU runtime/accelerator. To rehearse on the CPU, "
                "call hx.configure(device='cpu', cores=8), which sets PJRT_DEVICE=CPU.",
            )
        )
    elif not on_tpu and environ.get("TPU_ACCELERATOR_TYPE"):
        problems.append(
            Problem(
                "warning",
                "TPU_ACCELERATOR_TYPE is set, but no TPU is visible on the PCI bus or in /dev.",
                "Inside a container, start it with --privileged (or pass the /dev/accel* or "
                "/dev/vfio devices and mount /sys); otherwise this is not a TPU host.",
            )
        )
    if pjrt and pjrt_upper not in ("TPU", "CPU", "CUDA", "GPU"):
        problems.append(
            Problem(
                "error",
                f"PJRT_DEVICE={pjrt} is not a device torch_xla knows.",
                "Call hx.configure(device='auto') or set PJRT_DEVICE to TPU or CPU.",
            )
        )
    elif not pjrt and not on_tpu and xla_version is not None:
        problems.append(
            Problem(
                "info",
                "PJRT_DEVICE is not set: torch_xla will fall back to the CPU with a warning.",
                "Call hx.configure() (or hx.configure(device='cpu', cores=8)) before the "
                "runtime starts.",
            )
        )
    if (
        on_tpu
        and accelerator.found_by
        and not any(item.startswith("/dev/") for item in accelerator.found_by)
    ):
        problems.append(
            Problem(
                "error",
                "TPU chips are on the PCI bus, but no /dev/accel* or /dev/vfio/* device files "
                "are visible, so the runtime cannot open them.",
                "Inside a container, run it with --privileged or pass the TPU device files "
                "(--device /dev/vfio/0 ... or /dev/accel0 ...).",
            )
        )
    if accelerator.holders:
        listing = ", ".join(f"{pid} ({name})" for pid, name in sorted(accelerator.holders.items()))
        pids = " ".join(str(pid) for pid in sorted(accelerator.holders))
        problems.append(
            Problem(
                "error",
                f"The TPU is held by another process: {listing}. Only one process can open "
                "the TPU at a time.",
                "Shut down the other notebook's kernel or the stale worker (Kernel > Shut "
                f"Down, or `kill {pids}`), then run your cell again.",
            )
        )

    stale = [name for name in ("COLAB_TPU_ADDR", "XRT_TPU_CONFIG") if name in environ]
    if stale:
        unset = "; ".join(f"os.environ.pop({name!r}, None)" for name in stale)
        problems.append(
            Problem(
                "warning",
                f"{' and '.join(stale)} {'is' if len(stale) == 1 else 'are'} set: "
                "leftovers of the retired TPU Node (XRT) setup, which torch_xla 2.x ignores.",
                f"Unset {'it' if len(stale) == 1 else 'them'} ({unset}) and drop old notebook "
                "code that reads them; PJRT_DEVICE=TPU (hx.configure()) replaces them.",
            )
        )
    if environment == "kaggle" and any(
        name in environ for name in ("TPU_PROCESS_ADDRESSES", "CLOUD_TPU_TASK_ID")
    ):
        problems.append(
            Problem(
                "warning",
                "TPU_PROCESS_ADDRESSES / CLOUD_TPU_TASK_ID are set by Kaggle's TPU image; "
                "xmp.spawn on Kaggle's v3-8 misbehaves with them.",
                "pytorch/xla's Kaggle notebook removes them before spawning: "
                "os.environ.pop('TPU_PROCESS_ADDRESSES', None); "
                "os.environ.pop('CLOUD_TPU_TASK_ID', None).",
            )
        )
    for name in ("XLA_USE_BF16", "XLA_DOWNCAST_BF16"):
        if environ.get(name, "0") not in ("", "0"):
            problems.append(
                Problem(
                    "warning",
                    f"{name} is deprecated since torch_xla 2.6 and changes every float tensor.",
                    f"Unset {name} and convert the model itself (model.to(torch.bfloat16)), or "
                    "use torch.autocast('xla', dtype=torch.bfloat16).",
                )
            )
    if "CPU_NUM_DEVICES" in environ:
        count = cpu_device_count(environ)
        if count is None:
            problems.append(
                Problem(
                    "error",
                    f"CPU_NUM_DEVICES={environ['CPU_NUM_DEVICES']!r} is not a positive integer.",
                    "Call hx.configure(device='cpu', cores=N) or set CPU_NUM_DEVICES to a "
                    "number such as 8.",
                )
            )
        elif not on_tpu and accelerator.host_cores and count > accelerator.host_cores:
            problems.append(
                Problem(
                    "info",
                    f"CPU_NUM_DEVICES={count} is more than the {accelerator.host_cores} host "
                    "cores.",
                    "That is fine for rehearsing sharding over a TPU-sized mesh; steps just run "
                    "slower than on fewer devices.",
                )
            )
    if accelerator.kind == "cpu" and accelerator.gpus:
        problems.append(
            Problem(
                "info",
                f"{_plural(accelerator.gpus, 'NVIDIA GPU')} found: hfxla_nb runs XLA on the "
                "CPU here, to rehearse TPU code.",
                "For GPU training use plain PyTorch; for TPUs pick a TPU runtime.",
            )
        )
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(problems, key=lambda problem: order[problem.severity])


# ---------------------------------------------------------------------------------------------
# The public entry points
# ---------------------------------------------------------------------------------------------


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
        colab_installed=_colab_installed(),
    )
    initialized = _xla.runtime_is_initialized()
    problems = find_problems(
        accelerator=accelerator,
        environment=environment,
        versions=versions,
        runtime_initialized=initialized,
        environ=environ,
    )
    return RuntimeInfo(
        accelerator=accelerator,
        environment=environment,
        versions=versions,
        runtime_initialized=initialized,
        env=redact_environment(relevant_environment(environ)),
        problems=problems,
    )


def configure(
    device: str = "auto",
    cores: int | None = None,
    debug: bool = False,
    *,
    environ: MutableMapping[str, str] | None = None,
    sys_root: str = "/",
) -> dict[str, str]:
    """Set the environment variables torch_xla reads when its runtime starts.

    Call it before anything touches the device: torch_xla reads these variables once, when the
    runtime starts, and ignores later changes.

    Args:
        device: "auto" (the TPU if one is found, else the CPU), "tpu" or "cpu".
        cores: on the CPU, the number of virtual XLA devices (`CPU_NUM_DEVICES`), e.g. 8 to
            rehearse a TPU host. On a TPU, all devices (the default) or those of one chip.
        debug: set `PT_XLA_DEBUG_LEVEL=2`, PyTorch/XLA's own analysis of every compilation and
            device-to-host transfer (why it happened, from which line).
        environ: the mapping to change (default `os.environ`).
        sys_root: root of the file system to look for TPU hardware in (tests pass a fake tree).

    Returns:
        The variables set, name -> value.

    Raises:
        ValueError: for an unknown `device` or an invalid `cores`.
        TpuNotFoundError: `device="tpu"` where no TPU was found.
        RuntimeAlreadyStartedError: the XLA runtime already started in this process.

    Example:
        ```python
        hx.configure(device="cpu", cores=8)   # {'PJRT_DEVICE': 'CPU', 'CPU_NUM_DEVICES': '8'}
        ```
    """
    if device not in DEVICES:
        raise ValueError(
            f"device={device!r} is not one of {', '.join(map(repr, DEVICES))}: use 'auto' (the "
            "TPU when there is one), 'tpu' or 'cpu'."
        )
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        raise ValueError(f"cores must be a positive integer or None, got {cores!r}.")
    if _xla.runtime_is_initialized():
        raise RuntimeAlreadyStartedError(
            "The XLA runtime has already started in this process, so hx.configure() can no "
            "longer change it: torch_xla reads PJRT_DEVICE and CPU_NUM_DEVICES only once. "
            "Restart the kernel and call hx.configure(...) first, before torch_xla.device(), "
            "transformers.TrainingArguments(...), met.metrics_report() or anything else that "
            "touches the device."
        )
    environ = os.environ if environ is None else environ
    accelerator = detect_accelerator(sys_root, environ)
    target = device if device != "auto" else ("tpu" if accelerator.kind == "tpu" else "cpu")
    values: dict[str, str] = {}
    if target == "tpu":
        values.update(_tpu_settings(accelerator, cores))
    else:
        values["PJRT_DEVICE"] = "CPU"
        if cores is not None:
            values["CPU_NUM_DEVICES"] = str(cores)
    if debug:
        values["PT_XLA_DEBUG_LEVEL"] = "2"
    environ.update(values)
    return values


def _tpu_settings(accelerator: Accelerator, cores: int | None) -> dict[str, str]:
    if accelerator.kind != "tpu":
        raise TpuNotFoundError(
            "device='tpu', but no TPU was found on this machine (no Google device on the PCI "
            "bus, no /dev/accel* or /dev/vfio/*). On Colab or Kaggle pick a TPU runtime; to "
            "rehearse on the CPU use hx.configure(device='cpu', cores=8)."
        )
    values = {"PJRT_DEVICE": "TPU"}
    if cores is None or cores == accelerator.devices:
        return values
    description = accelerator.description.split(",")[0]
    if cores > accelerator.devices:
        raise ValueError(
            f"cores={cores}, but this host has only {accelerator.devices} TPU devices "
            f"({description}). Pass cores={accelerator.devices} or leave cores=None."
        )
    if cores == accelerator.cores_per_chip:
        # torch_xla's own one-chip topology (torch_xla._internal.tpu.configure_one_chip_topology)
        values.update(
            TPU_VISIBLE_CHIPS="0", TPU_CHIPS_PER_PROCESS_BOUNDS="1,1,1", TPU_PROCESS_BOUNDS="1,1,1"
        )
        return values
    raise ValueError(
        f"cores={cores} is not a TPU topology this helper can set up ({description}): use "
        f"cores=None for all {accelerator.devices} devices, or cores={accelerator.cores_per_chip} "
        "for one chip."
    )


def _positive_int(value: str | None) -> int | None:
    try:
        number = int(value or "")
    except ValueError:
        return None
    return number if number > 0 else None


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
