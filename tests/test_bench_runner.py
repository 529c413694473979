"""`make bench BENCH_GROUPS=...`: figures chosen by the numbers of bench/RESULTS.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.run import FIGURES, chosen_modules

ROOT = Path(__file__).resolve().parents[1]


def test_figures_measured_in_the_same_runs_are_chosen_together():
    assert chosen_modules("4") == [("2 syncs, 4 throughput, 5 whole run", "versus")]
    assert [module for _, module in chosen_modules("10,1,9")] == [
        "overhead", "scaling", "trace_overhead"]  # each once, in the order of the figures
    every = [module for _, module in chosen_modules(",".join(map(str, FIGURES)))]
    assert len(every) == len(set(every)) == len({module for _, module in FIGURES.values()})


# Past the last figure (read from FIGURES: a new figure must not break this test).
@pytest.mark.launch
@pytest.mark.parametrize("asked", [str(max(FIGURES) + 1), "0", "x", f"4,{max(FIGURES) + 2}"])
def test_an_unknown_figure_is_refused_with_the_list(asked):
    with pytest.raises(ValueError, match="the figures are 1 reporting overhead, 2 syncs"):
        chosen_modules(asked)
    # From the command line: a usage error that names the figures, before anything runs.
    done = subprocess.run([sys.executable, "-m", "bench.run", "--groups", asked], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    last = f"{max(FIGURES)} {FIGURES[max(FIGURES)][0]}"
    assert "there is no figure" in done.stderr and last in done.stderr


def test_every_figure_has_a_module_that_measures_it():
    import importlib

    for number, (_, module) in FIGURES.items():
        assert callable(importlib.import_module(f"bench.{module}").run), number


def test_a_group_named_without_its_number_gets_it():
    from bench import common
    from bench.run import numbered

    figures = numbered([common.Figure("relay throughput", "lines", 1.0),
                        common.Figure("13 relay throughput", "lines", 2.0)], "relay")
    assert [f.group for f in figures] == ["13 relay throughput"] * 2


def test_a_group_over_its_share_of_the_15_minutes_is_named():
    from bench.run import SHARES, over_share

    assert set(SHARES) == {module for _, module in FIGURES.values()}  # every group has one
    # The start (models built, ~15 s) and 50 s of margin: a whole run at most ~850 s.
    assert sum(SHARES.values()) <= 15 * 60 - 15 - 50
    assert over_share({"versus": SHARES["versus"] + 5.0, "limit": 1.0, "new": 1e6}) == [
        f"versus: {SHARES['versus'] + 5:.0f} s (share {SHARES['versus']} s)"]


@pytest.mark.launch
def test_each_groups_time_is_written_with_the_results(tmp_path):
    import json

    from bench import common

    json_path, md_path = common.write_results(
        [common.Figure("1 reporting overhead", "x", 1.0)], 0.0, 0.5, out_dir=tmp_path,
        group_seconds={"overhead": 91.26, "versus": 180.0})
    assert json.loads(json_path.read_text())["group_seconds"] == {"overhead": 91.3,
                                                                  "versus": 180.0}
    assert "- Time per module: overhead 91 s, versus 180 s." in md_path.read_text()
