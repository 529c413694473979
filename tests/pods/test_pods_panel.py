"""The panel of a launch over 2 hosts of 2 ranks names each rank by host (the console panel
drawing the launch's reader, fed the events a launch sends; the same panel in a real launch:
tests/pods/test_pods.py)."""

from __future__ import annotations

import io
import re

from hfxla_nb.events import Failed, Finished, Progress, Started
from hfxla_nb.launch.pods import _name_ranks
from hfxla_nb.launch.supervision import LaunchRecord, RankRecord
from hfxla_nb.observe.reader import LaunchReader
from hfxla_nb.ui.live import ConsoleDisplay


def test_console_panel_names_host_and_rank():
    out = io.StringIO()
    reader = LaunchReader(LaunchRecord("replicated", 4, [RankRecord(rank) for rank in range(4)]))
    panel = ConsoleDisplay(4, file=out, reader=reader)
    _name_ranks(reader, local_world=2)
    for rank in range(4):
        reader.handle(Started(rank=rank, world=4, pid=100 + rank))
        reader.handle(Progress(rank, 1, 2, {"loss": 0.5}, None, "train"))
    for rank in range(3):
        reader.handle(Progress(rank, 2, 2, {"loss": 0.25}, None, "train"))
        reader.handle(Finished(rank, rank, 1.0))
    reader.handle(Failed(3, "ValueError", "bad batch", "Traceback ..."))
    panel.close(None)
    text = out.getvalue()
    for host, rank in [(0, 0), (0, 1), (1, 2)]:
        assert f"train [host {host} rank {rank}] ✔ |" in text
    assert "train [host 1 rank 3] ✖ |" in text
    assert re.search(r"^✖ launch of 4 ranks failed after [^:\n]+: host 1 rank 3 raised "
                     r"ValueError$", text, re.M), text
