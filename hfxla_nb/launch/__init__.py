"""The launch layer: pre-flight checks, the forked workers, and the notebook side that watches
them (docs/architecture.md).

Public names are resolved lazily (PEP 562), like the package's own: importing a worker module
(`hfxla_nb.launch.worker`) runs this file, and must not import the launcher, which draws.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module of this package that defines it (imported on first use)
_EXPORTS = {
    "LaunchError": "record",
    "LaunchRecord": "record",
    "LaunchRefusedError": "preflight",
    "RankRecord": "record",
    "RecordKeeper": "record",
    "group_processes": "processes",
    "last_launch": "launcher",
    "notebook_launcher": "launcher",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module_name}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
