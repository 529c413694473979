"""The memory plan of a fine-tune: its table (a `MemoryPlan` shown in a notebook) and the one
line shown in the cell before the fork.

`hx.plan_memory` returns a `MemoryPlan` (plain data, `train.memory_plan`); `ui/formatters.py`
tells IPython to draw it with `plan_table` (text) and `plan_table_html` (HTML): a table of
each part per device, the settings, and the changes that would make it fit. `fine_tune` checks its
plan in the kernel; the launch layer hands it to `show_memory_plan`, which draws one line in the
mode the launch panel uses: an ipywidgets `HTML` widget (replaced by static HTML when the launch
ends, like the launch panel, so a saved notebook holds no widget view), an HTML output, or a
printed line. The words are `finetune_panel.memory_row`'s plan part, so the cell and the result
say the same. Everything here reads the plan's fields by name: a `MemoryPlan`, or the plain
dict a `FineTuneResult` keeps (`dataclasses.asdict`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from types import SimpleNamespace
from typing import Any, Protocol

from .html_display import HtmlBlock
from .table_style import (
    GREEN,
    MUTED,
    NUMBER,
    RED,
    TD,
    TEXT,
    badge,
    cell,
    heading,
    panel,
    row,
    table,
)
from .table_style import PLAN_LABEL as LABEL_CELL
from .units import size

GIB_BYTES = 2**30  # bytes per GiB
PLAN_LABEL = "memory"
# What introduces the changes of a plan that does not fit (text and HTML).
FIT_HEADING = "What would make it fit, cheapest first (each on top of the ones before):"
# The plan's class, on its box: the line alone (the cell before the fork) or with its changes.
PLAN_CLASS = "hfxla-plan"


class PlanChange(Protocol):
    """One change of a plan that does not fit (`train.memory_plan.MemoryChange`)."""

    change: str
    argument: str
    total_gib: float
    fits: bool


class Plan(Protocol):
    """The fields of `train.memory_plan.MemoryPlan` drawn here (ui sits below train, so it
    names them instead of importing the class)."""

    model: str
    hardware: str
    devices: int
    device_memory_gib: float
    batch_size: int
    max_length: int
    precision: str
    lora_rank: int | None
    sharding: str
    gradient_checkpointing: bool
    parameters: int
    trainable_parameters: int
    parameters_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    activations_full_gib: float
    activations_checkpointed_gib: float
    total_gib: float
    fits: bool
    changes: Sequence[PlanChange]
    notes: Sequence[str]


def as_plan(plan: Plan | Mapping[str, Any]) -> Plan:
    """A plan to draw: a `MemoryPlan` as it is; the dict a `FineTuneResult` keeps read by its
    keys (its changes too)."""
    if not isinstance(plan, Mapping):
        return plan
    fields = dict(plan)
    fields["changes"] = [SimpleNamespace(**change) for change in fields.get("changes") or ()]
    fields.setdefault("notes", ())
    return SimpleNamespace(**fields)  # type: ignore[return-value]


def _gib(value: float) -> str:
    return size(round(value * GIB_BYTES))


def plan_settings(plan: Plan) -> list[str]:
    """The settings the plan was made for, in words: batch, precision, LoRA or not, sharding,
    gradient checkpointing."""
    return [f"batch {plan.batch_size} x {plan.max_length} tokens", plan.precision,
            f"LoRA r={plan.lora_rank}" if plan.lora_rank else "full fine-tune",
            f"{plan.sharding} sharding",
            "gradient checkpointing" if plan.gradient_checkpointing
            else "no gradient checkpointing"]


def plan_title(plan: Plan) -> str:
    """`Llama on v5e-1 (1 device, 15.48 GiB each): 1.20 GiB per device, fits`."""
    verdict = "fits" if plan.fits else "does not fit"
    return (f"{plan.model} on {plan.hardware} ({plan.devices} device"
            f"{'s' if plan.devices != 1 else ''}, {plan.device_memory_gib:.2f} GiB each): "
            f"{plan.total_gib:.2f} GiB per device, {verdict}")


def plan_rows(plan: Plan) -> list[tuple[str, str, float | None, str]]:
    """The plan's table as data: (part, count, GiB per device or None, note) for the
    parameters, the trainable ones, gradients, optimizer state, activations and the total."""
    return [
        ("parameters", _count(plan.parameters), plan.parameters_gib, ""),
        ("trainable", _count(plan.trainable_parameters), None, ""),
        ("gradients", "", plan.gradients_gib, ""),
        ("optimizer state", "AdamW", plan.optimizer_gib, ""),
        ("activations", "", plan.activations_gib,
         f"(estimate; {plan.activations_full_gib:.2f} without, "
         f"{plan.activations_checkpointed_gib:.2f} with gradient checkpointing)"),
        ("total per device", "", plan.total_gib, f"of {plan.device_memory_gib:.2f}"),
    ]


def plan_table(plan: Plan) -> str:
    """The plan as a small table: the settings, each part per device, the total against the
    device, the notes, and the changes that would make it fit (a `MemoryPlan`'s text)."""
    lines = [plan_title(plan), "  " + ", ".join(plan_settings(plan))]
    for label, count, gib, note in plan_rows(plan):
        line = f"  {label:<18}{count:>8}"
        if gib is not None:
            line += f"  {gib:8.2f} GiB"
        lines.append(f"{line}  {note}" if note else line)
    lines += [f"  note: {note}" for note in plan.notes]
    if plan.changes:
        lines.append(FIT_HEADING)
        lines += [f"  {number}. {change.change} ({change.argument}): "
                  f"{change.total_gib:.2f} GiB per device{', fits' if change.fits else ''}"
                  for number, change in enumerate(plan.changes, start=1)]
    return "\n".join(lines)


def plan_table_html(plan: Plan) -> str:
    """A `MemoryPlan` as a cell's value, as HTML: a panel with the plan's title and settings,
    a table of each part per device (the rows of `plan_table`), the notes, and the changes
    that would make it fit. Not the line `fine_tune` shows before the fork (`plan_html`): a
    cell that shows a plan and then fine-tunes shows that line once."""
    rows = [row([cell(escape(label), LABEL_CELL, "th"), cell(escape(count), NUMBER),
                 cell(f"{gib:.2f} GiB" if gib is not None else "", NUMBER),
                 cell(escape(note), f"{TD}{MUTED}")])
            for label, count, gib, note in plan_rows(plan)]
    verdict = "fits" if plan.fits else "does not fit"
    title = plan_title(plan).rsplit(": ", 1)[0]
    notes = "".join(f'<div style="{MUTED}">note: {escape(note)}</div>' for note in plan.notes)
    changes = ""
    if plan.changes:
        items = "".join(
            f"<li>{escape(change.change)} (<code>{escape(change.argument)}</code>): "
            f"{change.total_gib:.2f} GiB per device{', fits' if change.fits else ''}</li>"
            for change in plan.changes)
        changes = f'{FIT_HEADING}<ol style="margin:0;padding-left:2em">{items}</ol>'
    return panel(f"<div>{heading('memory plan')} {badge(verdict, GREEN if plan.fits else RED)} "
                 f"{escape(title)}</div>"
                 f'<div style="{MUTED}">{escape(", ".join(plan_settings(plan)))}</div>'
                 f"{table(rows)}{notes}{changes}", PLAN_CLASS)


def _count(number: int) -> str:
    """6738415616 -> "6.74B", 4194304 -> "4.19M"."""
    for suffix, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if number >= scale:
            return f"{number / scale:.2f}{suffix}"
    return str(number)


def plan_text(plan: Plan | Mapping[str, Any]) -> str:
    """`plan 1.2 GiB per device (parameters ..., gradients ..., optimizer ..., activations
    ...)`: a plan's figures per device (the words of the result's memory row)."""
    figures = as_plan(plan)
    parts = [f"parameters {_gib(figures.parameters_gib)}",
             f"gradients {_gib(figures.gradients_gib)}",
             f"optimizer {_gib(figures.optimizer_gib)}",
             f"activations {_gib(figures.activations_gib)}"]
    overhead = getattr(figures, "overhead_gib", None)
    if overhead:
        parts.append(f"XLA's program and buffers {_gib(overhead)}")
    return f"plan {_gib(figures.total_gib)} per device ({', '.join(parts)})"


def plan_line(plan: Plan | Mapping[str, Any]) -> str:
    """The plan before the launch: its figures, against what one device has, and what the
    "auto" settings chose and why. `plan 1.2 GiB per device (...) of 15.8 GiB on v5e-1, fits;
    lora="auto": ...`"""
    figures = as_plan(plan)
    verdict = "fits" if getattr(figures, "fits", True) else "does not fit"
    text = (f"{plan_text(figures)} of {_gib(figures.device_memory_gib)} per device on "
            f"{figures.hardware}: {verdict}")
    return "; ".join([text, *(figures.notes or ())])


def plan_html(plan: Plan | Mapping[str, Any]) -> str:
    """`plan_line` as one HTML line, under its heading `memory` (no box: the panels that show
    it put it in theirs, `plan_panel_html` and `plan_table_html`)."""
    # The panels' font, so the plan reads as one of them (not as monospaced output).
    return (f'<div style="{TEXT}">{heading(PLAN_LABEL)}&nbsp;&nbsp;'
            f"{escape(plan_line(plan))}</div>")


def plan_panel_html(plan: Plan | Mapping[str, Any]) -> str:
    """The plan's line as a panel of its own, in the one box: what the cell shows before the
    fork."""
    return panel(plan_html(plan), PLAN_CLASS)


class PlanNotice:
    """The plan line in the cell, drawn in one mode ("widgets", "html", "console", "none").

    Attributes:
        mode: the mode it was drawn in.
        text: the line, as text (also its `repr()`).
        widget: the `ipywidgets.HTML` while it is live ("widgets" mode), else None.
    """

    def __init__(self, plan: Plan | Mapping[str, Any], mode: str) -> None:
        self.mode = mode
        self.text = f"{PLAN_LABEL}  {plan_line(plan)}"
        self.html = plan_panel_html(plan)
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


def show_memory_plan(plan: Plan | Mapping[str, Any] | None,
                     mode: str | bool = "auto") -> PlanNotice | None:
    """Show a fine-tune's memory plan in the cell, in the launch panel's mode.

    Args:
        plan: a `MemoryPlan` (or its `dataclasses.asdict`), or None (nothing is shown).
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
