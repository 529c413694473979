"""Which frames of a traceback are the user's: their notebook, script or own modules, not
Python's, an installed package's or hfxla_nb's."""

from __future__ import annotations

import os
import re
import site
import sysconfig

from .compile_records import Frame


def _library_roots() -> tuple[str, ...]:
    roots = set()
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(name)
        if path:
            roots.add(os.path.realpath(path))
    try:
        roots.update(os.path.realpath(path) for path in site.getsitepackages())
    except AttributeError:  # pragma: no cover - virtualenvs without it
        pass
    roots.add(os.path.realpath(os.path.dirname(os.path.dirname(__file__))))  # hfxla_nb itself
    return tuple(sorted(roots, key=len, reverse=True))


_LIBRARY_ROOTS = _library_roots()
_INTERNAL = ("torch_xla", "torch")
# hfxla_nb's own thin wrapper of torch_xla (the package `_xla`) reports cuts, like torch_xla.
_XLA_WRAPPER = os.path.realpath(os.path.join(os.path.dirname(os.path.dirname(__file__)), "_xla"))


def is_library(path: str) -> bool:
    """Whether a frame's file belongs to Python, an installed package or hfxla_nb (not to the
    user's notebook, script or own modules)."""
    if path.startswith("<frozen") or "/site-packages/" in path or "/dist-packages/" in path:
        return True
    if path.startswith("<"):  # <ipython-input-...>, <string>: the user's code
        return False
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root + os.sep) for root in _LIBRARY_ROOTS)


def _is_internal(path: str) -> bool:
    """torch's and torch_xla's own frames (where the cut is reported, not made)."""
    if "_xla" in path and os.path.realpath(path).startswith(_XLA_WRAPPER + os.sep):
        return True
    parts = path.replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            index = parts.index(marker)
            return len(parts) > index + 1 and parts[index + 1] in _INTERNAL
    return False


def locate(frames: list[Frame]) -> tuple[Frame | None, Frame | None]:
    """(first frame in the user's code, innermost library frame when it is another one)."""
    where = next((frame for frame in frames if not is_library(frame.file)), None)
    via = next((frame for frame in frames if not _is_internal(frame.file)), None)
    return where, (via if via is not None and via != where else None)


_FILE_LINE = re.compile(r'^(\s*)File "([^"]+)", line (\d+)', re.MULTILINE)
_IPYTHON7_CELL = re.compile(r"<ipython-input-(\d+)-[0-9a-f]+>")


def name_cells(traceback: str, cells: dict[str, int]) -> str:
    """A formatted traceback whose notebook-cell frames are named as IPython names them:
    `File "/tmp/ipykernel_7/2093.py", line 12, in train` becomes `Cell In[5], line 12, in
    train`. `cells` maps IPython's cell file names to execution counts
    (`launch.script_mode.cell_numbers`); IPython 7's `<ipython-input-5-...>` names carry it."""

    def rename(match: re.Match) -> str:
        indent, path, line = match.groups()
        count = cells.get(path)
        if count is None:
            ipython7 = _IPYTHON7_CELL.fullmatch(path)
            count = int(ipython7.group(1)) if ipython7 else None
        return match.group(0) if count is None else f"{indent}Cell In[{count}], line {line}"

    return _FILE_LINE.sub(rename, traceback)
