"""accelerate's `PartialState` in a process of `strategy="debug"`: the gloo world, not XLA's.

accelerate picks its XLA backend whenever torch_xla can be imported
(`PartialState._prepare_backend` asks `is_torch_xla_available()` before anything else), and
then takes its indexes from torch_xla: each debug process is an XLA:CPU client of its own, so
every rank said "process 0 of 1". Neither variable helps: `ACCELERATE_USE_CPU` is read by
`AcceleratorState` only (a bare `PartialState()` ignores it), and even with `cpu=True` the
XLA check comes first; `USE_TORCH_XLA=0` is read once, when accelerate is imported (in the
kernel, before the fork).

So each debug process, once its gloo group is up, makes accelerate's state itself, as
accelerate's own CPU launcher (`debug_launcher`) would have it: `PartialState(cpu=True)`
with accelerate's `is_torch_xla_available` answering False while it is made (patched in
`accelerate.state` of this process only, and restored), so it finds the existing gloo group
(`MULTI_CPU`, rank and world from torch.distributed, `LOCAL_RANK`). The state is shared by
every later `PartialState()` / `Accelerator()` of the process, and `ACCELERATE_USE_CPU=yes`
keeps `Accelerator()` on the CPU device that state has. Where the function imports accelerate
only itself, this happens when `accelerate.state` is first imported (an import hook), so a
launch that never uses accelerate pays nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

MODULE = "accelerate.state"


def gloo_world_for_accelerate() -> None:
    """In a process of `strategy="debug"`, after its gloo process group is initialized:
    accelerate's `PartialState` (and `Accelerator`) report that group's rank and world, now
    if accelerate is imported, else when it first is."""
    os.environ.setdefault("ACCELERATE_USE_CPU", "yes")
    module = sys.modules.get(MODULE)
    if module is not None:
        _make_state(module)
    elif importlib.util.find_spec("accelerate") is not None:
        sys.meta_path.insert(0, _AfterImport(MODULE, _make_state))


def _make_state(module: ModuleType) -> None:
    """`PartialState(cpu=True)` over the existing gloo group, unless a state exists."""
    try:
        state_class = module.PartialState
        if state_class._shared_state:  # made already: leave it as it is
            return
        original = module.is_torch_xla_available
        module.is_torch_xla_available = _no_xla
        try:
            with warnings.catch_warnings():
                # "OMP_NUM_THREADS/MKL_NUM_THREADS unset, we set it at N": once per rank
                warnings.filterwarnings("ignore", message="OMP_NUM_THREADS")
                state_class(cpu=True)
        finally:
            module.is_torch_xla_available = original
    except Exception as error:  # noqa: BLE001 - accelerate's own state stays as it would be
        warnings.warn(f"hfxla_nb could not give accelerate the debug launch's gloo world: "
                      f"{error!r}", RuntimeWarning, stacklevel=2)


def _no_xla(*_: Any, **__: Any) -> bool:
    return False


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` once `name` is imported (then steps out of the import system)."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module
        then = self.then

        def exec_then(module: ModuleType) -> None:
            exec_module(module)
            then(module)

        loader.exec_module = exec_then  # this module's loader instance only
        return spec
