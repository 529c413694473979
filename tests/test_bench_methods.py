"""The bench's methods that keep `make bench` within 15 minutes without weakening a figure:
figure 1's alternating segments, the unoptimized compiles of count-only groups (the XLA flag
added for the block only), figure 7's fresh processes forked from one zygote, and figure 18's
end ids (a batch whose answers end early, picked from its own tokens)."""

from __future__ import annotations

import os

import pytest

from bench import common
from bench.generation import end_ids
from bench.launch_latency import Zygote
from bench.overhead import schedule


def test_figure_1_segments_alternate_in_pairs_both_orders():
    assert schedule(3) == ["bare", "watched", "watched", "bare", "bare", "watched"]
    assert schedule(20).count("bare") == schedule(20).count("watched") == 20


def test_unoptimized_compiles_adds_the_flag_for_the_block_only(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    with common.unoptimized_compiles():
        assert os.environ["XLA_FLAGS"] == common.UNOPTIMIZED_FLAG
    assert "XLA_FLAGS" not in os.environ
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    with common.unoptimized_compiles():
        assert os.environ["XLA_FLAGS"].split() == ["--xla_cpu_enable_fast_math=false",
                                                   common.UNOPTIMIZED_FLAG]
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"


@pytest.mark.launch  # bench's zygote forks, in code outside tests/
def test_the_zygote_forks_a_fresh_process_per_side():
    forks = Zygote()
    try:
        # accelerate's launcher runs the function in the calling process (num_processes=1):
        # the quickest side; each call is a new child, its first launch and 2 later ones.
        for _ in range(2):
            measured = forks.fresh("accelerate.notebook_launcher")
            assert len(measured["first_line"]) == len(measured["whole"]) == 3
            assert all(0 <= value < 30 for value in measured["whole"])
    finally:
        forks.close()
    assert forks.process.returncode == 0


def test_figure_18_end_ids_end_every_answer_early_with_at_most_8_ids():
    rows = [[5, 6, 7, 8, 9, 10, 11], [7, 1, 2, 3, 4, 12, 13], [20, 21, 22, 23, 24, 25, 26]]
    ends = end_ids(rows)
    assert ends == [7, 22]  # row 2 holds 7 already; row 3 gets its third token
    assert all(any(token in ends for token in row[:6]) for row in rows)
    assert len(end_ids([[i, i + 100, i + 200] for i in range(20)])) == 8
