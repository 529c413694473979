"""Warnings of libraries the user did not call, folded into one line per kind.

A Python warning whose reported location (the `filename` handed to `warnings.showwarning`)
is in site-packages, dist-packages or the standard library comes from a library's own code
(transformers' `is_gradient_checkpointing` FutureWarning, torch's "Full backward hook"
UserWarning): the user cannot act on where it points. In a worker, `install` sends such a
warning to the notebook as a `LibraryWarning` event instead of printing it; a warning located
in the user's code (a notebook cell, a file of theirs) is printed as Python prints it.

On the notebook side every one is kept on the launch record (`hx.last_launch().warnings`)
and `folded_lines` says each kind (package, category, message) once, with its count.
"""

from __future__ import annotations

import sys
import sysconfig
import warnings
from collections.abc import Callable, Sequence
from pathlib import PurePath
from typing import TextIO

from ..events import Channel, LibraryWarning, worker_rank

# Folders whose files are libraries' code, not the user's.
LIBRARY_FOLDERS = ("site-packages", "dist-packages")
# Characters of a warning's message shown on its folded line.
MESSAGE_WIDTH = 100
# The package a standard library location is named as.
STANDARD_LIBRARY = "Python"


def _standard_library() -> str:
    return str(PurePath(sysconfig.get_paths()["stdlib"]))


def library_package(filename: str) -> str | None:
    """The library a warning's location belongs to ("transformers"; `STANDARD_LIBRARY` for the
    standard library), or None when it is the user's code (a cell, any other file)."""
    parts = PurePath(filename).parts
    for index, part in enumerate(parts):
        if part in LIBRARY_FOLDERS:
            top = parts[index + 1] if index + 1 < len(parts) else part
            # `six.py` is the package `six`; `torch/nn/modules/module.py` is `torch`.
            return top[:-3] if top.endswith(".py") else top
    stdlib = _standard_library()
    if filename.startswith(stdlib + "/"):
        return STANDARD_LIBRARY
    return None


def install(channel: Channel) -> None:
    """Send this process's library warnings to the notebook (in a worker; workers never draw).

    Python's filters still decide which warnings are issued at all; only where an issued one
    goes changes. A warning of the user's own code goes to Python's own `showwarning`."""
    shown = warnings.showwarning
    if getattr(shown, "_hfxla_nb", False):
        return  # already installed in this process (a forked child inherits it)

    def showwarning(message: Warning | str, category: type[Warning], filename: str,
                    lineno: int, file: TextIO | None = None, line: str | None = None) -> None:
        package = library_package(str(filename))
        if package is None or file is not None:  # the user's, or written to a file on purpose
            shown(message, category, filename, lineno, file, line)
            return
        channel.send(LibraryWarning(rank=worker_rank(), category=category.__name__,
                                    message=str(message), filename=str(filename),
                                    lineno=int(lineno), package=package))

    showwarning._hfxla_nb = True  # type: ignore[attr-defined]
    warnings.showwarning = showwarning


def first_line(message: str) -> str:
    """The message's first line, cut at a space to `MESSAGE_WIDTH` characters (a cell line
    that the browser need not wrap)."""
    lines = message.strip().splitlines()
    text = lines[0] if lines else ""
    if len(text) <= MESSAGE_WIDTH and len(lines) <= 1:
        return text
    cut = text[:MESSAGE_WIDTH].rsplit(" ", 1)[0] if len(text) > MESSAGE_WIDTH else text
    return cut + " …"


# ANSI faint: a folded library warning is muted.
MUTED, PLAIN = "\x1b[2m", "\x1b[0m"


def folded_lines(caught: Sequence[LibraryWarning],
                 shown: Callable[[int | None], bool] = lambda rank: True) -> list[str]:
    """One line per kind of library warning (package, category, message), in the order each
    kind first came, with how many times it came from the ranks `shown` lets through:
    "transformers FutureWarning ×2: `x` is deprecated … (hx.last_launch().warnings has them
    all)"."""
    counts: dict[tuple[str, str, str], int] = {}
    for warning in caught:
        if shown(warning.rank):
            key = (warning.package, warning.category, warning.message)
            counts[key] = counts.get(key, 0) + 1
    return [f"{package} {category} ×{count}: {first_line(message)} "
            "(hx.last_launch().warnings has them all)"
            for (package, category, message), count in counts.items()]


def print_folded(caught: Sequence[LibraryWarning],
                 shown: Callable[[int | None], bool] = lambda rank: True) -> None:
    """Write `folded_lines` to stderr, muted (ANSI faint): the user's own output stays as it
    is, the libraries' is one quiet line per kind. On one host and on a cluster alike."""
    lines = folded_lines(caught, shown)
    if lines:
        sys.stderr.write("".join(f"{MUTED}{line}{PLAIN}\n" for line in lines))
        sys.stderr.flush()
