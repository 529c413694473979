"""The first launch in a kernel as quick as the next ones: what a launch imports in the kernel
(the launcher, its records and panels, ipywidgets) is imported while the kernel is idle after
the cell that imported hfxla_nb, instead of by the first `notebook_launcher` call.

`import hfxla_nb` itself stays cheap (public names are resolved lazily). In a Jupyter kernel
it schedules `warm_up` on the kernel's event loop: the callback runs in the kernel's main
thread once the importing cell is done (a thread would import while a launch may fork, and a
forked child can inherit a held import lock). It imports modules only: no process, no XLA
runtime, no torch (a launch imports none of them in the kernel). A cell run right after the
import cell waits for it, once (about what the first launch would have spent on it).
"""

from __future__ import annotations

import asyncio
import importlib
import sys

# What the first launch would otherwise import in the kernel, heaviest last (ipywidgets:
# most of it; measured by bench/launch_latency.py).
MODULES = (
    "hfxla_nb.launch.launcher",
    "hfxla_nb.launch.worker",
    "hfxla_nb.ui.modes",
    "hfxla_nb.ui.widgets",
    "hfxla_nb.ui.formatters",
    "ipywidgets",
)
_scheduled = False


def schedule() -> bool:
    """In a running Jupyter kernel, run `warm_up` once the current cell is done (once per
    process); whether it was scheduled (False outside a kernel's cell)."""
    global _scheduled
    if _scheduled or "ipykernel" not in sys.modules:
        return False
    try:
        loop = asyncio.get_running_loop()  # the kernel's, while a cell runs
    except RuntimeError:
        return False
    loop.call_soon(warm_up)
    _scheduled = True
    return True


def warm_up() -> None:
    """Import `MODULES` (one that fails to import is left to the launch to report)."""
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - a warm-up must never break the kernel
            continue
