"""The launch layer: pre-flight checks, the forked workers, and the notebook side that watches
them (docs/architecture.md).

Public names are resolved lazily (PEP 562), like the package's own: importing a worker module
(`hfxla_nb.launch.worker`) runs this file, and must not import the launcher, which draws.
`LaunchError` is in `errors`, the one module of the package that imports torch.
"""

from __future__ import annotations

from .._lazy import lazy_exports

# public name -> module of this package that defines it (imported on first use)
_EXPORTS = {
    "LaunchError": "errors",
    "LaunchOptions": "launcher",
    "LaunchRecord": "supervision",
    "LaunchRefusedError": "preflight",
    "RankRecord": "supervision",
    "group_processes": "processes",
    "last_launch": "launcher",
    "launch": "launcher",
    "notebook_launcher": "launcher",
    "Session": "sessions",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
