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


@pytest.mark.parametrize("asked", ["16", "0", "x", "4,17"])
def test_an_unknown_figure_is_refused_with_the_list(asked):
    with pytest.raises(ValueError, match="the figures are 1 reporting overhead, 2 syncs"):
        chosen_modules(asked)
    # From the command line: a usage error that names the figures, before anything runs.
    done = subprocess.run([sys.executable, "-m", "bench.run", "--groups", asked], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "there is no figure" in done.stderr and "15 pods" in done.stderr


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
