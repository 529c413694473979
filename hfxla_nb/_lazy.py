"""Public names of a subpackage resolved on first use (PEP 562).

Importing a worker module (`hfxla_nb.launch.worker`, `hfxla_nb.train.worker.loop`) runs its
package's `__init__` first: it must not import the launcher or anything that draws, so a package's
`__init__` names its public objects here instead of importing them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` for `package`.

    Args:
        package: the package's `__name__`.
        exports: public name -> the package's module that defines it.

    Returns:
        `__getattr__` imports the module of a public name on its first use and keeps the
        object in the package (later lookups are plain attributes); any other name raises
        `AttributeError`. `__dir__` lists the package's attributes and every public name.
    """

    def __getattr__(name: str) -> Any:
        module_name = exports.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module_name}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
