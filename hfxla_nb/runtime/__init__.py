"""The runtime layer: what hardware and environment this is, and how torch_xla is set up.

Nothing here starts the XLA runtime or imports torch, torch_xla or transformers
(docs/architecture.md).
"""

from .configure import DEVICES, RuntimeAlreadyStartedError, TpuNotFoundError, configure
from .environment import (
    ENVIRONMENTS,
    HIDDEN,
    detect_environment,
    is_secret_name,
    package_versions,
    redact_environment,
    relevant_environment,
    shell_class_names,
)
from .hardware import (
    GOOGLE_PCI_VENDOR,
    TPU_GENERATIONS,
    Accelerator,
    TpuGeneration,
    accelerator_from_facts,
    cpu_device_count,
    detect_accelerator,
    find_device_holders,
    generation_from_accelerator_type,
    scan_device_files,
    scan_gpus,
    scan_pci,
    tpu_generation,
)
from .info import RuntimeInfo, detect
from .problems import CHECKS, Problem, find_problems

__all__ = [
    "CHECKS", "DEVICES", "ENVIRONMENTS", "GOOGLE_PCI_VENDOR", "HIDDEN", "TPU_GENERATIONS",
    "Accelerator", "Problem", "RuntimeAlreadyStartedError", "RuntimeInfo", "TpuGeneration",
    "TpuNotFoundError", "accelerator_from_facts", "configure", "cpu_device_count", "detect",
    "detect_accelerator", "detect_environment", "find_device_holders", "find_problems",
    "generation_from_accelerator_type", "is_secret_name", "package_versions",
    "redact_environment", "relevant_environment", "scan_device_files", "scan_gpus", "scan_pci",
    "shell_class_names", "tpu_generation",
]
