"""Where this runs (Colab, Kaggle, a TPU VM, Jupyter...), package versions and the variables
that matter, with secrets hidden. Pure functions of the environment and `sys.modules`."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
from collections.abc import Mapping
from typing import Any

from .._version import __version__

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


# ---------------------------------------------------------------------------------------------
# Problems: a pure function of the gathered facts
# ---------------------------------------------------------------------------------------------
