"""The `DoctorReport` panel, as HTML (notebooks) and as text (terminals, nbconvert, logs): a
row per step, its mark, what it found and its time, then what to do. Plain functions of the
report, so tests call them directly."""

from __future__ import annotations

import html
import textwrap
from typing import TYPE_CHECKING

from .table_style import (
    AMBER,
    GREEN,
    MUTED,
    NAME,
    NUMBER,
    RED,
    aligned_lines,
    badge,
    cell,
    heading,
    panel,
    row,
    table,
    themed,
)

if TYPE_CHECKING:
    from ..runtime.doctor_report import DoctorReport

_CHECK_COLORS = {"ok": GREEN, "warning": AMBER, "failed": RED, "timed out": RED}
_REPORT_WIDTH = 100


def _status_color(report: DoctorReport) -> str:
    if not report.ok:
        return RED
    return AMBER if any(check.status == "warning" for check in report.checks) else GREEN


def _mark_html(status: str, mark: str) -> str:
    color = _CHECK_COLORS.get(status)
    style = themed("color", color) if color else MUTED
    return f'<span style="{style}" title="{html.escape(status)}">{mark}</span>'


def doctor_html(report: DoctorReport) -> str:
    """The report as an HTML panel: a row per step, then what to do."""
    rows = [row([cell(_mark_html(check.status, check.mark), NAME),
                 cell(html.escape(check.name), NAME),
                 cell(html.escape(check.summary)),
                 cell(f"{check.seconds:.1f} s", NUMBER)])
            for check in report.checks]
    fixes = "".join(f"<li><b>{html.escape(check.name)}</b>: {html.escape(check.fix)}</li>"
                    for check in report.checks if check.fix)
    todo = (f'<div style="margin-top:4px">{heading("What to do")}'
            f'<ul style="margin:2px 0 0 0;padding-left:18px">{fixes}</ul></div>'
            if fixes else "")
    note = (f'<div style="{MUTED}">hfxla_nb {html.escape(report.version)}, '
            f"{html.escape(report.created)}, {report.seconds:.1f} s; "
            "<code>.to_markdown()</code> for an issue, <code>.to_json()</code> as data</div>")
    return panel(f'<div style="margin-bottom:4px">{heading("hfxla_nb doctor")} '
                 f"{badge(report.status_line(), _status_color(report))}</div>"
                 f"{table(rows)}{todo}{note}", "hfxla-nb-doctor")


def doctor_text(report: DoctorReport) -> str:
    """The report as text: a line per step (wrapped), then what to do."""
    lines = [f"hfxla_nb doctor: {report.status_line()} ({report.seconds:.1f} s, "
             f"hfxla_nb {report.version}, {report.created})"]
    grid = [[check.mark, check.name, f"{check.seconds:.1f} s"] for check in report.checks]
    heads = aligned_lines(grid, [False, False, True])
    for head, check in zip(heads, report.checks, strict=True):
        lines += textwrap.wrap(check.summary, width=_REPORT_WIDTH, initial_indent=f"  {head}  ",
                               subsequent_indent=" " * (len(head) + 4),
                               break_on_hyphens=False)
    fixes = [check for check in report.checks if check.fix]
    if fixes:
        lines.append("what to do:")
        for check in fixes:
            lines += textwrap.wrap(f"{check.name}: {check.fix}", width=_REPORT_WIDTH,
                                   initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines)
