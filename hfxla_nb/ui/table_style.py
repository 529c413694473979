"""Inline styles of the panels' tables.

The same panel is drawn inside a widget while the launch runs and as a notebook's rendered HTML
once it ended; JupyterLab styles tables there (stripes, padding, right alignment, header rows).
Every table, row and cell states its own style, so both places lay it out the same.
"""

TABLE = ("border-collapse:collapse;border:none;margin:2px 0;table-layout:auto;"
         "font-size:13px;color:inherit;")
TR = "background:transparent;border:none;"
TD = ("text-align:left;vertical-align:top;line-height:1.4;white-space:normal;border:none;"
      "max-width:none;")
