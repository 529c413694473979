"""Which renderer to use, chosen like `tqdm.auto`: widgets in a notebook, else console."""

from __future__ import annotations

import sys
import warnings

from .._choices import PROGRESS_MODES
from ..runtime.environment import shell_class_names

MODES = PROGRESS_MODES
MIN_IPYWIDGETS = (7, 6)


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (Jupyter, Colab, Kaggle, VS Code), not a terminal."""
    return "ZMQInteractiveShell" in shell_class_names(sys.modules)


def widgets_problem() -> str | None:
    """Why ipywidgets cannot be used (not installed, too old), or None when it can."""
    try:
        import ipywidgets
    except ImportError:
        return "ipywidgets is not installed (pip install 'ipywidgets>=7.6')"
    version = getattr(ipywidgets, "__version__", "0")
    try:
        parts = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return None
    if parts < MIN_IPYWIDGETS:
        return f"ipywidgets {version} is too old (need 7.6 or later)"
    return None


def select_mode(mode: str | bool | None = "auto", *, notebook: bool | None = None) -> str:
    """Resolve `mode` to "widgets", "html", "console" or "none".

    Args:
        mode: "auto", "widgets", "html", "console", "none"; True means "auto", False and None
            mean "none".
        notebook: whether this is a notebook kernel (default: detect).

    Raises:
        ImportError: `mode="widgets"` and ipywidgets is missing or too old.
        ValueError: an unknown mode.
    """
    if mode is True:
        mode = "auto"
    if mode is False or mode is None:
        mode = "none"
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: use one of {', '.join(MODES)}")
    if mode == "widgets":
        problem = widgets_problem()
        if problem is not None:
            raise ImportError(f"mode='widgets' needs ipywidgets: {problem}. Or use mode='html'.")
        return mode
    if mode != "auto":
        return mode
    if not (in_notebook() if notebook is None else notebook):
        return "console"
    problem = widgets_problem()
    if problem is not None:
        warnings.warn(f"{problem}; showing HTML panels instead of widgets.", stacklevel=3)
        return "html"
    return "widgets"
