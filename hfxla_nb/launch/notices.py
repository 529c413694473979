"""What the notebook side shows in the cell before it forks, besides the launch panel.

The train layer never renders (pyproject's import-linter contracts); like the launch panel,
its other displays go through this layer to `ui`, with the same `progress=` mode.
"""

from __future__ import annotations

from typing import Any


def show_memory_plan(plan: dict[str, Any] | None, progress: str | bool = "auto") -> Any:
    """Show a fine-tune's memory plan (plain data) in the cell, drawn like the launch panel.

    Args:
        plan: `dataclasses.asdict(MemoryPlan)`, or None (nothing is shown).
        progress: the launch's `progress=` mode.

    Returns:
        An object with `close()` to call once the launch ended (a live widget becomes static
        HTML), or None when nothing was drawn.
    """
    from ..ui.plan_panel import show_memory_plan as show

    return show(plan, progress)
