"""Importing torch_xla, and what can be asked before the runtime starts.

Nothing here starts the XLA runtime: these checks may run in the notebook kernel before a
fork. `require_torch_xla` is how every other module of the seam imports torch_xla.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from types import ModuleType

# The private names whose absence was said in this process (`degraded`): once each.
_said_missing: set[str] = set()


def degraded(name: str, instead: str) -> None:
    """Say once per process that the installed torch_xla lacks the private `name` (of
    `PRIVATE_NAMES`) and what hfxla_nb does `instead` (a public fallback)."""
    if name in _said_missing:
        return
    _said_missing.add(name)
    version = getattr(sys.modules.get("torch_xla"), "__version__", "of this version")
    warnings.warn(f"torch_xla {version} has no {name} (hfxla_nb was checked on torch_xla 2.8 "
                  f"and 2.9): {instead}.", RuntimeWarning, stacklevel=3)


class XlaUnavailableError(ImportError):
    """Raised when an operation needs torch_xla and it is not installed."""


def require_torch_xla() -> ModuleType:
    """The `torch_xla` module, imported (never starts the runtime).

    Raises:
        XlaUnavailableError: when torch_xla is not installed (the message says how to get it).
    """
    try:
        import torch_xla  # noqa: F401
    except ImportError as error:  # pragma: no cover - depends on the environment
        if is_installed():
            # Installed but broken: almost always a torch of another minor version, whose
            # symbols the torch_xla binary does not find ("undefined symbol: _ZN5torch...").
            raise XlaUnavailableError(
                f"torch_xla is installed but cannot be imported ({error}). torch_xla only "
                "works with the torch release it was built for (the same minor version): "
                "`hx.detect()` or %xla_info names the pip line that makes them match."
            ) from error
        raise XlaUnavailableError(
            "torch_xla is not installed. A TPU VM or Colab/Kaggle TPU runtime has it; "
            "elsewhere run `pip install torch_xla` with the same minor version as torch "
            "(for example torch==2.9.0 torch_xla==2.9.0)."
        ) from error
    return sys.modules["torch_xla"]


def is_installed() -> bool:
    """Whether torch_xla can be imported, without importing it."""
    return importlib.util.find_spec("torch_xla") is not None


def is_imported() -> bool:
    """Whether torch_xla was already imported in this process."""
    return "torch_xla" in sys.modules


def runtime_is_initialized() -> bool:
    """Whether this process has started the XLA (PJRT) runtime.

    A process that has started it must not fork workers that use XLA: they hang forever. If
    torch_xla was never imported, the runtime cannot have started, so nothing is imported here.
    """
    if not is_imported():
        return False
    xlac = getattr(sys.modules["torch_xla"], "_XLAC", None)
    check = getattr(xlac, "_xla_runtime_is_initialized", None)
    if check is None:
        degraded("torch_xla._XLAC._xla_runtime_is_initialized", "hfxla_nb cannot tell whether "
                 "this process started the XLA runtime, and takes it as not started; keep "
                 "every device use inside the launched function")
        return False
    return bool(check())


def computation_cache_initialized() -> bool:
    """Whether torch_xla's computation cache exists (created at the first compilation; the
    persistent cache must be set up before it)."""
    if not is_imported():
        return False
    xlac = getattr(sys.modules["torch_xla"], "_XLAC", None)
    check = getattr(xlac, "_xla_computation_cache_is_initialized", None)
    if check is None:
        degraded("torch_xla._XLAC._xla_computation_cache_is_initialized", "the persistent "
                 "compile cache is set up without checking that no graph was compiled before")
        return False
    return bool(check())


def is_spmd() -> bool:
    """Whether SPMD mode is on in this process (safe before the runtime starts)."""
    if not is_imported():
        return False
    import torch_xla.runtime as xr

    return bool(xr.is_spmd())


def device_type() -> str | None:
    """The PJRT device type ("TPU", "CPU", ...) if torch_xla is imported, else None."""
    if not is_imported():
        return None
    import torch_xla.runtime as xr

    try:
        return str(xr.device_type())
    except Exception:  # noqa: BLE001 - unknown PJRT_DEVICE
        return None


def is_xla_tensor(value: object) -> bool:
    """Whether `value` is a torch tensor that lives on an XLA device (no import if unused)."""
    device = getattr(value, "device", None)
    return getattr(device, "type", None) == "xla"


def compiler_flags() -> dict[str, str]:
    """XLA_FLAGS and LIBTPU_INIT_ARGS as torch_xla leaves them (its import adds defaults)."""
    require_torch_xla()
    import os

    return {name: os.environ.get(name, "") for name in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")}
