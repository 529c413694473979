"""Warm sessions (docs/launcher.md, "Warm sessions"): workers that stay on the devices between
runs, with the launcher's guarantees. Real workers, real torch_xla on CPU devices; the
counts come from each run's record (torch_xla's counters, per run), never from a clock.
"""

from __future__ import annotations

import html
import os
import re
import signal
import time

import pytest

import hfxla_nb as hx
from hfxla_nb.launch import LaunchError, LaunchRefusedError
from hfxla_nb.launch.processes import group_processes
from tests.helpers import Kernel, kernel_fixture, run_ok
from tests.test_kernel_death import GONE_WITHIN, alive, notes, wait_for

pytestmark = pytest.mark.launch

STATE: dict = {}  # in the workers: what a run leaves for the next


def put(scale: float) -> int:
    """Keep a tensor on the device (a run's state), return the worker's pid."""
    import torch

    from hfxla_nb import _xla

    STATE["tensor"] = torch.arange(8, dtype=torch.float32, device=_xla.device()) * scale
    _xla.sync()
    return os.getpid()


def read() -> tuple[int, float]:
    """The pid, and the sum of the tensor an earlier run left."""
    return os.getpid(), float(STATE["tensor"].sum().cpu())


def rank_and_pid(index: int) -> tuple[int, int]:
    return index, os.getpid()


def boom() -> None:
    raise ValueError("boom in a run")


def sleep_forever() -> None:
    print("started", flush=True)
    time.sleep(600)


def compiles() -> int:
    return hx.last_launch().ranks[0].metrics.compiles


@pytest.fixture
def session():
    opened = hx.session(num_processes=2, strategy="spmd", progress=False)
    yield opened
    opened.close()


def test_later_runs_fork_nothing_compile_nothing_seen_and_keep_what_earlier_runs_left(session):
    pid = session.run(put, 1.0)
    first = compiles()
    workers = session.info().pids
    assert first >= 1  # the graph of `put`, counted from zero as in a new process
    assert session.run(read) == (pid, 28.0)  # the tensor the first run left
    assert session.run(put, 1.0) == pid
    assert compiles() == 0  # the same graph: XLA's graphs stayed in the worker
    assert hx.last_launch().ranks[0].metrics.executions >= 1  # and this run's own count
    assert session.info().pids == workers  # no process was started
    # A run counts as a launch counts: the same function, launched, compiles the same.
    session.close()
    assert hx.notebook_launcher(put, (1.0,), num_processes=2, strategy="spmd",
                                progress=False) != pid
    assert compiles() == first


def test_an_exception_leaves_the_session_usable_and_its_state_kept(session):
    session.run(put, 1.0)
    with pytest.raises(LaunchError, match="boom in a run") as raised:
        session.run(boom)
    assert "still usable" in str(raised.value)
    assert session.alive
    assert session.run(read)[1] == 28.0


def test_a_launch_closes_a_warm_session_with_one_muted_line_and_the_next_run_says_so(
        session, capsys):
    session.run(put, 1.0)
    group = session.info().pids[0]
    hx.notebook_launcher(rank_and_pid, num_processes=1, progress=False)
    closed = [note for note in hx.last_launch().notes if "closed the warm session" in note]
    said = capsys.readouterr()
    assert len(closed) == 1 and said.out.count("closed the warm session") == 1  # no panel
    assert "closed the warm session (spmd on 2 devices, " in closed[0]  # which one
    assert "\x1b[2m" in said.out and "closed" not in said.err  # muted; no stderr block
    assert not session.alive and group_processes(group) == []
    with pytest.raises(LaunchError, match="KeyError"):  # new workers: the old state is gone
        session.run(read)
    assert any("new workers started" in note for note in hx.last_launch().notes)
    assert "new workers started" in capsys.readouterr().out
    assert session.alive


def test_replicated_and_debug_sessions_run_every_rank_in_the_same_processes():
    for strategy in ("replicated", "debug"):
        with hx.session(num_processes=2, strategy=strategy, progress=False) as opened:
            opened.run(rank_and_pid)
            ranks = [rank.result for rank in hx.last_launch().ranks]
            opened.run(rank_and_pid)
            assert [rank.result for rank in hx.last_launch().ranks] == ranks
            assert [index for index, _ in ranks] == [0, 1]
        assert not opened.alive


def test_a_timeout_stops_the_workers_and_the_next_run_starts_new_ones(capsys):
    with hx.session(num_processes=1, strategy="spmd", progress=False, timeout=3) as opened:
        pid = opened.run(put, 1.0)
        with pytest.raises(LaunchError, match="timed out"):
            opened.run(sleep_forever)
        assert not opened.alive
        assert opened.run(put, 1.0) != pid
        assert "timed out" in capsys.readouterr().out


def test_idle_workers_exit_after_idle_timeout_and_free_the_devices():
    with hx.session(num_processes=1, strategy="spmd", progress=False,
                    idle_timeout=1) as opened:
        opened.run(put, 1.0)
        pids = opened.info().pids
        deadline = time.monotonic() + 20
        while opened.alive and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not opened.alive
        assert all(group_processes(pid) == [] for pid in pids)


def test_close_stops_every_process_and_a_closed_session_refuses_runs(session):
    session.run(put, 1.0)
    pids = session.info().pids
    session.close()
    assert not any(alive(pid) for pid in pids)
    with pytest.raises(LaunchRefusedError, match="was closed"):
        session.run(read)


def test_what_cannot_be_pickled_is_refused_before_anything_runs(session):
    """The first run of new workers goes by the fork (any object); later runs are pickled."""
    import threading

    assert session.run(lambda lock: lock.locked(), threading.Lock()) is False
    runs = session.runs
    with pytest.raises(LaunchRefusedError, match="could not be pickled"):
        session.run(lambda lock: lock.locked(), threading.Lock())
    assert session.runs == runs and session.alive  # nothing was sent


def test_a_session_on_a_cluster_is_refused():
    from hfxla_nb.launch import LaunchOptions, Session

    with pytest.raises(LaunchRefusedError, match="sessions run on this host"):
        Session(LaunchOptions(cluster="auto", hosts=2))
    with pytest.raises(hx.FineTuneError, match="keep_warm=True holds the model on this host"):
        hx.fine_tune("no-model", [], keep_warm=True, cluster="auto", hosts=2)


def test_detect_lists_a_warm_session_and_not_as_a_holder_of_the_devices(session):
    session.run(put, 1.0)
    notes = [p.title for p in hx.detect().problems if p.severity == "info"]
    assert any("A warm session holds the devices: session: spmd on 2 devices" in note
               for note in notes)
    session.close()
    assert not any("warm session" in p.title for p in hx.detect().problems)


@pytest.mark.launch
def test_keep_warm_seconds_is_an_idle_limit_and_the_warm_note_is_information(tmp_path, capsys):
    """`keep_warm=<seconds>`: warm, with that idle limit, said in `%xla_info`'s note, which
    tells how to free the model without a "fix" label; `release()` says what it freed."""
    from hfxla_nb.demo import demo_dataset, demo_model_dir
    from hfxla_nb.runtime.info import WARM_MODEL
    from hfxla_nb.ui.panels import result_html, result_text, runtime_html, runtime_text

    with pytest.raises(hx.FineTuneError, match="keep_warm='yes'"):
        hx.fine_tune("no-model", [], keep_warm="yes")
    result = hx.fine_tune(demo_model_dir(), demo_dataset(), max_steps=2, batch_size=32,
                          progress=False, output_dir=tmp_path / "run", keep_warm=30)
    assert result.warm and result.session.idle_timeout == 30
    info = hx.detect()
    note = next(p for p in info.problems if "warm session" in p.title)
    assert note.severity == "info" and note.fix == WARM_MODEL
    assert "model of fine_tune (run)" in note.title
    assert "of 30.0 s before it is released" in note.title
    assert "release() on the run's result" in runtime_text(info)
    assert "fix:" not in runtime_text(info) and "Fix:" not in runtime_html(info)
    # The result's panel says what stays held, and until when.
    lease = ("the trained model on 1 device (device memory not reported here); held until "
             "result.release(), 30.0 s without a call, or the kernel's end")
    row = next(line for line in result_text(result).splitlines() if line.strip()
               .startswith("warm "))
    assert row.split(None, 1)[1] == lease, result_text(result)
    assert lease in html.unescape(re.sub(r"<[^>]+>", "", result_html(result)))
    capsys.readouterr()
    result.release()
    assert "released the model of fine_tune (run): 1 device and their memory are free" in (
        capsys.readouterr().out)
    assert not result.warm
    assert "released: its devices and their memory are free" in result_text(result)
    result.release()  # a second time: nothing to free, nothing said
    assert capsys.readouterr().out == ""


# -- in a real kernel: the notebook loop --

kernel = kernel_fixture("""
    import os
    import hfxla_nb as hx
    from hfxla_nb.demo import demo_dataset, demo_model_dir
    from hfxla_nb.demo.lm import demo_lm_dataset, demo_lm_model_dir
    """)


@pytest.mark.kernel
def test_a_fine_tune_in_a_kernel_leaves_its_model_warm_and_predict_forks_and_compiles_nothing(
        kernel, tmp_path):
    run_ok(kernel, f"""
        result = hx.fine_tune(demo_model_dir(), demo_dataset(), max_steps=10, batch_size=32,
                              learning_rate=1e-3, progress=False, output_dir={str(tmp_path)!r},
                              overwrite_output_dir=True)
        trained_in = hx.last_launch().ranks[0].pid
        first = result.predict(["a great film", "a dull film"], progress=False)
        second = result.predict(["a great film", "a dull film"], progress=False)
        """, timeout=300)
    assert kernel.value("result.warm") is True
    assert kernel.value("hx.last_launch().ranks[0].pid == trained_in")  # no new process
    assert kernel.value("second.compiles") == 0
    assert kernel.value("[p['label'] for p in first] == [p['label'] for p in second]")
    assert kernel.value("result.evaluate(demo_dataset()['validation'], progress=False)"
                        " == result.metrics")
    assert kernel.value("hx.detect().runtime_initialized") is False  # the kernel's XLA: off
    assert "result.release() frees them" in kernel.value(
        "__import__('hfxla_nb.ui.panels', fromlist=['next_step']).next_step(result)")
    run_ok(kernel, "result.release()")
    assert kernel.value("result.warm") is False
    assert kernel.value("[p['label'] for p in result.predict(['a great film', 'a dull film'],"
                        " progress=False)] == [p['label'] for p in first]")  # cold, the same


@pytest.mark.kernel
def test_a_warm_causal_lms_generate_never_loads_the_model_in_the_kernel(kernel, tmp_path):
    run_ok(kernel, f"""
        from hfxla_nb.train.result import FineTuneResult

        lm = hx.fine_tune(demo_lm_model_dir(), demo_lm_dataset(200), max_steps=4, batch_size=8,
                          progress=False, output_dir={str(tmp_path)!r}, overwrite_output_dir=True)
        cpu = lm.generate(["the cat"], max_new_tokens=5, device="cpu")

        def refuse(*args, **kwargs):
            raise AssertionError("the model was loaded in the kernel")

        FineTuneResult.load_model = refuse
        warm = lm.generate(["the cat"], max_new_tokens=5, progress=False)
        again = lm.generate(["the cat"], max_new_tokens=5, progress=False)
        """, timeout=300)
    assert kernel.value("warm == again == cpu")  # greedy: the CPU's tokens
    assert kernel.value("hx.last_launch().ranks[0].metrics.compiles") == 0
    streamed = run_ok(kernel, """
        (text,) = lm.generate(["the cat"], max_new_tokens=5, stream=True, progress=False)
        """)
    assert kernel.value("text") in streamed.stdout  # printed as it came, as a launch prints it
    run_ok(kernel, "lm.release()")


@pytest.mark.kernel
def test_a_function_from_a_later_cell_runs_with_the_state_earlier_runs_left(kernel):
    run_ok(kernel, """
        s = hx.session(num_processes=1, strategy="spmd", progress=False)
        s.run(os.getpid)
        """)
    run_ok(kernel, """
        def keep():
            global kept
            kept = 41
        s.run(keep)
        """)
    run_ok(kernel, """
        def uses():
            return kept + 1
        """)
    assert kernel.value("s.run(uses)") == 42
    failed = kernel.run("def bad():\n    raise ValueError('from a cell')\ns.run(bad)")
    trace = "\n".join(failed.error["traceback"])
    assert "ValueError: from a cell" in trace and "Cell In[" in trace
    assert kernel.value("s.alive") is True


@pytest.mark.kernel
def test_a_value_a_cell_changes_is_the_one_the_next_run_reads_on_every_rank(kernel):
    """A plain launch reads the notebook's values as they are; so does a session's run, on
    every rank thread (XLA:CPU replicated over 2 devices); a name a run set with `global`
    keeps the run's value."""
    run_ok(kernel, """
        lr = 1
        s = hx.session(num_processes=2, progress=False)
        def read_lr(index):
            return lr * 10
        first = s.run(read_lr)
        """)
    run_ok(kernel, "lr = 2")
    run_ok(kernel, "second = s.run(read_lr)")
    assert kernel.value("(first, second)") == (10, 20)
    assert kernel.value("[rank.result for rank in hx.last_launch().ranks]") == [20, 20]
    run_ok(kernel, """
        def keep(index):
            global kept
            kept = 41
        s.run(keep)
        kept = 0  # the notebook's own `kept`: the workers keep the one the run set
        def read_kept(index):
            return kept, lr
        """)
    assert kernel.value("s.run(read_kept)") == (41, 2)
    run_ok(kernel, "s.close()")


@pytest.mark.kernel
def test_without_cloudpickle_a_function_changed_after_the_start_is_refused_and_said_so():
    """cloudpickle blocked in the kernel (as where `hfxla_nb[session]` is not installed): the
    session says so when it starts, a function defined before runs, one changed after is
    refused before anything runs, with the fix."""
    kernel = Kernel()
    try:
        run_ok(kernel, """
            import sys
            sys.modules["cloudpickle"] = None  # `import cloudpickle` raises ImportError
            import hfxla_nb as hx
            def read_lr():
                return 1
            s = hx.session(num_processes=1, strategy="spmd", progress=False)
            """)
        started = run_ok(kernel, "first = s.run(read_lr)")
        assert "cloudpickle is not installed" in started.stdout
        assert kernel.value("first") == 1
        assert kernel.value("s.run(read_lr)") == 1  # unchanged: runs by name
        refused = kernel.run("def read_lr():\n    return 2\ns.run(read_lr)")
        assert refused.error["ename"] == "LaunchRefusedError"
        assert "read_lr was defined or changed after this session's workers started" in (
            refused.error["evalue"])
        assert 'pip install "hfxla_nb[session]"' in refused.error["evalue"]
        run_ok(kernel, "s.close()")
    finally:
        kernel.close()


@pytest.mark.kernel
def test_the_stop_button_mid_run_gives_the_cell_back_and_ends_the_sessions_workers(kernel):
    run_ok(kernel, """
        import time
        s = hx.session(num_processes=1, strategy="spmd", progress=False)
        first = s.run(os.getpid)

        def forever():
            print("started", flush=True)
            time.sleep(600)
        """)
    output = kernel.run("s.run(forever)", interrupt_on="started", interrupt_after=1)
    assert output.error is not None and output.error["ename"] == "KeyboardInterrupt"
    assert output.after_interrupt < 15
    assert "the session's workers were stopped" in output.stderr
    assert kernel.value("s.alive") is False
    again = kernel.run("print(s.run(os.getpid) != first)")
    assert again.stdout.strip().endswith("True") and "new workers started" in again.stdout
    run_ok(kernel, "s.close()")


@pytest.mark.kernel
def test_a_killed_kernel_leaves_no_process_of_its_warm_sessions(tmp_path):
    dying = Kernel(TMPDIR=str(tmp_path))  # the note of what was stopped goes there
    try:
        output = dying.run_ok("""
            import hfxla_nb as hx
            s = hx.session(num_processes=1, strategy="spmd", progress=False)
            s.run(print, "warm")
            print(s.info().pids)
            """)
        pids = [int(pid) for pid in output.stdout.split("[")[-1].strip("]\n").split(",")]
        assert pids and all(alive(pid) for pid in pids)
        os.kill(dying.pid, signal.SIGKILL)
        wait_for(lambda: not any(alive(pid) for pid in pids), GONE_WITHIN,
                 "a warm session's process outlived its kernel")
        # Between runs nothing was lost: no "a launch was stopped" note for %xla_info.
        assert notes(tmp_path) == []
    finally:
        dying.close()
