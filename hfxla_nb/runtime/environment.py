"""The machine and the place this runs in: the host, its chips, the packages, the variables.

Pure functions of the environment, `sys.modules` and the file system. Nothing here imports
torch_xla or starts the XLA runtime, so `detect()` can call them first thing in a notebook.

- Where this runs (Colab, Kaggle, a TPU VM, Jupyter...), the package versions and the
  variables that matter, with secrets hidden.
- TPU chips, device files and the processes that hold them, read from sysfs, /dev and /proc.
  Every function takes the file-system root (`sys_root`) and the environment as arguments,
  so tests drive them with fake trees.
- Which host this is (Colab's v5e-1, Kaggle's v5e-8, a TPU VM, a machine without a TPU) and
  what the launcher does there, in words a person reads in `%xla_info`.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import platform
import re
import sys
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

from .._version import __version__
from .._words import plural

# -- where this runs, package versions, environment variables --

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
    # TorchTPU, torch_xla's successor: found by its distribution's name, never by importing
    # `torch_tpu` (another project may install a module of that name).
    "torch_tpu": ("torch-tpu",),
    "libtpu": ("libtpu", "libtpu-nightly"),
    "transformers": ("transformers",),
    "datasets": ("datasets",),
    "accelerate": ("accelerate",),
    "peft": ("peft",),
    "jax": ("jax",),
    "ipywidgets": ("ipywidgets",),
    "ipykernel": ("ipykernel",),
    "IPython": ("ipython",),
    "hfxla_nb": ("hfxla_nb",),
}

ENVIRONMENTS = ("colab", "kaggle", "tpu-vm", "vscode", "jupyter", "terminal")


def _descends_from(sys_root: str, pid: int, ancestor: int) -> bool:
    """Whether `ancestor` is `pid`'s parent, or its parent's, ... (from `/proc/<pid>/stat`)."""
    for _ in range(64):  # deeper than any process tree of a launch
        try:
            with open(_under(sys_root, f"/proc/{pid}/stat")) as file:
                parent = int(file.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
        if parent == ancestor:
            return True
        if parent <= 1:
            return False
        pid = parent
    return False


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (Jupyter, Colab, Kaggle, VS Code), not a terminal."""
    return "ZMQInteractiveShell" in shell_class_names(sys.modules)


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


def colab_installed() -> bool:
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
    """The first installed one's version, read from the `Version:` header of its metadata:
    `importlib.metadata.version` parses the whole file as an e-mail message, 12x slower, and
    `detect()` runs before every launch."""
    for name in names:
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        text = distribution.read_text("METADATA") or distribution.read_text("PKG-INFO") or ""
        for line in text.splitlines():
            if line.startswith("Version:"):
                return line.partition(":")[2].strip()
            if not line:  # the headers end at the first empty line
                break
        return distribution.version
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


# -- TPU chips, device files and their holders --

# Tables from tpu-info (`tpu_info/device.py`) and torch_xla's `_internal/tpu.py`; HBM per chip
# from Google's TPU pages (v2: 16 GiB and v3: 32 GiB per chip, shared by its two cores).
GOOGLE_PCI_VENDOR = "0x1ae0"


@dataclass(frozen=True)
class TpuGeneration:
    """One TPU generation as the PCI bus shows it.

    Attributes:
        name: "v2", "v3", "v4", "v5e", "v5p", "v6e" or "7x".
        pci_device: PCI device id of its chips (vendor 0x1ae0).
        pci_subsystem: subsystem id, where the device id is shared (v2 and v3).
        cores_per_chip: XLA devices per chip (2 on v2/v3/7x, else 1).
        hbm_gib: HBM per chip, GiB (on v2, v3 and 7x shared by the chip's two XLA devices).
    """

    name: str
    pci_device: str
    pci_subsystem: str | None
    cores_per_chip: int
    hbm_gib: int

    @property
    def hbm_per_device_gib(self) -> float:
        """HBM one XLA device has: the chip's HBM over its cores (what a memory plan uses)."""
        return self.hbm_gib / self.cores_per_chip


TPU_GENERATIONS: tuple[TpuGeneration, ...] = (
    TpuGeneration("v2", "0x0027", "0x004e", 2, 16),
    TpuGeneration("v3", "0x0027", "0x004f", 2, 32),
    TpuGeneration("v4", "0x005e", None, 1, 32),
    TpuGeneration("v5e", "0x0063", None, 1, 16),
    TpuGeneration("v5p", "0x0062", None, 1, 95),
    TpuGeneration("v6e", "0x006f", None, 1, 32),
    TpuGeneration("7x", "0x0076", None, 2, 192),
)
_GENERATIONS_BY_NAME = {generation.name: generation for generation in TPU_GENERATIONS}
# TensorCores per chip in Google's slice names ("v4-8" is 4 chips; "v5litepod-8" is 8 chips).
CORES_IN_SLICE_NAME = {"v2": 2, "v3": 2, "v4": 2, "v5p": 2, "v5e": 1, "v6e": 1, "7x": 2}


def slice_name(generation: str, chips: int, cores_per_chip: int = 1) -> str:
    """Google's name of a host of `chips` chips: "v5e-8", "v4-8" (4 chips), "v3-8" (4 chips).
    A generation the names are not known for counts `cores_per_chip` per chip."""
    return f"{generation}-{chips * CORES_IN_SLICE_NAME.get(generation, cores_per_chip)}"


#: The TPU hosts people name (`plan_memory(hardware=...)`), by slice name: (generation, chips).
TPU_HOSTS: dict[str, tuple[str, int]] = {
    slice_name(generation, chips): (generation, chips)
    for generation, chips in (("v2", 4), ("v3", 4), ("v4", 4), ("v5e", 1), ("v5e", 4),
                              ("v5e", 8), ("v6e", 1), ("v6e", 8))
}


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
                f"{name}: {plural(self.chips, 'chip')} x {plural(self.cores_per_chip, 'core')}"
                f" = {plural(self.devices, 'device')}"
            )
            if self.hbm_per_chip_gib:
                text += f", {self.hbm_per_chip_gib} GiB HBM per chip"
            return text
        if self.kind == "gpu":
            return f"GPU: {plural(self.devices, 'device')}"
        text = f"CPU: {plural(self.devices, 'virtual XLA device')}"
        if self.host_cores:
            text += f" on {plural(self.host_cores, 'host core')}"
        if self.gpus:
            text += f" (also {plural(self.gpus, 'NVIDIA GPU')}, unused by XLA here)"
        return text



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
    """Processes other than `own_pid` and its descendants that hold TPU device files open.

    A forgotten kernel or a stale worker holding `/dev/accel*` or `/dev/vfio/*` makes the TPU
    unusable for everyone else; tpu-info finds them the same way, through `/proc/*/fd` links.
    This process's own workers (a warm session's, `launch.sessions`) are not others: a launch
    closes them before it forks, and `detect()` lists them as sessions.

    Returns:
        pid -> command line (from `/proc/<pid>/cmdline`, else its name), for every holder.
    """
    own_pid = os.getpid() if own_pid is None else own_pid
    holders: dict[int, str] = {}
    for proc in glob.glob(_under(sys_root, "/proc/[0-9]*")):
        pid = int(os.path.basename(proc))
        if pid == own_pid or _descends_from(sys_root, pid, own_pid):
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
                holders[pid] = _command(proc)
                break
    return holders


def _command(proc: str, limit: int = 80) -> str:
    """A process's command line (shortened), else its name, from `/proc/<pid>`."""
    try:
        with open(os.path.join(proc, "cmdline"), "rb") as file:
            words = [word.decode(errors="replace") for word in file.read().split(b"\0") if word]
    except OSError:
        words = []
    command = " ".join(words)
    if not command:
        return _read(os.path.join(proc, "comm")) or "?"
    return command if len(command) <= limit else command[:limit - 1] + "…"


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
    generation = _pci_generation(pci_chips, found_by)
    file_chips = _count_device_files(device_files, found_by)  # noted even beside PCI
    chips = len(pci_chips) or file_chips
    if not chips:
        return _without_tpu(environ, host_cores, gpus)
    generation_name = generation.name if generation else None
    if generation is None:
        accelerator_type = environ.get("TPU_ACCELERATOR_TYPE")
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
        kind="tpu", generation=generation_name, chips=chips, cores_per_chip=cores,
        devices=chips * cores, hbm_per_chip_gib=generation.hbm_gib if generation else None,
        found_by=found_by, host_cores=host_cores, gpus=gpus, holders=dict(holders or {}),
    )


def _pci_generation(pci_chips: list[tuple[str, str | None]],
                    found_by: list[str]) -> TpuGeneration | None:
    """The generation most of the PCI chips are (None when none is known); notes the scan in
    `found_by`."""
    if not pci_chips:
        return None
    names = [tpu_generation(device, subsystem) for device, subsystem in pci_chips]
    known = [g for g in names if g is not None]
    found_by.append(f"PCI {GOOGLE_PCI_VENDOR}:{pci_chips[0][0]} x{len(pci_chips)}")
    return max(set(known), key=known.count) if known else None


def _count_device_files(device_files: list[str], found_by: list[str]) -> int:
    """Chips the TPU device files count (/dev/accel* or /dev/vfio/*), noted in `found_by`."""
    accel = [path for path in device_files if path.startswith("/dev/accel")]
    vfio = [path for path in device_files if path.startswith("/dev/vfio/")]
    if accel:
        found_by.append(f"/dev/accel* x{len(accel)}")
    if vfio:
        found_by.append(f"/dev/vfio/* x{len(vfio)}")
    return max(len(accel), len(vfio))


def _without_tpu(environ: Mapping[str, str], host_cores: int | None, gpus: int) -> Accelerator:
    """A GPU where `PJRT_DEVICE` asks for CUDA and one exists; else XLA on the CPU."""
    pjrt = environ.get("PJRT_DEVICE", "").upper()
    if gpus and pjrt in ("CUDA", "GPU"):
        count = _positive_int(environ.get("GPU_NUM_DEVICES")) or gpus
        return Accelerator(kind="gpu", chips=gpus, devices=count,
                           found_by=[f"PJRT_DEVICE={pjrt}", "/dev/nvidia*"],
                           host_cores=host_cores, gpus=gpus)
    found_by = ["no TPU on the PCI bus or in /dev"]
    if "CPU_NUM_DEVICES" in environ:
        found_by.append(f"CPU_NUM_DEVICES={environ['CPU_NUM_DEVICES']}")
    return Accelerator(kind="cpu", devices=cpu_device_count(environ) or 1, found_by=found_by,
                       host_cores=host_cores, gpus=gpus)


@dataclass(frozen=True)
class HostScan:
    """What one look at the host's files found (the facts `accelerator_from_facts` decides
    from, besides the environment variables)."""

    pci_chips: list[tuple[str, str | None]]
    device_files: list[str]
    holders: dict[int, str]
    gpus: int


def scan_host(sys_root: str = "/") -> HostScan:
    """Scan `sys_root`'s PCI bus, TPU device files, their holders and GPUs, once."""
    pci_chips = scan_pci(sys_root)
    device_files = scan_device_files(sys_root)
    # Scanning every process's fds is only worth it where there is a TPU to hold.
    holders = find_device_holders(sys_root) if device_files else {}
    return HostScan(pci_chips, device_files, holders, scan_gpus(sys_root))


class _Call:
    """What one `fine_tune` / `notebook_launcher` / `predict` call has worked out so far."""

    def __init__(self) -> None:
        self.pid = os.getpid()  # a forked worker is not the call: it inherits no answers
        self.answers: dict[Hashable, Any] = {}


_CALL: ContextVar[_Call | None] = ContextVar("hfxla_nb_call", default=None)


def _current_call() -> _Call | None:
    call = _CALL.get()
    return call if call is not None and call.pid == os.getpid() else None


@contextmanager
def one_call() -> Iterator[None]:
    """Within it, each `for_this_call` answer is worked out once: the host is scanned once
    per `fine_tune`, `notebook_launcher` or `predict` call, however many of its steps ask.

    Nested, the outer call's answers are kept. They are dropped when the outermost call
    returns: the next call scans again, since the chips, or who holds them, may have changed
    between two cells.
    """
    if _current_call() is not None:
        yield
        return
    token = _CALL.set(_Call())
    try:
        yield
    finally:
        _CALL.reset(token)


def for_this_call(key: Hashable, compute: Callable[[], Any]) -> Any:
    """`compute()`, worked out once within `one_call()` (an exception is not kept: it ends
    the call anyway); outside one, every time."""
    call = _current_call()
    if call is None:
        return compute()
    if key not in call.answers:
        call.answers[key] = compute()
    return call.answers[key]


def detect_accelerator(
    sys_root: str = "/", environ: Mapping[str, str] | None = None
) -> Accelerator:
    """Scan `sys_root` for TPU chips, device files, holders and GPUs; never starts the runtime.

    Within `one_call()` the host is scanned once; the environment is read every time.
    """
    environ = os.environ if environ is None else environ
    facts = for_this_call(("scan_host", sys_root), lambda: scan_host(sys_root))
    return accelerator_from_facts(
        facts.pci_chips,
        facts.device_files,
        environ,
        host_cores=os.cpu_count(),
        gpus=facts.gpus,
        holders=facts.holders,
    )


def _positive_int(value: str | None) -> int | None:
    try:
        number = int(value or "")
    except ValueError:
        return None
    return number if number > 0 else None


# -- the host and the launch plan, in words --

_HOSTED = {"colab": "Colab", "kaggle": "Kaggle"}
# Each `detect_environment()` word as a person writes it (a host without a TPU is named so).
_ENVIRONMENT_NAMES = {**_HOSTED, "tpu-vm": "TPU VM", "vscode": "VS Code", "jupyter": "Jupyter",
                      "terminal": "Terminal"}


def host_name(accelerator: Accelerator, environment: str) -> str:
    """"Colab TPU v5e-1", "Kaggle TPU v5e-8", "TPU VM v4-8", "Jupyter, no TPU"."""
    where = _HOSTED.get(environment)
    if accelerator.kind != "tpu":
        return f"{_ENVIRONMENT_NAMES.get(environment, environment)}, no TPU"
    name = slice_name(accelerator.generation or "(generation unknown)", accelerator.chips,
                      accelerator.cores_per_chip)
    return f"{where} TPU {name}" if where else f"TPU VM {name}"


def launch_plan(accelerator: Accelerator, environment: str) -> str:
    """What `notebook_launcher` and `fine_tune` will do on this host."""
    devices = accelerator.devices
    if accelerator.kind != "tpu":
        return (f"XLA on the CPU with {plural(devices, 'virtual device')} (num_processes or "
                "hx.configure(cores=N) sets more), to rehearse: strategy='spmd' and fine_tune "
                "shard over them for real; 'replicated' runs ranks as threads without "
                "collectives")
    if devices == 1:
        plan = ("one chip, one XLA device: notebook_launcher runs the function in one "
                "supervised process (output, errors, live panels, nothing left running); "
                "fine_tune trains on that device")
    elif accelerator.cores_per_chip == 1:
        processes = plural(accelerator.chips, "process", "processes")
        plan = (f"{plural(accelerator.chips, 'chip')}, one process per chip: "
                f"notebook_launcher (replicated) starts {processes}; strategy='spmd' and "
                f"fine_tune shard over all {devices} devices in one process")
    else:
        plan = (f"{plural(accelerator.chips, 'chip')} x {accelerator.cores_per_chip} cores: "
                f"notebook_launcher (replicated) starts one process per chip with one rank "
                f"thread per core ({plural(devices, 'rank')}); strategy='spmd' and fine_tune "
                f"shard over all {devices} devices in one process")
    if environment == "kaggle":
        plan += "; the workers drop Kaggle's TPU_PROCESS_ADDRESSES and CLOUD_TPU_TASK_ID"
    return plan
