"""`hx.notebook_launcher` as a drop-in for `accelerate.notebook_launcher`: the same
parameters with their meaning, `ChildFailedError` caught as accelerate's users catch it,
accelerate's process indexes inside the function, and a remote traceback that names cells as
IPython does. Launch cases run in one real Jupyter kernel; the rest in this process (every
refusal happens before anything is forked)."""

from __future__ import annotations

import inspect
import re
import textwrap

import pytest

from hfxla_nb.launch.preflight import LaunchRefusedError
from hfxla_nb.launch.worker import tpu_rank_variables
from tests.helpers import kernel_fixture, run_ok, run_python

# A notebook written for accelerate: accelerate (so torch and torch_xla) imported in the kernel.
SETUP = textwrap.dedent(
    """
    import os, warnings
    import pytest
    import accelerate
    import hfxla_nb as hx
    from hfxla_nb import notebook_launcher
    """
)


kernel = kernel_fixture(SETUP)


# -- the signature --------------------------------------------------------------------------


def accelerate_parameters() -> dict[str, object]:
    """`accelerate.notebook_launcher`'s parameters -> defaults, read from its source (importing
    accelerate imports torch: seconds)."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("accelerate")
    source = (Path(spec.origin).parent / "launchers.py").read_text()
    function = next(node for node in ast.walk(ast.parse(source))
                    if isinstance(node, ast.FunctionDef) and node.name == "notebook_launcher")
    arguments = function.args
    assert not arguments.kwonlyargs and not arguments.posonlyargs
    defaults = [inspect.Parameter.empty] * (len(arguments.args) - len(arguments.defaults)) + [
        ast.literal_eval(default) for default in arguments.defaults]
    return {argument.arg: default
            for argument, default in zip(arguments.args, defaults, strict=True)}


@pytest.mark.launch
def test_every_accelerate_parameter_is_ours_in_its_order_with_its_default():
    from hfxla_nb import notebook_launcher
    from hfxla_nb.launch.accelerate import ACCELERATE_DEFAULTS

    theirs = accelerate_parameters()
    ours = inspect.signature(notebook_launcher).parameters
    # A new accelerate parameter fails here until the launcher gives it a meaning; every
    # accelerate parameter can be passed by position as with accelerate.
    assert list(ours)[:len(theirs)] == list(theirs)
    assert all(ours[name].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for name in theirs)
    differ = {name for name, default in theirs.items() if default != ours[name].default}
    # use_port: None picks a free port (accelerate's "29500" clashes between launches).
    assert differ == {"use_port"}
    assert {name: theirs[name] for name in ACCELERATE_DEFAULTS} == ACCELERATE_DEFAULTS
    # This launcher's own options (and those to come) are keyword-only, after accelerate's.
    extra = [p for name, p in ours.items() if name not in theirs]
    assert extra and all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extra)


@pytest.mark.launch
@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"num_nodes": 2}, "num_nodes=2: notebook_launcher starts processes on this host only"),
        ({"node_rank": 1}, "node_rank=1 must be less than num_nodes=1"),
        ({"max_restarts": -1}, "max_restarts must be a whole number >= 0"),
        ({"monitor_interval": 0}, "monitor_interval must be a positive number of seconds"),
        ({"use_port": "http"}, "use_port must be a TCP port"),
        ({"rdzv_endpoint": "29500"}, "write it as 'host:port'"),
        ({"log_line_prefix_template": "${node}: "}, "unknown field(s) node"),
    ],
)
def test_impossible_accelerate_values_are_refused_before_forking(options, says):
    from hfxla_nb import last_launch, notebook_launcher

    before = last_launch()
    with pytest.raises(LaunchRefusedError, match=re.escape(says)):
        notebook_launcher(lambda: None, **options)
    assert last_launch() is before  # nothing was launched


@pytest.mark.launch
def test_import_of_the_launcher_stays_free_of_torch():
    found = run_python(
        """
        import json, sys
        import hfxla_nb.launch.launcher
        print(json.dumps(sorted(m for m in ("torch", "torch_xla", "torch.distributed.elastic")
                                if m in sys.modules)))
        """
    )
    assert found == []


# -- launches in a kernel -----------------------------------------------------------------


@pytest.mark.kernel
def test_max_restarts_relaunches_until_the_function_succeeds(kernel, tmp_path):
    counter = tmp_path / "attempts"
    output = run_ok(
        kernel,
        f"""
        def train(counter):  # written for accelerate: fails twice, then succeeds
            done = int(open(counter).read()) if os.path.exists(counter) else 0
            with open(counter, "w") as file:
                file.write(str(done + 1))
            if done < 2:
                raise RuntimeError(f"transient failure {{done + 1}}")
            print("succeeded on try", done + 1)
            return done + 1

        value = notebook_launcher(train, ({str(counter)!r},), num_processes=1, max_restarts=3,
                                  monitor_interval=0.01, progress="console")
        print("VALUE", value)
        """,
    )
    assert "VALUE 3" in output.stdout and "succeeded on try 3" in output.stdout
    # Each attempt's panel says which it is, in its status line.
    statuses = [line for line in output.stdout.splitlines() if line.startswith(("✔", "✖"))]
    assert len(statuses) == 3, output.stdout
    for number, status in enumerate(statuses, start=1):
        assert f"(attempt {number} of 4)" in status, status
    assert statuses[-1].startswith("✔ launch finished in ")
    assert statuses[0].startswith("✖ launch failed after ")
    assert "attempt 1 of 4 failed (rank 0 failed: RuntimeError: transient failure 1.)" in \
        output.stderr
    assert "attempt 2 of 4." in output.stderr and "attempt 3 of 4." in output.stderr
    attempts = kernel.value(
        "[(r.attempt, r.max_attempts, str(r.outcome), r.ranks[0].error) "
        "for r in hx.last_launch().attempts]")
    assert attempts == [
        (1, 4, "failed", "RuntimeError: transient failure 1"),
        (2, 4, "failed", "RuntimeError: transient failure 2"),
        (3, 4, "finished", None),
    ]
    assert kernel.value("str(hx.last_launch()).splitlines()[0].endswith('(attempt 3 of 4)')")
    assert counter.read_text() == "3"


@pytest.mark.kernel
def test_child_failed_error_catches_a_failing_launch_with_the_childs_message(kernel):
    output = run_ok(
        kernel,
        """
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

        def train():
            raise ValueError("bad batch 7 in the child")

        with pytest.raises(ChildFailedError, match="bad batch 7 in the child") as caught:
            notebook_launcher(train, num_processes=1, max_restarts=1, progress=False)
        error = caught.value
        print("TYPES", type(error).__name__, isinstance(error, hx.LaunchError))
        print("FAILURES", {rank: f.message for rank, f in error.failures.items()})
        print("ATTEMPTS", [str(r.outcome) for r in error.record.attempts])
        """,
    )
    assert "TYPES LaunchError True" in output.stdout
    assert "FAILURES {0: 'ValueError: bad batch 7 in the child'}" in output.stdout
    assert "ATTEMPTS ['failed', 'failed']" in output.stdout


@pytest.mark.kernel
def test_remote_traceback_names_the_cell_ends_with_the_exception_and_hides_the_launcher(
        kernel):
    # The same function raising in the kernel: IPython's own name for its line.
    direct = kernel.run(textwrap.dedent(
        """
        def train():
            values = [1, 2, 3]
            return values[7]

        train()
        """))
    shown_by_ipython = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(direct.error["traceback"]))
    cell = re.search(r"Cell In\[(\d+)\], line 3", shown_by_ipython).group(1)
    output = kernel.run("notebook_launcher(train, num_processes=1, progress=False)")
    assert output.error is not None and output.error["ename"] == "LaunchError"
    message = output.error["evalue"]
    remote = message.split("Remote traceback (rank 0):\n")[1]
    assert f"Cell In[{cell}], line 3, in train" in remote  # as IPython names it
    assert "ipykernel_" not in remote
    assert remote.rstrip().splitlines()[-1] == "IndexError: list index out of range"
    assert "launcher.py" not in remote and "worker.py" not in remote
    shown = "\n".join(output.error["traceback"])
    assert "notebook_launcher(train" in shown  # the user's line...
    assert "launcher.py" not in shown and "hfxla_nb" not in shown.split("LaunchError")[0]


@pytest.mark.kernel
def test_accelerate_parameters_act_or_say_once_that_they_do_not(kernel):
    code = """
        def train(index):
            print("hello from", index)

        notebook_launcher(train, (), 2, "no", "29500", "127.0.0.1", 0, 1, "c10d", "", None,
                          "run-1", 0, 0.05, "<${rank}|${local_rank}> ", strategy="spmd",
                          progress=False)
        """
    first = run_ok(kernel, code)
    assert "<0|0> hello from 0" in first.stdout
    note = ("UserWarning: hfxla_nb: rdzv_backend='c10d', rdzv_id='run-1' have no meaning for a "
            "single-host fork launch; ignored.")
    assert first.stderr.count(note) == 1, first.stderr
    again = run_ok(kernel, code)
    assert "no meaning" not in again.stderr  # said once


@pytest.mark.kernel
def test_debug_rendezvous_is_at_rdzv_endpoint(kernel):
    output = run_ok(
        kernel,
        """
        import socket
        with socket.socket() as probe:
            probe.bind(("127.0.0.2", 0))
            port = probe.getsockname()[1]

        def where(index):  # the gloo group's store: where the ranks met
            from torch.distributed.distributed_c10d import _get_default_store
            store = _get_default_store()
            while hasattr(store, "underlying_store"):
                store = store.underlying_store
            return store.host, store.port

        print("SEEN", notebook_launcher(where, num_processes=2, strategy="debug",
                                        rdzv_endpoint=f"127.0.0.2:{port}", progress=False),
              port)
        """,
    )
    port = output.stdout.split("SEEN")[1].split()[-1]
    assert f"SEEN ('127.0.0.2', {port}) {port}" in output.stdout


def test_a_rank_thread_starts_with_none_of_the_state_another_rank_left_on_it():
    """xmp.spawn's pool can run a second rank on the thread of a finished one (a loaded
    machine); accelerate's per-thread state is cleared at each rank's start, in that thread
    only."""
    import threading

    from accelerate import state

    from hfxla_nb.launch.accelerate import forget_thread_state

    assert isinstance(vars(state.PartialState)["_shared_state"], threading.local)
    state.PartialState._shared_state["kept"] = "the notebook's thread"
    seen = []

    def two_ranks_on_one_thread():
        state.PartialState._shared_state["process_index"] = 0  # the first rank's state
        forget_thread_state()  # the next rank starts
        seen.append(dict(state.PartialState._shared_state))

    thread = threading.Thread(target=two_ranks_on_one_thread)
    thread.start()
    thread.join()
    assert seen == [{}]
    assert state.PartialState._shared_state.pop("kept") == "the notebook's thread"


@pytest.mark.kernel
def test_accelerate_partial_state_has_each_ranks_indexes(kernel):
    output = run_ok(
        kernel,
        """
        def indexes():
            from accelerate import PartialState
            state = PartialState()
            return state.process_index, state.local_process_index, state.num_processes

        notebook_launcher(indexes, num_processes=2, progress=False)
        print("REPLICATED", hx.last_launch().results)
        print("SPMD", notebook_launcher(indexes, num_processes=2, strategy="spmd",
                                        progress=False))

        def gloo_world():
            import torch
            import torch.distributed as dist
            from accelerate import Accelerator
            accelerator = Accelerator()
            total = torch.tensor([accelerator.process_index + 1.0])
            dist.all_reduce(total)  # accelerate's world is the launch's gloo group
            return (*indexes(), accelerator.num_processes, accelerator.device.type,
                    int(total))

        notebook_launcher(gloo_world, num_processes=3, strategy="debug", progress=False)
        print("DEBUG", hx.last_launch().results)
        """,
    )
    # Two rank threads of one XLA:CPU process: each its own indexes (was -1 for both).
    assert "REPLICATED [(0, 0, 2), (1, 1, 2)]" in output.stdout
    assert "SPMD (0, 0, 1)" in output.stdout
    # Three CPU processes joined by gloo: accelerate's CPU world of 3, as under its own CPU
    # launcher (each process said "process 0 of 1" from its own XLA client).
    assert "DEBUG [(0, 0, 3, 3, 'cpu', 6), (1, 1, 3, 3, 'cpu', 6), (2, 2, 3, 3, 'cpu', 6)]" in (
        output.stdout)


# -- TPU hosts: from the variables torch_xla's xmp.spawn sets in each process ---------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        # v4-8, one host, process 2 of 4 (one chip each).
        ({"PJRT_LOCAL_PROCESS_RANK": "2", "PJRT_LOCAL_PROCESS_COUNT": "4",
          "CLOUD_TPU_TASK_ID": "2", "TPU_PROCESS_BOUNDS": "2,2,1",
          "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_VISIBLE_CHIPS": "2"},
         {"RANK": "2", "LOCAL_RANK": "2", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}),
        # v4-16, second host (worker 1), its process 3: task 1 * 4 + 3.
        ({"PJRT_LOCAL_PROCESS_RANK": "3", "PJRT_LOCAL_PROCESS_COUNT": "4",
          "CLOUD_TPU_TASK_ID": "7", "TPU_PROCESS_BOUNDS": "2,2,2"},
         {"RANK": "7", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}),
        # v5e-1 (Colab): one process.
        ({"PJRT_LOCAL_PROCESS_RANK": "0", "PJRT_LOCAL_PROCESS_COUNT": "1"},
         {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}),
        ({"PJRT_DEVICE": "CPU"}, None),
    ],
    ids=["v4-8", "v4-16-host1", "v5e-1", "not-tpu"],
)
def test_tpu_rank_variables_from_torch_xla_variables(environ, expected):
    assert tpu_rank_variables(environ) == expected


# -- the error and the traceback, as data ----------------------------------------------------


def test_launch_error_is_a_child_failed_error_with_each_failed_rank():
    import pickle

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from hfxla_nb.launch.errors import LaunchError
    from hfxla_nb.launch.supervision import LaunchRecord, RankRecord

    record = LaunchRecord("debug", 3, [
        RankRecord(0, exit_state="stopped"),
        RankRecord(1, pid=41, exit_state="killed", reason="killed by SIGKILL", signal=9,
                   error="process 41 killed by SIGKILL"),
        RankRecord(2, pid=42, exit_state="failed", reason="raised ValueError",
                   error="ValueError: boom"),
    ])
    error = LaunchError("rank 2 failed: ValueError: boom.", record)
    assert isinstance(error, ChildFailedError) and isinstance(error, RuntimeError)
    assert str(error) == "rank 2 failed: ValueError: boom."
    assert {rank: (f.pid, f.exitcode, f.message) for rank, f in error.failures.items()} == {
        1: (41, -9, "process 41 killed by SIGKILL"), 2: (42, 1, "ValueError: boom")}
    assert "ValueError: boom" in error.format_msg()  # torchelastic's own summary works
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is LaunchError and str(again) == str(error)
    assert again.record.ranks[2].error == "ValueError: boom"


def test_cells_are_named_as_ipython_names_them():
    from hfxla_nb.observe.tracing import name_cells

    traceback = (
        'Traceback (most recent call last):\n'
        '  File "/tmp/ipykernel_7/2093.py", line 12, in train\n'
        '    step(batch)\n'
        '  File "<ipython-input-4-0a1b2c3d>", line 3, in step\n'
        '    raise ValueError("bad")\n'
        '  File "/usr/lib/python3/site-packages/torch/nn/module.py", line 9, in f\n'
        'ValueError: bad\n')
    assert name_cells(traceback, {"/tmp/ipykernel_7/2093.py": 5}) == (
        'Traceback (most recent call last):\n'
        '  Cell In[5], line 12, in train\n'
        '    step(batch)\n'
        '  Cell In[4], line 3, in step\n'
        '    raise ValueError("bad")\n'
        '  File "/usr/lib/python3/site-packages/torch/nn/module.py", line 9, in f\n'
        'ValueError: bad\n')


@pytest.mark.launch
def test_a_debug_process_gives_accelerate_its_gloo_world_when_accelerate_comes_later():
    # What a debug process does after its gloo group is up, where the function imports
    # accelerate only itself (the kernel test above imported it before the fork).
    found = run_python(
        """
        import json, os, socket, sys
        import torch.distributed as dist
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        os.environ.update(RANK="1", LOCAL_RANK="1", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1)
        from hfxla_nb.launch.accelerate import gloo_world_for_accelerate
        gloo_world_for_accelerate()
        before = "accelerate" in sys.modules
        from accelerate import PartialState
        from accelerate.utils import is_torch_xla_available
        state = PartialState()
        print(json.dumps([before, str(state.distributed_type), state.backend,
                          state.num_processes, state.local_process_index,
                          is_torch_xla_available(), os.environ["ACCELERATE_USE_CPU"]]))
        """
    )
    # Made when accelerate.state was imported; torch_xla is still available to everyone else.
    assert found == [False, "DistributedType.MULTI_CPU", "gloo", 1, 1, True, "yes"]


def test_record_says_its_attempt():
    from hfxla_nb.launch.supervision import LaunchRecord, RankRecord

    first = LaunchRecord("spmd", 1, [RankRecord(0)], outcome="failed", attempt=1,
                         max_attempts=2)
    second = LaunchRecord("spmd", 1, [RankRecord(0, duration=65.2)], duration=65.4,
                          outcome="finished", attempt=2, max_attempts=2,
                          previous_attempts=[first])
    assert second.attempts == [first, second] and first.attempts == [first]
    # Durations in the panels' one format (`_words.duration`), not "65.4s".
    assert str(second).splitlines() == [
        "spmd launch, 1 rank: finished in 1 min 05 s (attempt 2 of 2)",
        "  rank 0: pending, 1 min 05 s",
    ]
    assert LaunchRecord("spmd", 1, [RankRecord(0)]).attempt_text == ""
