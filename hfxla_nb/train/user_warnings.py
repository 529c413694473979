"""Warnings attributed to the user's call, not to hfxla_nb's internals.

Python shows a warning at the frame `stacklevel` names; a fixed `stacklevel` inside our
layers points at whichever of our functions happens to sit there (`prepare.py:46`). Here the
level is counted to the first frame outside Python, installed packages and hfxla_nb (the
notebook cell, the script, the user's own module): the line the user can change.
"""

from __future__ import annotations

import sys
import warnings

from ..observe.user_frames import is_library


def user_stacklevel(skip: int = 0) -> int:
    """The `stacklevel` for a `warnings.warn` made `skip` frames above the caller of this
    function that points at the first frame of the user's code (the outermost frame when the
    whole stack is library code)."""
    frame, level = sys._getframe(1 + skip), 1
    while frame.f_back is not None and is_library(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """`warnings.warn(message, category)`, shown at the user's line that led here."""
    # +1 for this function's own frame, between warnings.warn and its caller.
    warnings.warn(message, category, stacklevel=user_stacklevel(skip=1) + 1)
