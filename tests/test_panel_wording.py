"""Panel wording that must match what it counts: the predict bar's name and its
step accounting, the memory plan drawn as a panel, rank lists in sentences, and XLA's time
per step above the wall time per step."""

from __future__ import annotations

import contextlib
from html import escape
from types import SimpleNamespace

import pytest

from hfxla_nb._words import ranks_were, series
from hfxla_nb.observe.metrics import summarize, xla_exceeds_wall
from hfxla_nb.states import BarState, Outcome, RankState
from hfxla_nb.ui import html, text
from hfxla_nb.ui.state import BarView

MS = 1_000_000  # nanoseconds, as torch_xla's timing metrics count them


def predict_snapshot() -> dict:
    """What `predict`'s process sends at its end: no step reported, three syncs (loading the
    model, the one batch, the fetch) and one graph executed."""
    return {"counters": {"MarkStep": 3, "ExecuteComputation": 1},
            "metrics": {"ExecuteTime": {"count": 1, "total": 40 * MS, "samples": []}}}


def test_predict_runs_its_batches_under_a_bar_named_predict(monkeypatch):
    from hfxla_nb.train.worker import evaluate

    calls = []
    ctx = SimpleNamespace(task=SimpleNamespace(decode=lambda data, batches, fetched: []),
                          plan=SimpleNamespace(data=None))
    monkeypatch.setattr(evaluate, "_xla",
                        SimpleNamespace(is_spmd=lambda: True, compile_times=lambda: (0, [])))
    monkeypatch.setattr(evaluate, "patches",
                        SimpleNamespace(applied=contextlib.nullcontext))
    monkeypatch.setattr(evaluate, "WorkerContext",
                        SimpleNamespace(load=lambda plan, train: ctx))
    monkeypatch.setattr(evaluate, "run_batches",
                        lambda ctx, **options: calls.append(options) or ([], []))
    evaluate.predict_worker(0, SimpleNamespace(data=None))
    assert calls == [{"bar": "predict"}]

    # run_batches emits its Progress under the bar it is given.
    monkeypatch.undo()
    sent = []
    monkeypatch.setattr(evaluate, "emit", sent.append)
    monkeypatch.setattr(evaluate.batching, "eval_batches", lambda split, size: [])
    monkeypatch.setattr(evaluate._xla, "to_cpu", lambda outputs: [])
    model = SimpleNamespace(eval=lambda: None, train=lambda: None)
    plan = SimpleNamespace(data=SimpleNamespace(eval=None, eval_ahead=True), batch_size=1,
                           capture_steps=True)
    task = SimpleNamespace(eval_ahead=True)
    evaluate.run_batches(SimpleNamespace(plan=plan, model=model, task=task), bar="predict")
    evaluate.run_batches(SimpleNamespace(plan=plan, model=model, task=task))
    assert [event.label for event in sent] == ["predict", "eval"]


def test_syncs_counted_as_steps_are_never_said_to_have_not_run():
    # predict reports no step: the 3 "steps" are torch_xla's syncs, 1 graph ran, none is owed.
    summary = summarize(predict_snapshot())
    assert summary.steps == 3 and summary.steps_from_syncs
    assert "did not run" not in text.executions_text(summary)
    assert "did not run" not in "\n".join(text.summary_lines(summary))
    # Steps that were reported still say so: 3 steps reported, 1 graph ran to its end.
    reported = summarize(predict_snapshot(), steps=3)
    assert not reported.steps_from_syncs
    assert text.executions_text(reported).endswith(
        "for 3 steps reported: the graphs of the last 2 steps did not run")


def test_predicts_figures_count_its_batches_as_its_bar_does():
    # `predict 1/1` used to sit beside "XLA metrics in 3 steps" and "38 ms XLA per step": the
    # 3 were syncs (loading, the batch, the fetch). The bar counts batches; so do the figures.
    data = predict_snapshot()
    data["process"] = {"pid": 7, "ranks": [0], "rank_steps": 0,
                       "bar": {"label": "predict", "step": 1}}
    one = summarize(data)
    assert one.counted() == (1, "batch") and one.bar_count == ("predict", 1)
    lines = text.summary_lines(one)
    assert lines[0].startswith("XLA in 1 batch: "), lines
    assert "step" not in "\n".join(lines), lines
    assert text.executions_text(one) == "1 (40 ms)"  # no rate over one batch
    assert html.summary_html(one, "XLA metrics").count("XLA metrics in 1 batch") == 1
    # A causal LM's one batch runs a graph per token: 9 executions, still 1 batch, none owed.
    data["counters"]["ExecuteComputation"] = 9
    data["metrics"]["ExecuteTime"] = {"count": 9, "total": 90 * MS, "samples": []}
    data["process"]["bar"]["step"] = 4
    four = summarize(data)
    assert text.steps_phrase(four) == "in 4 batches"
    assert text.steps_phrase(four, live=True) == "as of batch 4"
    assert text.executions_text(four) == "9 (90 ms, 23 ms XLA per batch)"
    # Steps that were reported are counted as before, whatever a bar said.
    assert summarize(data, steps=3).counted() == (3, "step")


def test_rank_lists_are_worded_in_english():
    assert series([]) == "" and series([0]) == "0" and series([0, 1]) == "0 and 1"
    assert series([0, 1, 2]) == "0, 1 and 2"
    assert ranks_were([0], "stopped") == "Rank 0 was stopped."
    assert ranks_were([0, 1], "stopped") == "Ranks 0 and 1 were stopped."
    assert ranks_were([0, 1, 2], "stopped") == "Ranks 0, 1 and 2 were stopped."


def test_a_failing_launch_names_its_stopped_ranks_in_a_sentence():
    from hfxla_nb.launch.supervision import failure_message

    def rank(number, state, error=None):
        return SimpleNamespace(rank=number, exit_state=state, error=error, traceback=None,
                               last_step=None, stack="")

    for stopped, words in (([0], "Rank 0 was stopped."),
                           ([0, 2], "Ranks 0 and 2 were stopped.")):
        failed = rank(1, RankState.FAILED, "boom")
        record = SimpleNamespace(outcome=Outcome.FAILED,
                                 ranks=[failed, *(rank(r, RankState.STOPPED) for r in stopped)])
        message = failure_message(SimpleNamespace(record=record, failure=failed, timeout=None))
        assert message == f"rank 1 failed: boom. {words}"
        assert "[" not in message


def bar_with_step_times(*seconds: float) -> BarView:
    return BarView(label="train", rank=None, step=10, total=20, elapsed=3.0, eta=3.0,
                   rate=4.0, samples_rate=None, values={}, losses=[], step_times=list(seconds),
                   state=BarState.RUNNING)


def test_xla_time_per_step_above_the_wall_time_per_step_says_why():
    # 3.65 s of executions over 10 steps: 365 ms XLA per step beside a 246 ms wall step.
    data = {"counters": {"ExecuteComputation": 12},
            "metrics": {"ExecuteTime": {"count": 12, "total": 3650 * MS, "samples": []}}}
    summary = summarize(data, steps=10)
    assert "365 ms XLA per step" in text.executions_text(summary)
    assert xla_exceeds_wall(summary, 0.246)
    chart = html.chart_html([bar_with_step_times(0.25, 0.246)], summary)
    # In the tooltip of the one info icon that is always there: the line never changes width
    # for it. The icon is drawn (an SVG), not the ⓘ character, which Debian's default fonts
    # lack (a missing-glyph box).
    assert "246 ms" in chart and f'title="{escape(text.XLA_ABOVE_WALL)}: ' in chart
    assert "ⓘ" not in chart and f'">{html.INFO_ICON}</span>' in chart
    assert "<text" not in html.INFO_ICON  # no glyph at all: shapes only
    assert "every graph" in text.XLA_ABOVE_WALL_MEANS and "divided" in text.XLA_STEP_MEANS
    # A wall time above XLA's, or no metrics yet, needs no word.
    assert not xla_exceeds_wall(summary, 0.5) and not xla_exceeds_wall(None, 0.1)
    assert text.XLA_ABOVE_WALL not in html.chart_html([bar_with_step_times(0.6, 0.5)], summary)
    assert text.XLA_ABOVE_WALL not in html.chart_html([bar_with_step_times(0.25, 0.246)])


def _no_collectives() -> int:
    return 1


def _all_ranks_fail() -> int:
    raise RuntimeError("stuck waiting for the all_reduce of the gradients")


def _rank_0_fails(index: int) -> int:
    if index == 0:
        raise ValueError("a bad batch in rank 0's own code")
    return 1


@pytest.mark.launch
def test_the_replicated_cpu_note_is_on_the_panel_only_when_collectives_explain_the_failure(
        capsys):
    # A note under the bars, not a red UserWarning pointing at ipykernel's file for the cell,
    # and only for a launch whose failure collectives explain (more than one rank failed, it
    # hung, an error names one), never beside one rank's own failure.
    import warnings

    import hfxla_nb as hx
    from hfxla_nb.launch.errors import LaunchError

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning in the kernel fails the test
        assert hx.notebook_launcher(_no_collectives, num_processes=2,
                                    progress="console") == 1
    assert hx.last_launch().notes == []
    with pytest.raises(LaunchError):
        hx.notebook_launcher(_rank_0_fails, num_processes=2, progress="console")
    assert hx.last_launch().notes == [] and "collectives" not in capsys.readouterr().out
    with pytest.raises(LaunchError):
        hx.notebook_launcher(_all_ranks_fail, num_processes=2, progress="console")
    (note,) = hx.last_launch().notes
    assert note.startswith("XLA on the CPU runs the 2 replicated ranks as threads")
    assert note in capsys.readouterr().out.replace("\n", " ")


def test_the_steps_of_rank_threads_at_different_steps_are_said_to_be_the_slowest_ranks():
    # Two rank threads of one process (replicated on XLA:CPU): its counters are shared and its
    # step is the slowest rank's, while rank 0's bar may be ahead ("in 8 steps" beside rank
    # 0's bar at step 9).
    snapshot = {"counters": {"MarkStep": 17},
                "metrics": {"ExecuteTime": {"count": 16, "total": 160 * MS, "samples": []}},
                "process": {"pid": 1, "ranks": [0, 1], "rank_steps": 17}}
    summary = summarize(snapshot, steps=8)
    assert summary.ranks == 2
    assert text.summary_lines(summary)[0].startswith("XLA in 8 steps of its slowest rank: ")
    assert text.summary_lines(summary, live=True)[0].startswith(
        "XLA as of step 8 of its slowest rank: ")
    level = summarize({**snapshot, "process": {"pid": 1, "ranks": [0, 1], "rank_steps": 16}},
                      steps=8)
    assert text.summary_lines(level)[0].startswith("XLA in 8 steps: ")  # both at step 8
    one = summarize({**snapshot, "process": {"pid": 1, "ranks": [0]}}, steps=8)
    assert text.summary_lines(one)[0].startswith("XLA in 8 steps: ")
