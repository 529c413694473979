"""The memory plan of a fine-tune, shown in the cell before the fork (one line).

`fine_tune` checks its plan in the kernel (`train.memory_plan`); the launch layer hands the
plan, as plain data, to `show_memory_plan`, which draws it in the mode the launch panel uses:
an ipywidgets `HTML` widget (replaced by static HTML when the launch ends, like the launch
panel, so a saved notebook holds no widget view), an HTML output, or a printed line. The words
are `finetune_panel.memory_row`'s plan part, so the cell and the result say the same.
"""

from __future__ import annotations

from html import escape
from typing import Any

from .html_display import HtmlBlock
from .units import size

GIB = 2**30
LABEL = "memory"


def _gib(value: float) -> str:
    return size(round(value * GIB))


def plan_text(plan: dict[str, Any]) -> str:
    """`plan 1.2 GiB per device (parameters ..., gradients ..., optimizer ..., activations
    ...)`: a plan's figures per device (the words of the result's memory row)."""
    parts = [f"parameters {_gib(plan['parameters_gib'])}",
             f"gradients {_gib(plan['gradients_gib'])}",
             f"optimizer {_gib(plan['optimizer_gib'])}",
             f"activations {_gib(plan['activations_gib'])}"]
    overhead = plan.get("overhead_gib")
    if overhead:
        parts.append(f"XLA's program and buffers {_gib(overhead)}")
    return f"plan {_gib(plan['total_gib'])} per device ({', '.join(parts)})"


def plan_line(plan: dict[str, Any]) -> str:
    """The plan before the launch: its figures, against what one device has, and what the
    "auto" settings chose and why. `plan 1.2 GiB per device (...) of 15.8 GiB on v5e-1, fits;
    lora="auto": ...`"""
    verdict = "fits" if plan.get("fits", True) else "does not fit"
    text = (f"{plan_text(plan)} of {_gib(plan['device_memory_gib'])} per device on "
            f"{plan['hardware']}: {verdict}")
    notes = plan.get("notes") or ()
    return "; ".join([text, *notes])


def plan_html(plan: dict[str, Any]) -> str:
    """`plan_line` as one HTML line, labelled like the result panel's rows."""
    return ('<div style="font-family:var(--jp-ui-font-family,sans-serif);font-size:13px;'
            f'line-height:1.4"><b>{LABEL}</b>&nbsp;&nbsp;{escape(plan_line(plan))}</div>')


class PlanNotice:
    """The plan line in the cell, drawn in one mode ("widgets", "html", "console", "none").

    Attributes:
        mode: the mode it was drawn in.
        text: the line, as text (also its `repr()`).
        widget: the `ipywidgets.HTML` while it is live ("widgets" mode), else None.
    """

    def __init__(self, plan: dict[str, Any], mode: str) -> None:
        self.mode = mode
        self.text = f"{LABEL}  {plan_line(plan)}"
        self.html = plan_html(plan)
        self.widget: Any = None
        self._handle: Any = None
        if mode == "console":
            print(self.text, flush=True)
        elif mode == "html":
            from IPython.display import display

            self._handle = display(self._block(), display_id=True)
        elif mode == "widgets":
            import ipywidgets as widgets
            from IPython.display import display

            self.widget = widgets.HTML(value=self.html, layout=widgets.Layout(margin="0px"))
            self._handle = display(self, display_id=True)

    def _block(self) -> HtmlBlock:
        return HtmlBlock(self.html, self.text)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        if self.widget is None:
            return self._block()._repr_mimebundle_()
        return {"text/plain": self.text,
                "application/vnd.jupyter.widget-view+json": {
                    "version_major": 2, "version_minor": 0, "model_id": self.widget.model_id}}

    def close(self) -> None:
        """When the launch ended: the widget view becomes static HTML with its text form and
        the widget is closed (nothing for a saved notebook to miss); other modes keep theirs."""
        if self.widget is None:
            return
        widget, self.widget = self.widget, None
        if self._handle is not None:
            self._handle.update(self._block())
        widget.close()

    def __repr__(self) -> str:
        return self.text


def show_memory_plan(plan: dict[str, Any] | None, mode: str | bool = "auto") -> PlanNotice | None:
    """Show a fine-tune's memory plan in the cell, in the launch panel's mode.

    Args:
        plan: `dataclasses.asdict(MemoryPlan)`, or None (nothing is shown).
        mode: as `notebook_launcher(progress=)`: "auto", "widgets", "html", "console", or
            False/"none".

    Returns:
        The `PlanNotice` drawn (call `close()` when the launch ended), or None when there is
        no plan or nothing is drawn.
    """
    from .modes import select_mode

    if not plan:
        return None
    chosen = select_mode(mode)
    if chosen == "none":
        return None
    return PlanNotice(plan, chosen)
