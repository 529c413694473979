"""The `RuntimeInfo` panel, as HTML (notebooks) and as text (terminals, nbconvert, logs).

Plain functions of a `RuntimeInfo`: no IPython needed, so tests call them directly. Every
value is escaped; secrets were already replaced by "<hidden>" in `RuntimeInfo.env`.
"""

from __future__ import annotations

import html
import textwrap
from typing import TYPE_CHECKING

from ..runtime.hosts import host_name, launch_plan
from .table_style import (
    AMBER,
    BLUE,
    GREEN,
    MUTED,
    RED,
    badge,
    heading,
    label_row,
    panel,
    table,
    themed,
)

if TYPE_CHECKING:
    from ..runtime import Problem, RuntimeInfo

# The palette every panel shares (JupyterLab's theme colours, these as their fallbacks).
_PROBLEM_COLORS = {"error": RED, "warning": AMBER, "info": BLUE, "ok": GREEN}
_TEXT_WIDTH = 100
_LABEL_WIDTH = 13
# Joins "name version" pairs so that text wrapping never splits one.
_NBSP = "\u00a0"


def status_line(info: RuntimeInfo) -> str:
    """The status: "OK", or the problem counts ("1 error, 2 warnings"); info notes count as OK."""
    counts = {severity: 0 for severity in ("error", "warning", "info")}
    for problem in info.problems:
        counts[problem.severity] = counts.get(problem.severity, 0) + 1
    parts = [
        f"{counts[name]} {name}{'' if counts[name] == 1 else 's'}"
        for name in ("error", "warning")
        if counts[name]
    ]
    return ", ".join(parts) if parts else "OK"


def _runtime_state(info: RuntimeInfo) -> str:
    if info.runtime_initialized:
        return "started in this process (the launcher cannot fork)"
    return "not started in this process (ready to launch)"


def _versions(info: RuntimeInfo) -> list[str]:
    return [f"{name} {value or 'not installed'}" for name, value in info.versions.items()]


def _facts(info: RuntimeInfo) -> list[tuple[str, str]]:
    accelerator = info.accelerator
    facts = [
        ("host", info.host or host_name(accelerator, info.environment)),
        ("accelerator", accelerator.description),
        ("found by", ", ".join(accelerator.found_by) or "nothing"),
        ("launcher", info.launch_plan or launch_plan(accelerator, info.environment)),
        ("runs in", info.environment),
        ("XLA runtime", _runtime_state(info)),
    ]
    if info.compile_cache:
        facts.append(("compile cache", info.compile_cache))
    if accelerator.holders:
        holders = ", ".join(f"{pid} ({name})" for pid, name in sorted(accelerator.holders.items()))
        facts.append(("TPU held by", holders))
    return facts


# ---------------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------------


def _text_row(label: str, value: str) -> list[str]:
    indent = " " * (2 + _LABEL_WIDTH + 1)
    lines = textwrap.wrap(
        value,
        width=_TEXT_WIDTH,
        initial_indent=f"  {label:<{_LABEL_WIDTH}} ",
        subsequent_indent=indent,
        break_on_hyphens=False,
    ) or [f"  {label}"]
    return [line.replace(_NBSP, " ") for line in lines]


def _text_problem(problem: Problem) -> list[str]:
    tag = f"[{problem.severity}]"
    lines = textwrap.wrap(
        problem.title,
        width=_TEXT_WIDTH,
        initial_indent=f"  {tag:<10}",
        subsequent_indent=" " * 12,
    )
    lines += textwrap.wrap(
        problem.fix,
        width=_TEXT_WIDTH,
        initial_indent=" " * 12 + "fix: ",
        subsequent_indent=" " * 17,
        break_on_hyphens=False,
    )
    return lines


def runtime_text(info: RuntimeInfo) -> str:
    """A readable multi-line text panel of `info`.

    Example:
        ```
        hfxla_nb runtime: OK
          accelerator   CPU: 1 virtual XLA device on 2 host cores
          ...
        ```
    """
    lines = [f"hfxla_nb runtime: {status_line(info)}"]
    for label, value in _facts(info):
        lines += _text_row(label, value)
    versions = ", ".join(item.replace(" ", _NBSP) for item in _versions(info))
    lines += _text_row("versions", versions)
    env = ", ".join(f"{name}={value}" for name, value in info.env.items()) or "(none set)"
    lines += _text_row("env", env)
    if info.problems:
        lines.append("problems:")
        for problem in info.problems:
            lines += _text_problem(problem)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------------------------


def _html_problem(problem: Problem) -> str:
    color = _PROBLEM_COLORS.get(problem.severity, _PROBLEM_COLORS["info"])
    return (
        '<li style="list-style:none;margin:4px 0;padding:4px 8px;border-left:4px solid;'
        f'{themed("border-left-color", color)}">'
        f"{badge(problem.severity, color)} {html.escape(problem.title)}"
        f'<div style="margin-top:2px;{MUTED}"><b>Fix:</b> {html.escape(problem.fix)}</div>'
        "</li>"
    )


def runtime_html(info: RuntimeInfo) -> str:
    """An HTML panel of `info`: the one box and table every panel uses (`table_style`)."""
    status = status_line(info)
    if status == "OK":
        status_color = _PROBLEM_COLORS["ok"]
    else:
        status_color = _PROBLEM_COLORS["warning" if info.ok else "error"]
    rows = [label_row(label, html.escape(value)) for label, value in _facts(info)]
    rows.append(label_row("versions", html.escape(" · ".join(_versions(info)))))
    if info.env:
        env = "<br>".join(
            f"<code>{html.escape(name)}={html.escape(value)}</code>"
            for name, value in info.env.items()
        )
    else:
        env = "(none set)"
    rows.append(label_row("env", env))
    problems = ""
    if info.problems:
        problems = (
            '<ul style="margin:6px 0 0 0;padding:0">'
            + "".join(_html_problem(problem) for problem in info.problems)
            + "</ul>"
        )
    return panel(
        f'<div style="margin-bottom:4px">{heading("hfxla_nb runtime")} '
        f"{badge(status, status_color)}</div>{table(rows)}{problems}",
        "hfxla-nb-runtime",
    )


class RuntimePanel:
    """A `RuntimeInfo` drawn as a panel: HTML in a notebook, text from `repr()`."""

    def __init__(self, info: RuntimeInfo) -> None:
        self.info = info

    def _repr_html_(self) -> str:
        return runtime_html(self.info)

    def __repr__(self) -> str:
        return runtime_text(self.info)
