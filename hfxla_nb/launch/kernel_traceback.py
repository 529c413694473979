"""The cell's traceback of a `LaunchError` ends at the user's call, not in the launcher.

IPython shows every frame of a traceback, the last one always (it ignores
`__tracebackhide__` there), so a failed launch showed `launcher.py:NNN, in
notebook_launcher(function, args, ...)` between the user's cell and the message, which
already holds the remote traceback. In IPython, `LaunchError` gets a custom exception
handler that shows the same traceback without hfxla_nb's frames; nothing is changed where
another handler is already set, or outside IPython.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hide_launcher_frames(error_class: type[BaseException]) -> None:
    """Have IPython show `error_class`'s tracebacks without hfxla_nb's frames (installed
    when the first `LaunchError` is made: `launch.errors` imports torch)."""
    shell_module = sys.modules.get("IPython.core.interactiveshell")
    shell = getattr(getattr(shell_module, "InteractiveShell", None), "_instance", None)
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return
    current = tuple(getattr(shell, "custom_exceptions", ()) or ())
    if current == (error_class,):
        return
    if current:
        return  # the user's (or another library's) handler stays
    shell.set_custom_exc((error_class,), _show_without_our_frames)


def _show_without_our_frames(shell: Any, etype: type, value: BaseException,
                             tb: types.TracebackType | None,
                             tb_offset: int | None = None) -> list[str]:
    value.__traceback__ = without_package_frames(tb)
    shell.showtraceback((etype, value, value.__traceback__), tb_offset=tb_offset,
                        running_compiled_code=True)
    return []


def without_package_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The same traceback without the frames of hfxla_nb's own files (outermost first)."""
    kept = []
    while tb is not None:
        if not is_package_file(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for entry in reversed(kept):
        rebuilt = types.TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def is_package_file(path: str) -> bool:
    """Whether `path` is one of hfxla_nb's own files."""
    return os.path.abspath(path).startswith(_PACKAGE + os.sep)
