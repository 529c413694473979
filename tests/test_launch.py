"""notebook_launcher in real Jupyter kernels: fork from ipykernel is the case that matters.

One kernel serves the launches that leave it usable (each test also checks that); the
pre-flight refusal after `torch_xla.device()` gets a kernel of its own, since it poisons it.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from hfxla_nb.launch import group_processes
from tests.helpers import Kernel, kernel_fixture, run_ok, run_python

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parents[1]

SETUP = textwrap.dedent(
    """
    import os, sys, time, signal
    import hfxla_nb
    import hfxla_nb as hx
    from hfxla_nb.launch import last_launch, LaunchError, group_processes

    def leftovers():
        record = last_launch()
        return group_processes(record.process_group) if record else []
    """
)


# A forked worker never sends on the kernel's sockets (ipykernel would log each attempt).
kernel = kernel_fixture(SETUP, fork_quiet=True)


def assert_clean(kernel: Kernel) -> None:
    """No process of the last launch is left, and the kernel never started the runtime."""
    assert kernel.value("leftovers()") == []
    group = kernel.value("last_launch().process_group")
    assert group_processes(group) == []
    assert kernel.value("hfxla_nb._xla.runtime_is_initialized()") is False


@pytest.mark.launch
def test_the_launch_defaults_are_written_once_and_the_strategy_docs_agree():
    """`LaunchOptions` holds `notebook_launcher`'s defaults; the signature reads them from
    there (shift-tab shows the values). The default strategy is "replicated", accelerate's
    semantics, said so in the docstring and docs/launcher.md; `fine_tune` uses "spmd"."""
    import dataclasses
    import inspect

    from hfxla_nb.launch import LaunchOptions, notebook_launcher
    from hfxla_nb.train import FineTuneConfig

    options = LaunchOptions()  # every default, from one place
    parameters = inspect.signature(notebook_launcher).parameters
    names = [field.name for field in dataclasses.fields(LaunchOptions)]
    assert names == list(parameters)[2:]  # after `function` and `args`
    for name in names:
        assert parameters[name].default == getattr(options, name), name
    source = inspect.getsource(notebook_launcher).split('"""')[0]
    assert all(f" = _DEFAULTS.{name}," in source for name in names)
    assert LaunchOptions(strategy="spmd").timeout is options.timeout is None

    assert options.strategy == "replicated" and FineTuneConfig().strategy == "spmd"
    doc = notebook_launcher.__doc__
    entry = doc[doc.index("strategy:"):doc.index("timeout:")]
    assert '"replicated", the default' in entry and "recommended" not in entry
    assert "`fine_tune`" in entry
    page = (ROOT / "docs/launcher.md").read_text()
    assert '| `"replicated"` (default) |' in page
    assert '`"replicated"` is the default because it is what accelerate\'s launcher does' in page


def test_replicated_one_device_returns_value_and_output(kernel):
    output = run_ok(
        kernel,
        """
        def train(index, scale):
            import torch, torch_xla
            x = torch.arange(4.0, device=torch_xla.device()) * scale
            print(f"sum on rank {index}:", x.sum().item())
            return {"rank": index, "sum": x.sum().item()}

        value = hx.notebook_launcher(train, args=(2.0,), progress=False)
        print("VALUE", value)
        """,
    )
    assert "sum on rank 0: 12.0" in output.stdout
    assert "[rank" not in output.stdout  # one rank: no prefix
    assert "VALUE {'rank': 0, 'sum': 12.0}" in output.stdout
    record = kernel.value("(last_launch().outcome, last_launch().world, last_launch().results)")
    assert record == ("finished", 1, [{"rank": 0, "sum": 12.0}])
    # Where xmp.spawn would fork one process (XLA:CPU), the supervisor is that process: no
    # second fork of a process as big as the kernel (`bench/launch_latency.py` times it).
    assert kernel.value("last_launch().ranks[0].pid == last_launch().process_group") is True
    assert_clean(kernel)


def test_all_ranks_output_is_prefixed(kernel):
    output = run_ok(
        kernel,
        """
        def hello(index):
            print(f"hello {index}")
            time.sleep(0.5 * index)  # each rank takes its own time
            return index * 10

        value = hx.notebook_launcher(hello, num_processes=3, strategy="debug", output="all",
                                     progress=False)
        print("VALUE", value, last_launch().results)
        """,
    )
    for rank in range(3):
        assert f"[rank {rank}] hello {rank}\n" in output.stdout
    assert "VALUE 0 [0, 10, 20]" in output.stdout
    # hx.last_launch(): every rank's value, exit state and its own duration, also as a frame.
    durations = kernel.value("[r.duration for r in last_launch().ranks]")
    assert all(0.5 * rank <= seconds < 0.5 * rank + 10 for rank, seconds in enumerate(durations))
    assert durations[2] > durations[0]  # rank 2 slept 1 s longer than rank 0
    assert kernel.value("[r.exit_state for r in last_launch().ranks]") == ["finished"] * 3
    assert kernel.value("list(last_launch().to_dataframe()['duration'])") == durations
    assert_clean(kernel)


def test_output_lists_and_none_filter_what_reaches_the_cell(kernel):
    output = run_ok(
        kernel,
        """
        def hello(index):
            print(f"hello {index}")
            print(f"oops {index}", file=sys.stderr)
            return index

        hx.notebook_launcher(hello, num_processes=3, strategy="debug", output=[1, 2],
                             progress=False)
        """,
    )
    assert "[rank 1] hello 1\n" in output.stdout and "[rank 2] hello 2\n" in output.stdout
    assert "[rank 2] oops 2\n" in output.stderr  # stderr stays stderr
    assert "hello 0" not in output.text
    silent = run_ok(
        kernel,
        """
        hx.notebook_launcher(hello, num_processes=2, strategy="debug", output="none",
                             progress=False)
        """,
    )
    assert "hello" not in silent.text and "oops" not in silent.text
    assert kernel.value("last_launch().results") == [0, 1]
    assert_clean(kernel)


def test_native_output_keeps_its_stream_and_its_rank(kernel):
    output = run_ok(
        kernel,
        """
        def native(index):
            os.write(1, b"native stdout line\\n")
            os.write(2, b"native stderr line\\n")
            return 1

        hx.notebook_launcher(native, progress=False)
        """,
    )
    # fd 1 stays stdout and fd 2 stays stderr; one rank: no tag.
    assert "native stdout line\n" in output.stdout and "native stderr line\n" in output.stderr
    tagged = run_ok(
        kernel,
        """
        def native_ranks(index):
            os.write(1, f"native out {index}\\n".encode())
            os.write(2, f"native err {index}\\n".encode())

        hx.notebook_launcher(native_ranks, num_processes=3, strategy="debug", output=[0, 2],
                             progress=False)
        """,
    )
    for rank in (0, 2):
        assert f"[rank {rank}] native out {rank}\n" in tagged.stdout
        assert f"[rank {rank}] native err {rank}\n" in tagged.stderr
    assert "native out 1" not in tagged.text and "native err 1" not in tagged.text
    assert_clean(kernel)


def test_debug_forks_one_process_per_rank_joined_by_gloo(kernel):
    run_ok(
        kernel,
        """
        def who(index):
            import torch.distributed as dist
            return [os.getpid(), os.getppid() != kernel_pid, dist.get_backend(),
                    dist.get_world_size(), dist.get_rank(), index]

        kernel_pid = os.getpid()
        hx.notebook_launcher(who, num_processes=3, strategy="debug", progress=False)
        """,
    )
    ranks = kernel.value("last_launch().results")
    pids = {pid for pid, *_ in ranks}
    assert len(pids) == 3 and kernel.value("os.getpid()") not in pids  # three forked processes
    assert [rest for _, *rest in ranks] == [[True, "gloo", 3, rank, rank] for rank in range(3)]
    assert_clean(kernel)


def test_use_port_is_the_debug_rendezvous_port(kernel):
    output = run_ok(
        kernel,
        """
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]

        def where(index):
            import torch.distributed as dist
            return (os.environ["MASTER_PORT"], dist.get_world_size(), dist.get_rank())

        print("VALUE", port, hx.notebook_launcher(where, num_processes=2, strategy="debug",
                                                  use_port=port, progress=False))
        """,
    )
    line = next(line for line in output.stdout.splitlines() if line.startswith("VALUE"))
    _, port, value = line.split(" ", 2)
    assert value == f"('{port}', 2, 0)"
    assert_clean(kernel)


def test_a_frozen_process_is_stopped_by_heartbeat_timeout(kernel):
    output = kernel.run(
        textwrap.dedent(
            """
            def freeze(index):
                os.kill(os.getpid(), signal.SIGSTOP)  # no heartbeat thread runs any more
                # The stop reaches the thread that sent it a moment after `kill` returns
                # (another thread took the signal): without this, under load the function
                # returned and the rank finished first.
                time.sleep(600)

            hx.notebook_launcher(freeze, heartbeat_timeout=3, progress=False)
            """
        ),
        timeout=90,
    )
    assert output.error is not None and output.error["ename"] == "LaunchError"
    assert "no heartbeat for" in output.error["evalue"] and "frozen" in output.error["evalue"]
    assert kernel.value("last_launch().ranks[0].exit_state") == "timeout"
    assert_clean(kernel)


def test_a_rank_stopped_by_timeout_shows_the_line_of_its_cell_it_was_at(kernel):
    """`timeout=` stops a rank blocked in `time.sleep` in the user's code: the error and
    `last_launch().ranks[r].stack` say where, named as the cell that defined it."""
    output = kernel.run(textwrap.dedent(
        """
        def stuck(index):
            ready = index
            time.sleep(600)

        hx.notebook_launcher(stuck, num_processes=2, timeout=8, progress=False)
        """), timeout=90)
    assert output.error is not None and output.error["ename"] == "LaunchError"
    message = output.error["evalue"]
    assert "Where rank 0 was when it was stopped" in message, message
    assert re.search(r"Cell In\[\d+\], line 3 in stuck", message), message
    assert "Rank 1 runs in the process of rank 0." in message  # XLA:CPU: one process
    assert "in supervise" not in message and "notebook_launcher" not in message  # launcher's
    assert re.search(r"line 3 in stuck", kernel.value("last_launch().ranks[1].stack"))
    assert_clean(kernel)


def test_a_rank_waiting_in_a_collective_shows_its_line_when_stopped(kernel):
    """Rank 0 waits in an all-reduce that rank 1 never joins: the stack names the line that
    waits for it. (XLA:CPU aborts such a collective after 10 s from its start; the launch's
    `timeout=` comes first. On a TPU it waits for ever.)"""
    output = kernel.run(textwrap.dedent(
        """
        def one_rank_missing(index):
            import torch, torch_xla.core.xla_model as xm
            if index == 1:
                time.sleep(600)
            total = xm.all_reduce("sum", torch.ones(2, device=xm.xla_device()))
            return total.cpu().tolist()

        hx.notebook_launcher(one_rank_missing, num_processes=2, timeout=9, progress=False)
        """), timeout=120)
    assert output.error is not None and output.error["ename"] == "LaunchError"
    stack = kernel.value("last_launch().ranks[0].stack")
    assert re.search(r"line 6 in one_rank_missing", stack), stack
    assert re.search(r"line 4 in one_rank_missing", stack), stack  # rank 1's thread
    assert_clean(kernel)


def test_a_rank_quiet_past_the_warning_is_named_with_its_line(kernel):
    """A rank whose process sends nothing (here: a builtin loop that holds the GIL, so the
    heartbeat thread cannot run) is named with the line it is at, once."""
    output = run_ok(kernel, """
        import hfxla_nb.observe.reader as reader
        reader.HEARTBEAT_WARNING, warning = 5.0, reader.HEARTBEAT_WARNING

        def busy(index):
            return sum(range(1_000_000_000))

        try:
            hx.notebook_launcher(busy, num_processes=1, progress=False)
        finally:
            reader.HEARTBEAT_WARNING = warning
        """, timeout=120)
    assert "rank 0 has sent nothing for" in output.stderr, output.stderr
    assert re.search(r"rank 0 is at Cell In\[\d+\], line 5 in busy", output.stderr), output.stderr
    assert output.stderr.count("rank 0 is at") == 1
    assert_clean(kernel)


def test_a_supervisor_that_never_exits_is_stopped_once_its_ranks_finished(kernel):
    """Every rank finished, then the process froze on its way out (a runtime's shutdown that
    hangs): the cell returns the result after `EXIT_GRACE`, and the process is stopped."""
    output = run_ok(
        kernel,
        """
        import hfxla_nb.launch.supervision as watching
        watching.EXIT_GRACE, grace = 3.0, watching.EXIT_GRACE

        def finish_then_freeze():
            import hfxla_nb.launch.worker as worker  # this process is the supervisor
            worker.exit_process = lambda code: os.kill(os.getpid(), signal.SIGSTOP)
            return "done"

        started = time.monotonic()
        try:
            value = hx.notebook_launcher(finish_then_freeze, progress=False)
        finally:
            watching.EXIT_GRACE = grace
        print("VALUE", value, round(time.monotonic() - started))
        """,
    )
    assert "VALUE done" in output.stdout
    assert kernel.value("last_launch().outcome") == "finished"
    assert kernel.value("last_launch().ranks[0].exit_state") == "finished"
    notes = kernel.value("last_launch().notes")
    assert any("had not exited 3s later" in note for note in notes), notes
    assert_clean(kernel)


def test_a_busy_rank_keeps_sending_heartbeats(kernel):
    """Each process that runs ranks sends its own heartbeats (xmp.spawn's pool processes too),
    so a function busy for longer than `heartbeat_timeout` is not taken for a frozen one.

    No sleep decides it: the function stays busy until a thread of the kernel has seen the
    launcher receive heartbeats over twice `heartbeat_timeout`, then lets it return."""
    output = run_ok(
        kernel,
        """
        import tempfile, threading
        release = tempfile.mktemp()

        def busy(index):
            while not os.path.exists(release):  # busy until the kernel says so
                time.sleep(0.05)
            return "still alive"

        def release_after_heartbeats(timeout):
            first = None
            while not os.path.exists(release):
                rank = last_launch().ranks[0] if last_launch() else None
                if rank is not None and rank.exit_state == "running" and rank.last_seen:
                    first = first or rank.last_seen
                    if rank.last_seen - first > 2 * timeout:
                        open(release, "w").close()
                time.sleep(0.05)

        watcher = threading.Thread(target=release_after_heartbeats, args=(3,), daemon=True)
        watcher.start()
        try:
            print("VALUE", hx.notebook_launcher(busy, heartbeat_timeout=3, progress=False))
        finally:
            open(release, "a").close()  # the watcher stops whatever happened
            watcher.join()
        """,
        timeout=120,
    )
    assert "VALUE still alive" in output.stdout
    assert kernel.value("last_launch().ranks[0].exit_state") == "finished"
    assert_clean(kernel)


def test_cuda_initialized_in_the_kernel_is_refused():
    # No GPU exists here: torch.cuda's answers are replaced in a kernel of its own.
    kernel = Kernel()
    try:
        output = kernel.run(textwrap.dedent(
            """
            import torch, hfxla_nb, hfxla_nb as hx
            torch.cuda.is_available = lambda: True
            torch.cuda.is_initialized = lambda: True
            hx.notebook_launcher(lambda i: i)
            """), timeout=60)
        assert output.error is not None and output.error["ename"] == "LaunchRefusedError"
        assert "CUDA is already initialized" in output.error["evalue"]
        assert kernel.value("hfxla_nb.launch.last_launch() is None") is True
    finally:
        kernel.close()


RANK_THREADS = """
    import json, os, threading
    os.environ["CPU_NUM_DEVICES"] = "8"
    import torch, torch_xla
    import torch_xla.debug.metrics as met
    from hfxla_nb import _xla

    barrier = threading.Barrier(8)

    def first_item(index):
        value = torch.ones(2, device=torch_xla.device()).sum()
        torch_xla.sync()
        barrier.wait()  # every rank's first .item() at the same moment
        value.item()

    _xla.spawn(first_item)  # XLA on the CPU: one process, a thread per device
    print(json.dumps({"items": met.counter_value(_xla.ITEM_OP)}))
"""


@pytest.mark.launch
def test_rank_threads_reading_their_first_item_at_once_never_crash_and_count_only_theirs():
    # Without the fallback counter made ahead, about one in six of these processes died of
    # SIGSEGV inside torch_xla's `xla_fallback`; three fresh processes give the race its chances.
    for _ in range(3):
        assert run_python(RANK_THREADS, timeout=60) == {"items": 8}


def test_spmd_sees_four_virtual_devices(kernel):
    output = run_ok(
        kernel,
        """
        def devices(index):
            import torch_xla.runtime as xr
            return (index, xr.is_spmd(), xr.global_runtime_device_count())

        print("VALUE", hx.notebook_launcher(devices, num_processes=4, strategy="spmd",
                                            progress=False))
        """,
    )
    assert "VALUE (0, True, 4)" in output.stdout
    # the virtual devices were the worker's business: the kernel's environment is untouched
    assert kernel.value("os.environ.get('CPU_NUM_DEVICES')") is None
    assert_clean(kernel)


def test_a_loop_counted_from_0_ends_at_its_total_with_its_figures_as_data(kernel):
    output = run_ok(
        kernel,
        """
        def loop(index):
            import torch, torch_xla
            device = torch_xla.device()
            for i in range(12):  # what enumerate(loader) gives: steps 0 ... 11 of 12
                x = torch.full((4, 4), float(i), device=device)
                hx.report(step=i, total=12, loss=x.mean(), log_every=5)
                torch_xla.sync()
            return "done"

        hx.notebook_launcher(loop, strategy="spmd", num_processes=1, progress="console")
        record = last_launch()
        figures = record.ranks[0].metrics
        frame = record.to_dataframe()
        print("FIGURES", figures.steps, figures.executions, figures.compiles,
              figures.transfers_from_device, len(figures.step_times), figures.shared_with)
        print("FRAME", type(frame).__name__, list(frame["rank"]),
              list(frame["executions"]) == [figures.executions])
        """,
        timeout=180,
    )
    final = output.stdout[output.stdout.rindex("✔ launch finished"):]
    (bar,) = [line for line in final.splitlines() if line.startswith("train ✔ |")]
    # Counted from 0: step=i is i + 1 steps done, so the bar ends at its total with its check
    # mark and the last step's own value, and every figure counts the same 12 steps.
    assert "| 12/12 · " in bar and bar.endswith(" · loss=11")
    assert "step=i + 1" not in final and "XLA in 12 steps" in final
    figures = output.stdout.split("FIGURES ")[1].split()
    steps, executions, compiles, transfers, step_times = (int(v) for v in figures[:5])
    assert (steps, executions) == (12, 12) and compiles >= 1 and step_times >= 1
    assert transfers >= 2  # at least the first step's fetch and the last one's
    assert "FRAME DataFrame [0] True" in output.stdout
    assert_clean(kernel)


def test_hbm_exhaustion_is_said_first_in_one_line_with_its_fixes(kernel):
    """A worker dying of XLA's RESOURCE_EXHAUSTED (the real text of LWM #60) gets a first line
    with the figures and the fixes; the allocator's whole text stays in the message."""
    allocator_text = (ROOT / "tests/data/hbm/lwm_60_compile_v3.txt").read_text().split("\n", 1)[1]
    output = kernel.run(textwrap.dedent(
        f"""
        def out_of_memory(index):
            raise RuntimeError({allocator_text!r})

        hx.notebook_launcher(out_of_memory, num_processes=1, strategy="debug", progress=False)
        """), timeout=90)
    assert output.error is not None and output.error["ename"] == "LaunchError"
    first, *rest = output.error["evalue"].splitlines()
    assert first.startswith("TPU memory (HBM) exhausted while compiling in ")
    assert first.endswith(": the program needs 21.95 GiB of the 15.48 GiB one device has "
                          "(6.47 GiB too much).")
    assert rest[0] == "What would make it fit, cheapest first:"
    assert "rank 0 failed: RuntimeError" in output.error["evalue"]
    assert "Ran out of memory in memory space hbm" in output.error["evalue"]
    assert_clean(kernel)


def test_exception_in_rank_1_of_4_stops_all_and_names_it(kernel):
    output = kernel.run(
        textwrap.dedent(
            """
            import tempfile
            raised_at = tempfile.mktemp()

            def flaky(index):
                if index == 1:
                    with open(raised_at, "w") as file:
                        file.write(repr(time.time()))
                    raise ValueError("bad batch on rank one")
                time.sleep(60)

            try:
                hx.notebook_launcher(flaky, num_processes=4, strategy="debug", progress=False)
            finally:
                print("STOPPED_AFTER", time.time() - float(open(raised_at).read()))
            """
        ),
        timeout=90,
    )
    assert output.error is not None and output.error["ename"] == "LaunchError"
    message = output.error["evalue"]
    assert "rank 1 failed: ValueError: bad batch on rank one" in message
    assert "Remote traceback (rank 1)" in message and 'raise ValueError("bad batch' in message
    stopped_after = float(output.stdout.split("STOPPED_AFTER")[1])
    # README: every rank stopped within 10 seconds of the exception (not after sleep(60)).
    assert stopped_after < 10, stopped_after
    states = kernel.value("[r.exit_state for r in last_launch().ranks]")
    assert states[1] == "failed" and set(states[:1] + states[2:]) == {"stopped"}
    assert_clean(kernel)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL"),
        ("os._exit(3)", "exited with code 3"),
    ],
)
def test_worker_killed_or_exiting_is_named(kernel, body, expected):
    output = kernel.run(
        textwrap.dedent(
            f"""
            def dies(index):
                time.sleep(0.5)
                {body}

            hx.notebook_launcher(dies, progress=False)
            """
        ),
        timeout=90,
    )
    assert output.error is not None and output.error["ename"] == "LaunchError"
    assert expected in output.error["evalue"]
    if "SIGKILL" in expected:
        assert "out-of-memory" in output.error["evalue"]
    assert kernel.value("last_launch().ranks[0].exit_state") == "killed"
    assert_clean(kernel)


def test_timeout_names_the_stalled_ranks(kernel):
    output = kernel.run(
        textwrap.dedent(
            """
            def stalls(index):
                for step in range(1, 4 + index):  # rank 1 stops at step 4, rank 2 at step 5
                    hx.report(step=step, total=10)
                    time.sleep(0.3)  # a step longer than the reports' throttle: each is sent
                if index == 0:
                    return "finished"
                while True:
                    time.sleep(0.05)

            hx.notebook_launcher(stalls, num_processes=3, strategy="debug", timeout=15,
                                 progress=False)
            """
        ),
        timeout=90,
    )
    assert output.error is not None and output.error["ename"] == "LaunchError"
    message = output.error["evalue"]
    assert "timed out after 15s" in message
    assert "Still running: rank 1 at step 4, rank 2 at step 5." in message
    assert "rank 0" not in message  # it had finished: not a stalled rank
    assert kernel.value("last_launch().outcome") == "timeout"
    states = kernel.value("[r.exit_state for r in last_launch().ranks]")
    assert states == ["finished", "timeout", "timeout"]
    assert_clean(kernel)


def test_interrupt_stops_workers_and_kernel_stays_usable(kernel):
    output = kernel.run(
        textwrap.dedent(
            """
            def forever(index):
                print("started", flush=True)
                while True:
                    time.sleep(0.1)

            hx.notebook_launcher(forever, progress=False)
            """
        ),
        timeout=90,
        interrupt_after=1,
        interrupt_on="started",
    )
    assert output.error is not None and output.error["ename"] == "KeyboardInterrupt"
    assert "started" in output.stdout
    assert "every worker process of this launch was stopped" in output.stderr
    assert output.after_interrupt < 15  # the cell returns promptly
    assert kernel.value("last_launch().outcome") == "interrupted"
    assert_clean(kernel)
    # the next launch in the same kernel works
    output = run_ok(
        kernel, "print('AGAIN', hx.notebook_launcher(lambda i: i + 41, progress=False))"
    )
    assert "AGAIN 41" in output.stdout


def test_interrupt_kills_a_worker_that_ignores_sigterm(kernel):
    """SIGTERM first, then SIGKILL after the grace time: a worker that ignores SIGTERM is
    stopped all the same, and the record says the launch was interrupted."""
    from hfxla_nb.launch.processes import TERMINATE_GRACE

    output = kernel.run(
        textwrap.dedent(
            """
            def stubborn(index):
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                print("ignoring SIGTERM", flush=True)
                while True:
                    time.sleep(0.1)

            hx.notebook_launcher(stubborn, num_processes=2, strategy="debug", progress=False)
            """
        ),
        timeout=90,
        interrupt_after=1,
        interrupt_on="ignoring SIGTERM",
    )
    assert output.error is not None and output.error["ename"] == "KeyboardInterrupt"
    assert "every worker process of this launch was stopped" in output.stderr
    # The cell waited out the grace time after SIGTERM (the workers ignored it), then SIGKILL.
    assert TERMINATE_GRACE <= output.after_interrupt < TERMINATE_GRACE + 12
    assert kernel.value("last_launch().outcome") == "interrupted"
    assert kernel.value("[r.exit_state for r in last_launch().ranks]") == ["interrupted"] * 2
    assert_clean(kernel)


def test_accelerate_style_function(kernel):
    output = run_ok(
        kernel,
        """
        def accelerate_train(lr):
            from accelerate import Accelerator
            import torch
            accelerator = Accelerator()
            model = torch.nn.Linear(4, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=lr)
            model, optimizer = accelerator.prepare(model, optimizer)
            x = torch.ones(8, 4, device=accelerator.device)
            loss = model(x).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            if accelerator.is_local_main_process:  # LOCAL_RANK set per rank (launch.worker)
                print("accelerate device", accelerator.device.type)
            return (accelerator.num_processes, accelerator.device.type, float(loss.detach().cpu()))

        value = hx.notebook_launcher(accelerate_train, args=(0.1,), progress=False)
        print("VALUE", value[:2])
        """,
    )
    assert "accelerate device xla" in output.stdout
    assert "VALUE (1, 'xla')" in output.stdout
    assert_clean(kernel)


def test_tqdm_in_a_worker_becomes_progress(kernel):
    output = run_ok(
        kernel,
        """
        from hfxla_nb import events
        seen = []
        class Recorder:
            def handle(self, event):
                seen.append(event)
            def refresh(self): pass
            def close(self, record): pass
        import hfxla_nb.launch.launcher as ui  # where the launcher finds its display
        original = ui.launch_display
        ui.launch_display = lambda world, mode, **drawn: Recorder()
        try:
            def with_bar(index):
                from tqdm.auto import tqdm
                for _ in tqdm(range(20), desc="epoch"):
                    time.sleep(0.02)
                return "done"
            hx.notebook_launcher(with_bar)
        finally:
            ui.launch_display = original
        bars = [e for e in seen if isinstance(e, events.Progress) and e.label == "epoch"]
        print("LAST", bars[-1].step, bars[-1].total)
        """,
    )
    assert "LAST 20 20" in output.stdout
    assert_clean(kernel)


def test_bad_arguments_are_refused_before_forking(kernel):
    cases = {
        "hx.notebook_launcher(42)": "must be callable",
        "hx.notebook_launcher(lambda i, a: a, args=(1, 2, 3))": "cannot be called with args",
        "hx.notebook_launcher(lambda i: i, args=5)": "must be a tuple",
        "hx.notebook_launcher(lambda i: i, strategy='ddp')": "is not one of",
        "hx.notebook_launcher(lambda i: i, num_processes=0)": "positive integer",
        "hx.notebook_launcher(lambda i: i, timeout=-1)": "positive number of seconds",
    }
    before = kernel.value("id(last_launch())")
    for code, expected in cases.items():
        output = kernel.run(code, timeout=30)
        assert output.error is not None and output.error["ename"] == "LaunchRefusedError", code
        assert expected in output.error["evalue"], (code, output.error["evalue"])
    assert kernel.value("id(last_launch())") == before  # nothing was launched


STARTS_THE_RUNTIME = {  # the README's three ways a cell starts the XLA runtime
    "torch_xla.device()": "import torch_xla\nd = torch_xla.device()",
    "TrainingArguments(...)": "from transformers import TrainingArguments\n"
                              "arguments = TrainingArguments(output_dir='unused', report_to=[])",
    "metrics_report()": "import torch_xla.debug.metrics as met\nreport = met.metrics_report()",
}


@pytest.mark.parametrize("cell", STARTS_THE_RUNTIME.values(), ids=STARTS_THE_RUNTIME)
def test_refuses_fast_after_runtime_started_in_kernel(cell):
    kernel = Kernel()
    try:
        started = kernel.run(f"import hfxla_nb._xla, hfxla_nb as hx\n{cell}", timeout=120)
        assert started.error is None, started.error
        assert kernel.value("hfxla_nb._xla.runtime_is_initialized()") is True
        output = kernel.run("hx.notebook_launcher(lambda i: i)", timeout=30)
        assert output.error is not None and output.error["ename"] == "LaunchRefusedError"
        assert "already initialized" in output.error["evalue"]
        assert "Restart the kernel" in output.error["evalue"]
        assert output.duration < 10
        assert kernel.value("hfxla_nb.launch.last_launch() is None") is True
    finally:
        kernel.close()
