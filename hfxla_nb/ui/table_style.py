"""Inline styles of the panels' tables, and the alignment of their text forms.

The same panel is drawn inside a widget while the launch runs and as a notebook's rendered HTML
once it ended; JupyterLab styles tables there (stripes, padding, right alignment, header rows).
Every table, row and cell states its own style, so both places lay it out the same.
"""

# The panels' text: JupyterLab's interface font (a sans-serif elsewhere), at one size.
FONT = "font-family:var(--jp-ui-font-family,sans-serif);font-size:13px;"

TABLE = ("border-collapse:collapse;border:none;margin:2px 0;table-layout:auto;"
         "font-size:13px;color:inherit;")
TR = "background:transparent;border:none;"
TD = ("text-align:left;vertical-align:top;line-height:1.4;white-space:normal;border:none;"
      "max-width:none;")


def aligned_lines(grid: list[list[str]], right: list[bool]) -> list[str]:
    """A text table's lines: each column padded to its widest cell, left-aligned or (where
    `right` says so: numbers) right-aligned, two spaces between columns, no trailing space.

    Args:
        grid: the rows of cells, a header row first where there is one.
        right: for each column, whether it aligns right.
    """
    widths = [max(len(row[i]) for row in grid) for i in range(len(right))]
    return ["  ".join(text.rjust(width) if align else text.ljust(width)
                      for text, width, align in zip(row, widths, right, strict=True)).rstrip()
            for row in grid]
