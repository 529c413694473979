"""The compilations table: a graph that only library code made names the
library line, not "library code"; a value the library fetched is not blamed on `.item()`;
and in HTML the counts never wrap, only the place and the cause may."""

from __future__ import annotations

import re
from pathlib import Path

import hfxla_nb
from hfxla_nb.observe.metrics import XlaSummary
from hfxla_nb.observe.tracing import FETCH_CAUSE, CompileRecord, Frame, TraceLog
from hfxla_nb.ui.text import compilations_html, row_cells

LIBRARY = Frame("run_batches", "/work/hfxla_nb/train/worker/evaluate.py", 57)
USER = Frame("train", "/tmp/ipykernel_1/27.py", 12, cell=3)


def trace_of(*records: CompileRecord) -> TraceLog:
    trace = TraceLog()
    trace.add(records)
    return trace


def test_a_library_graph_names_its_line_and_is_not_blamed_on_item():
    trace = trace_of(CompileRecord(1, FETCH_CAUSE + " before torch_xla.sync", "h1", via=LIBRARY))
    (row,) = trace.rows()
    place, graphs, different, _, cause = row_cells(row)
    assert place == "library: evaluate.py:57 `run_batches`"
    assert (graphs, different, cause) == ("1 graph", "1 different", "value fetched by the library")


def test_a_users_fetch_keeps_its_item_words():
    trace = trace_of(CompileRecord(1, FETCH_CAUSE + " before torch_xla.sync", "h1", where=USER))
    (row,) = trace.rows()
    assert row_cells(row)[0] == "`train` in cell 3, line 12"
    assert row_cells(row)[4].startswith("value fetched (.item()")


def test_a_fetch_by_hfxla_nb_under_the_users_fine_tune_line_is_said_to_be_its_own():
    """The worker's frames sit under the cell that called `fine_tune`: a value hfxla_nb's own
    code fetched (an evaluation's outputs) is not the user's `.item()`."""
    ours = Frame("run_batches", str(Path(hfxla_nb.__file__).parent / "train/worker/evaluate.py"),
                 57)
    fine_tune_line = Frame("<module>", "/tmp/ipykernel_1/27.py", 2, cell=3)
    trace = trace_of(CompileRecord(1, FETCH_CAUSE + " before torch_xla.sync", "h1",
                                   where=fine_tune_line, via=ours))
    (row,) = trace.rows()
    assert row_cells(row)[0] == "cell 3, line 2 (via evaluate.py:57 `run_batches`)"
    assert row_cells(row)[4] == "hfxla_nb's own work, not your code"


def test_only_the_place_and_the_cause_may_wrap():
    long_place = Frame("a_very_long_training_function_name", "/tmp/ipykernel_1/27.py", 12, 3)
    trace = trace_of(CompileRecord(1, "user torch_xla.sync", "h1", where=long_place),
                     CompileRecord(2, "user torch_xla.sync", "h2", where=long_place))
    html = compilations_html(XlaSummary(steps=2, compiles=2, trace=trace))
    (row,) = [r for r in re.findall(r"<tr[^>]*>(.*?)</tr>", html) if "<td" in r]
    styles = re.findall(r'<td style="([^"]*)"', row)
    assert len(styles) == 5
    assert ["white-space:nowrap" in style for style in styles] == [False, True, True, True, False]
