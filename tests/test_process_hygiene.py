"""A launch's processes and output, in a real Jupyter kernel: a flood of lines arrives whole
and in order, every descendant of a launch is stopped whatever session it moved to, and the
kernel itself gains no process from a launch.

One kernel serves every test (each leaves it usable); speed comparisons are in bench/relay.py
and bench/launch_latency.py.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from tests.helpers import Kernel, kernel_fixture, run_ok, run_python

SETUP = textwrap.dedent(
    """
    import os, subprocess, sys, time
    import hfxla_nb as hx

    def children(pid):
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as file:
                        fields = file.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[1]) == pid and fields[0] not in "ZX":
                    found.append(int(name))
        return sorted(found)

    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as file:
                return file.read().rsplit(")", 1)[1].split()[0] not in "ZX"
        except OSError:
            return False
    """
)


kernel = kernel_fixture(SETUP)


@pytest.mark.kernel
def test_a_flood_of_lines_from_two_ranks_arrives_whole_and_in_order(kernel):
    lines = 10_000
    output = run_ok(kernel, f"""
        def flood(index):
            for i in range({lines}):
                print(f"rank {{index}} line {{i:05d}} of the flood")
        hx.notebook_launcher(flood, num_processes=2, output="all")
        """, timeout=300)
    seen: dict[int, list[int]] = {0: [], 1: []}
    pattern = re.compile(r"\[rank (\d)\] rank (\d) line (\d{5}) of the flood")
    for line in output.stdout.splitlines():
        if "of the flood" not in line:
            continue
        match = pattern.fullmatch(line)
        assert match, f"a torn or mixed line: {line!r}"
        assert match[1] == match[2], f"a line under another rank's prefix: {line!r}"
        seen[int(match[1])].append(int(match[3]))
    for rank in (0, 1):
        assert seen[rank] == list(range(lines)), f"rank {rank}: lost or out of order"


# A function that leaves two processes out of the launch's process group: one in a session of
# its own, one daemon (double fork, new session, its parent gone). Each writes its pid first.
LEAVE_BEHIND = """
    def leave_behind(folder, fail):
        import os, subprocess, sys, time
        server = subprocess.Popen(["sleep", "600"], start_new_session=True)
        with open(os.path.join(folder, "session"), "w") as file:
            file.write(str(server.pid))
        code = (
            "import os, sys, time\\n"
            "if os.fork(): os._exit(0)\\n"
            "os.setsid()\\n"
            "if os.fork(): os._exit(0)\\n"
            "open(sys.argv[1], 'w').write(str(os.getpid()))\\n"
            "time.sleep(600)\\n"
        )
        subprocess.run([sys.executable, "-c", code, os.path.join(folder, "daemon")], check=True)
        while not os.path.exists(os.path.join(folder, "daemon")):
            time.sleep(0.01)
        time.sleep(0.2)  # the daemon's file is written whole
        if fail:
            raise RuntimeError("failed on purpose")
        return "done"
    """


@pytest.mark.kernel
@pytest.mark.parametrize("fail", [False, True], ids=["finished", "failed"])
def test_processes_in_other_sessions_and_daemons_are_stopped_and_named(kernel, fail):
    run_ok(kernel, LEAVE_BEHIND)
    output = run_ok(kernel, f"""
        import tempfile
        folder = tempfile.mkdtemp()
        try:
            hx.notebook_launcher(leave_behind, args=(folder, {fail}), strategy="spmd")
        except hx.LaunchError as error:
            print("raised", type(error).__name__)
        record = hx.last_launch()
        pids = [int(open(os.path.join(folder, name)).read()) for name in ("session", "daemon")]
        print("alive", [alive(pid) for pid in pids])
        print("outcome", record.outcome)
        for line in record.stopped_processes:
            print("stopped", line)
        print("pids", pids)
        """)
    lines = output.stdout.splitlines()
    assert "alive [False, False]" in lines
    assert f"outcome {'failed' if fail else 'finished'}" in lines
    session, daemon = eval(next(line for line in lines if line.startswith("pids "))[5:])
    stopped = [line.removeprefix("stopped ") for line in lines if line.startswith("stopped ")]
    assert f"sleep 600 (pid {session})" in stopped
    assert any(line.endswith(f"(pid {daemon})") and " -c " in line for line in stopped), stopped


@pytest.mark.kernel
def test_the_kernel_gains_no_process_from_a_launch(kernel):
    # First a kernel that imported torch only: on torch 2.8 (Kaggle's stack, `make
    # test-stacks`) importing torch_xla or accelerate starts inductor's compile-worker pool,
    # so a launch that imported either in the kernel would leave one (a pool the user's own
    # imports started is theirs: it is in "before" below).
    first = run_ok(kernel, """
        import torch
        def nothing(index):
            import torch_xla, accelerate
        children_before = children(os.getpid())
        hx.notebook_launcher(nothing, num_processes=2)
        time.sleep(1)  # a pool started during the launch would be up by now
        print("torch only", children_before == children(os.getpid()), children(os.getpid()))
        """, timeout=300)
    assert any(line.startswith("torch only True") for line in first.stdout.splitlines()), (
        first.stdout)
    # Then as accelerate's example notebook (simple_nlp_example.ipynb) leaves it: torch,
    # accelerate and transformers' model classes imported (accelerate imports torch's
    # inductor), a launch whose function imports torch_xla and accelerate.
    output = run_ok(kernel, """
        import torch, accelerate
        from accelerate import Accelerator
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        def group_of(pid):
            with open(f"/proc/{pid}/stat") as file:
                return int(file.read().rsplit(")", 1)[1].split()[2])
        def my_group():
            me = os.getpid()
            return sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and alive(int(p))
                          and int(p) != me and _safe_group(int(p)) == os.getpgid(0))
        def _safe_group(pid):
            try:
                return group_of(pid)
            except OSError:
                return None
        def uses_xla(index):
            import torch_xla, accelerate
            return os.environ.get("TORCH_WARM_POOL")
        children_before, group_before = children(os.getpid()), my_group()
        warm_pool = hx.notebook_launcher(uses_xla, num_processes=2)
        time.sleep(1)  # a pool started during the launch would be up by now
        print("children", children_before == children(os.getpid()), children(os.getpid()))
        print("group", group_before == my_group())
        print("warm pool in the workers", warm_pool)
        print("warm pool in the kernel", os.environ.get("TORCH_WARM_POOL"))
        """, timeout=300)
    lines = output.stdout.splitlines()
    assert any(line.startswith("children True") for line in lines), output.stdout
    assert "group True" in lines
    assert "warm pool in the workers 0" in lines  # no compile-worker pool warmed in a worker
    # `import hfxla_nb` (the kernel's first cell) set it, before accelerate was imported: on
    # torch 2.8 that import would warm inductor's pool in the kernel; a launch keeps it.
    assert "warm pool in the kernel 0" in lines


@pytest.mark.launch
def test_importing_hfxla_nb_first_keeps_inductors_pool_cold_unless_told_otherwise():
    code = ("import json, os\nos.environ.pop('TORCH_WARM_POOL', None)\n{before}"
            "import hfxla_nb\nprint(json.dumps(os.environ.get('TORCH_WARM_POOL')))")
    assert run_python(code.format(before="")) == "0"
    assert run_python(code.format(before="os.environ['TORCH_WARM_POOL'] = '1'\n")) == "1"
    # torch's warm-up already ran (async_compile imported first): nothing to keep cold.
    assert run_python(code.format(before="import torch._inductor.async_compile\n")) is None


@pytest.mark.launch
def test_a_compile_worker_pool_started_during_a_launch_is_shut_down():
    # The two ways torch starts inductor's pool, inside the guard the launcher puts around a
    # launch: the warm-up (skipped: TORCH_WARM_POOL=0) and an explicit start (shut down after).
    # torch 2.8 (Kaggle's) warms the pool when async_compile is imported, 2.9 when asked.
    result = run_python("""
        import json, os, time
        from hfxla_nb.launch.processes import COMPILE_WORKER, children_of, describe
        from hfxla_nb.launch.processes import kernel_gains_no_process

        def workers():
            return [pid for pid in children_of(os.getpid()) if COMPILE_WORKER in describe(pid)]

        with kernel_gains_no_process():
            from torch._inductor import async_compile
            getattr(async_compile, "maybe_warm_pool", lambda: None)()
            warmed = workers()
            async_compile.AsyncCompile.warm_pool()
            getattr(async_compile.AsyncCompile, "wakeup", lambda: None)()
            deadline = time.monotonic() + 60
            while not workers() and time.monotonic() < deadline:
                time.sleep(0.1)
            started = workers()
        print(json.dumps({"warmed": warmed, "started": started, "after": workers()}))
        """, timeout=300, TORCHINDUCTOR_COMPILE_THREADS="2")
    assert result["warmed"] == []
    assert result["started"], "the explicit start made no compile worker (nothing tested)"
    assert result["after"] == []


@pytest.mark.kernel
def test_the_launcher_is_imported_while_the_kernel_is_idle_after_import_hfxla_nb():
    kernel = Kernel()
    try:
        assert kernel.run("import sys\nimport hfxla_nb as hx").error is None
        # The next cell runs after the kernel's idle-time warm-up: the first launch's
        # imports are done, and neither torch nor the XLA runtime was touched.
        loaded = kernel.value("[m in sys.modules for m in ('hfxla_nb.launch.launcher', "
                              "'hfxla_nb.launch.worker', 'ipywidgets', 'torch', 'torch_xla')]")
        assert loaded == [True, True, True, False, False]
    finally:
        kernel.close()


@pytest.mark.kernel
def test_a_backward_pass_in_the_kernel_leaves_launches_able_to_train(kernel):
    # A quick model trained on the CPU in the notebook starts autograd's device threads in the
    # kernel, sized for the devices it sees (no XLA). Forked workers inherited that engine and
    # failed their first backward on an XLA device (INTERNAL ASSERT, device_ready_queues_).
    output = run_ok(kernel, """
        import torch
        weight = torch.ones(3, requires_grad=True)
        (weight * 2).sum().backward()
        def train(index):
            import torch
            import torch_xla.core.xla_model as xm
            x = torch.ones(4, 4, device=xm.xla_device(), requires_grad=True)
            (x * x).sum().backward()
            return float(x.grad.sum().cpu())
        print("gradients", hx.notebook_launcher(train, num_processes=2), float(weight.grad.sum()))
        """, timeout=300)
    assert "gradients 32.0 6.0" in output.stdout.splitlines(), output.stdout  # rank 0's


@pytest.mark.kernel
def test_a_full_disk_starts_no_process_and_loses_no_trained_model(kernel, tmp_path, cache):
    # As a user's notebook on Kaggle's stack (`make test-stacks`): torch, accelerate and
    # transformers imported first. A disk too small is refused before the fork, with nothing
    # started in the kernel; a save that fails after training (a tmpfs of 3 inodes: room for
    # the bytes, not for the files) keeps the weights where the result says.
    output = run_ok(kernel, f"""
        import ctypes, json
        import torch, accelerate
        from transformers import AutoModelForSequenceClassification
        from hfxla_nb import demo
        from hfxla_nb.train.memory import DiskSpaceError
        libc = ctypes.CDLL(None, use_errno=True)
        base, mounted = {str(tmp_path)!r}, []
        def tmpfs(name, options):
            target = os.path.join(base, name)
            os.makedirs(target)
            if libc.mount(b"tmpfs", target.encode(), b"tmpfs", 0, options.encode()) == 0:
                mounted.append(target)
                return target
        small, full = tmpfs("small", "size=256k"), tmpfs("full", "size=64m,nr_inodes=3")
        found = {{"mounted": bool(small and full)}}
        try:
            if found["mounted"]:
                model_dir = demo.demo_model_dir(cache={str(cache)!r})
                before = children(os.getpid())
                try:
                    hx.fine_tune(model_dir, demo.demo_dataset(n=200), output_dir=small + "/out",
                                 max_steps=2, batch_size=8, progress=False)
                except DiskSpaceError as error:
                    found["refused"] = str(error)
                found["refused_children"] = children(os.getpid()) == before
                found["small_left"] = os.listdir(small)
                # keep_warm=False: a warm model's worker is the kernel's child by design
                result = hx.fine_tune(model_dir, demo.demo_dataset(n=200),
                                      output_dir=full + "/out", fallback_dir=base + "/rescued",
                                      max_steps=2, batch_size=8, progress=False,
                                      keep_warm=False)
                time.sleep(1)  # a pool started during the launch would be up by now
                found["saved_children"] = children(os.getpid()) == before
                found.update(output_dir=result.output_dir, save_error=result.save_error,
                             full_left=os.listdir(full), steps=result.steps)
                AutoModelForSequenceClassification.from_pretrained(result.output_dir)
        finally:
            for target in mounted:
                libc.umount2(target.encode(), 2)
        print("found", json.dumps(found))
        """, timeout=400)
    found = json.loads(next(line[6:] for line in output.stdout.splitlines()
                            if line.startswith("found ")))
    if not found["mounted"]:
        pytest.skip("cannot mount a tmpfs here: this test needs root or CAP_SYS_ADMIN")
    assert "so nothing was started" in found["refused"], found
    assert found["refused_children"] and found["saved_children"], found
    assert found["small_left"] == [] and found["full_left"] == [], found
    assert found["steps"] == 2
    assert found["output_dir"].startswith(str(tmp_path / "rescued" / "hfxla_nb-rescued-out-"))
    assert found["save_error"] == (
        f"hfxla_nb: could not save to {tmp_path / 'full' / 'out'}: No space left on device "
        f"(os error 28); the trained model was saved to {found['output_dir']} instead "
        "(result.save(folder) writes it where you want)")
