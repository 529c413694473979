"""What the notebook side shows in the cell before it forks, besides the launch panel.

The train layer never renders (pyproject's import-linter contracts); like the launch panel,
its other displays go through this layer to `ui`, with the same `progress=` mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # drawn in ui; imported there only when something is shown
    from ..ui.plan_panel import Plan


def show_memory_plan(plan: Plan | None, progress: str | bool = "auto") -> Any:
    """Show a fine-tune's memory plan (plain data) in the cell, drawn like the launch panel.

    Args:
        plan: the `MemoryPlan` the run was checked with, or None (nothing is shown).
        progress: the launch's `progress=` mode.

    Returns:
        An object with `close()` to call once the launch ended (a live widget becomes static
        HTML), or None when nothing was drawn.
    """
    from ..ui.plan_panel import show_memory_plan as show

    return show(plan, progress)
