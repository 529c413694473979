"""The runtime layer: what hardware and environment this is, and how torch_xla is set up.

Nothing here starts the XLA runtime or imports torch, torch_xla or transformers
(docs/architecture.md, "The rules that protect users"). Public names are resolved lazily
(PEP 562), like the package's own: a worker that needs `runtime.compile_cache` does not load
the hardware scans.
"""

from __future__ import annotations

from .._lazy import lazy_exports

# The function `configure` has its module's name: once anything imports the module
# `runtime.configure`, Python sets this package's attribute `configure` to that module, and a
# lazy lookup would never run. Imported here, the function keeps the name (stdlib imports only).
from .configure import configure as configure

# public name -> module of this package that defines it (imported on first use)
_EXPORTS = {
    **dict.fromkeys(("DEVICES", "RuntimeAlreadyStartedError", "TpuNotFoundError", "configure"),
                    "configure"),  # `configure` itself is imported above
    **dict.fromkeys(("ENVIRONMENTS", "HIDDEN", "detect_environment", "is_secret_name",
                     "package_versions", "redact_environment", "relevant_environment",
                     "shell_class_names"), "environment"),
    **dict.fromkeys(("GOOGLE_PCI_VENDOR", "TPU_GENERATIONS", "Accelerator", "TpuGeneration",
                     "accelerator_from_facts", "cpu_device_count", "detect_accelerator",
                     "find_device_holders", "generation_from_accelerator_type",
                     "scan_device_files", "scan_gpus", "scan_pci", "tpu_generation",
                     "HostScan", "scan_host", "one_call", "for_this_call"),
                    "environment"),
    **dict.fromkeys(("RuntimeInfo", "detect"), "info"),
    **dict.fromkeys(("CHECKS", "Problem", "find_problems"), "info"),
    **dict.fromkeys(("StoppedLaunch",), "info"),
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
