"""Public names of a package resolved on first use (PEP 562): the one lazy-export mechanism.

Importing a worker module (`hfxla_nb.launch.worker`, `hfxla_nb.train.worker.loop`) runs its
package's `__init__` first: it must not import the launcher or anything that draws, so a package's
`__init__` names its public objects here instead of importing them. `hfxla_nb` itself does the
same, so `import hfxla_nb` imports none of torch, torch_xla or transformers.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str],
                 modules: Mapping[str, str] | None = None,
                 on_first_use: Callable[[], None] | None = None,
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` for `package`.

    Args:
        package: the package's `__name__`.
        exports: public name -> the package's module that defines it.
        modules: public module name -> the package's module it is (`hx.patches` is
            `hfxla_nb.patches`).
        on_first_use: called after each public name of `exports` is resolved (`hfxla_nb`
            registers its panels with IPython then); not for a module of `modules`, which
            worker code imports (`from hfxla_nb import patches`) and which must not draw.

    Returns:
        `__getattr__` imports the module of a public name on its first use and keeps the
        object in the package (later lookups are plain attributes); any other name raises
        `AttributeError`. `__dir__` lists the package's attributes and every public name.
    """
    modules = dict(modules or {})

    def __getattr__(name: str) -> Any:
        if name in modules:
            value = importlib.import_module(f"{package}.{modules[name]}")
        elif name in exports:
            value = getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        if on_first_use is not None and name in exports:
            on_first_use()
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports) | set(modules))

    return __getattr__, __dir__
