"""The panels' one look: the box, the heading, the tables, the colours, and the alignment of
their text forms.

Every HTML panel (`%xla_info`, the launch's status and progress, the metrics, the memory plan,
a `FineTuneResult`, `Predictions`, the compilations table, a failed launch) is built from
these pieces, so they read as one family: the same bordered box, the same heading, the same
table cells, the same muted text.

Styles are inline: the same panel is drawn inside a widget while the launch runs and as a
notebook's rendered HTML once it ended, where JupyterLab styles tables (stripes, padding,
right alignment, header rows); every table, row and cell states its own style, so both places
lay it out the same. Colours come from JupyterLab's theme variables (`--jp-*`, defined by its
light and dark themes), each with a mid-tone fallback that reads on light and dark pages
without them (Colab, VS Code, nbconvert). A colour is written twice, the plain fallback first:
a sanitizer that drops `var()` (an untrusted notebook) keeps the plain one.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape

# -- colours -------------------------------------------------------------------------------------

# Mid-tone colours, readable on light and dark backgrounds: the fallbacks of the theme's own.
BLUE, GREY, GREEN, AMBER, RED = "#1f77b4", "#7f7f7f", "#2ca02c", "#e6a700", "#d62728"
PURPLE = "#9467bd"  # the step-time chart's line: JupyterLab has no colour of that meaning
# JupyterLab's theme colour of each meaning (its light and dark themes define them).
THEME = {
    BLUE: "--jp-brand-color1",
    GREEN: "--jp-success-color1",
    RED: "--jp-error-color1",
    AMBER: "--jp-warn-color1",
    GREY: "--jp-ui-font-color2",
}
# A fill under white text (the runtime panel's badges): the darker tone of each meaning.
STRONG = {
    BLUE: ("--jp-brand-color0", "#1565c0"),
    GREEN: ("--jp-success-color0", "#2e7d32"),
    RED: ("--jp-error-color0", "#c62828"),
    AMBER: ("--jp-warn-color0", "#e65100"),
}
# Every colour a panel may write: the fallbacks of the theme's colours, and the SVG lines.
PALETTE = frozenset({BLUE, GREY, GREEN, AMBER, RED, PURPLE,
                     *(fallback for _, fallback in STRONG.values())})
# Borders and grey fills: translucent grey shows on any background.
BORDER_GREY = "rgba(128,128,128,.5)"
TRACK_GREY = "rgba(128,128,128,0.25)"


def themed(prop: str, color: str, variable: str | None = None, value: str = "{}") -> str:
    """A CSS declaration in a colour, twice: the plain colour, then the theme's variable with
    the colour as its fallback.

    Args:
        prop: the CSS property (`color`, `background`, `border-left-color`, `border`).
        color: the fallback colour (a `PALETTE` colour, or a grey such as `BORDER_GREY`).
        variable: the theme variable; None: `THEME`'s for `color` (the plain colour alone when
            it has none).
        value: the declaration's value, `{}` standing for the colour (`1px solid {}`).

    Example:
        `themed("color", RED)` is `color:#d62728;color:var(--jp-error-color1,#d62728);`.
    """
    variable = variable or THEME.get(color)
    plain = f"{prop}:{value.format(color)};"
    if not variable:
        return plain
    return plain + f"{prop}:{value.format(f'var({variable},{color})')};"


def strong_fill(color: str) -> str:
    """A background in the darker tone of `color`'s meaning (`STRONG`), for white text."""
    variable, fallback = STRONG[color]
    return themed("background", fallback, variable)


def text_color(color: str) -> str:
    """CSS for text in `color`: JupyterLab's theme colour of the same meaning when the page has
    one (readable on its light and dark themes), else `color` itself."""
    return themed("color", color)


# Secondary text: JupyterLab's secondary text colour, a mid grey where it has none.
MUTED = text_color(GREY)
# Small secondary text under a table or beside a chart (footers, scales).
SMALL = "font-size:11px;line-height:1.2;" + MUTED
# The empty part of a progress bar.
TRACK = f"var(--jp-layout-color3,{TRACK_GREY})"

# -- the box -------------------------------------------------------------------------------------

# The panels' text: JupyterLab's interface font (a sans-serif elsewhere), at one size.
FONT = "font-family:var(--jp-ui-font-family,sans-serif);font-size:13px;"
# A part of a panel (a line, the bars, a chart): the font and the line height, no box.
TEXT = FONT + "line-height:1.4;"
# The panel's border, the same on every panel (the plain grey first: see the module's doc).
BORDER = f"1px solid var(--jp-border-color2, {BORDER_GREY})"
PADDING = "6px 10px"
# The outer element of every panel: border, radius, padding, font and text colour.
BOX = (TEXT + "color:var(--jp-content-font-color1,currentColor);"
       + f"border:1px solid {BORDER_GREY};border:{BORDER};"
       + f"border-radius:4px;padding:{PADDING};margin:0;")
# A panel's heading: one element, one size and weight, in every panel.
HEADING = "font-weight:600;font-size:13px;"


def panel(body: str, cls: str) -> str:
    """A whole panel: `body` in the one box.

    Args:
        body: the panel's HTML.
        cls: its class (`hfxla-launch`, `hfxla-nb-runtime`, ...): what tests and pages find
            it by.
    """
    return f'<div class="{cls}" style="{BOX}">{body}</div>'


def heading(text: str) -> str:
    """A panel's heading (`text` is HTML: escape words before)."""
    return f'<b style="{HEADING}">{text}</b>'


def badge(text: str, color: str) -> str:
    """A status badge beside a heading: `text` (words) in white on the darker tone of
    `color`'s meaning, readable on light and dark themes."""
    return (f'<span style="{strong_fill(color)}color:#fff;border-radius:3px;'
            f'padding:1px 6px;font-size:0.85em;font-weight:600">{escape(text)}</span>')


# -- tables --------------------------------------------------------------------------------------

TABLE = ("border-collapse:collapse;border:none;margin:2px 0;table-layout:auto;"
         "font-size:13px;color:inherit;")
TR = "background:transparent;border:none;"
_CELL = ("vertical-align:top;line-height:1.4;border:none;max-width:none;"
         "background:transparent;padding:1px 12px 1px 0;")
# A cell of text: it may wrap.
TD = _CELL + "text-align:left;white-space:normal;"
# A row's label ("compile cache", "device → host"): never wraps, so its column keeps its width.
LABEL = _CELL + "text-align:left;white-space:nowrap;font-weight:600;"
# A name inside a value (a metric's, an entity type's): never wraps, in the text's weight.
NAME = _CELL + "text-align:left;white-space:nowrap;"
# A number: right-aligned, every digit the same width, so a column of them lines up.
NUMBER = _CELL + "text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums;"
# A column's header: a label, aligned as its column is.
HEAD = LABEL
HEAD_NUMBER = NUMBER + "font-weight:600;"


def cell(content: str, style: str = TD, tag: str = "td", title: str | None = None) -> str:
    """One cell: `content` (HTML) in `tag` with `style`; `title` (words) as its tooltip."""
    tip = f' title="{escape(title)}"' if title else ""
    return f'<{tag} style="{style}"{tip}>{content}</{tag}>'


def row(cells: Iterable[str]) -> str:
    """A table row of `cells` (made by `cell`)."""
    return f'<tr style="{TR}">{"".join(cells)}</tr>'


def table(rows: Iterable[str], head: str = "") -> str:
    """A table of `rows` (made by `row`), `head` (a row) as its header."""
    header = f"<thead>{head}</thead>" if head else ""
    return f'<table style="{TABLE}">{header}<tbody>{"".join(rows)}</tbody></table>'


def label_row(label: str, value: str, title: str | None = None, tag: str = "th") -> str:
    """A row of a label (words, in a `tag` cell) and its value (HTML), `title` as the value's
    tooltip."""
    return row([cell(escape(label), LABEL, tag), cell(value, title=title)])


# -- text forms ----------------------------------------------------------------------------------


def aligned_lines(grid: list[list[str]], right: list[bool]) -> list[str]:
    """A text table's lines: each column padded to its widest cell, left-aligned or (where
    `right` says so: numbers) right-aligned, two spaces between columns, no trailing space.

    Args:
        grid: the rows of cells, a header row first where there is one.
        right: for each column, whether it aligns right.
    """
    widths = [max(len(line[i]) for line in grid) for i in range(len(right))]
    return ["  ".join(text.rjust(width) if align else text.ljust(width)
                      for text, width, align in zip(line, widths, right, strict=True)).rstrip()
            for line in grid]
