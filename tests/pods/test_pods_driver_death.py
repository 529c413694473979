"""A launch on a cluster dies with its driver: the kernel (here a Python process) that started
a 2-host launch is SIGKILLed mid-launch, and within seconds no rank, host supervisor or host
actor of that launch runs on any node (Ray ends a dead driver's actors; each process of a
host asks for SIGKILL when its parent dies)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from tests.pods.test_pods import _alive

GONE_WITHIN = 20.0  # seconds: Ray notices a dead driver through its GCS connection

DRIVER = """
    import os, sys, time
    import hfxla_nb as hx

    def forever(scratch):
        import torch.distributed as dist
        with open(os.path.join(scratch, f"rank-{dist.get_rank()}"), "w") as file:
            file.write(f"{os.getpid()} {os.getppid()}")
        time.sleep(300)

    hx.notebook_launcher(forever, (sys.argv[2],), cluster=sys.argv[1], strategy="debug",
                         num_processes=2, hosts=2, progress=False)
    """


def test_a_killed_driver_takes_its_launch_on_every_host_with_it(cluster, tmp_path):
    driver = subprocess.Popen([sys.executable, "-c", textwrap.dedent(DRIVER), cluster.address,
                               str(tmp_path)], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while len(list(tmp_path.glob("rank-*"))) < 4:
        assert driver.poll() is None, "the driver ended before its ranks started"
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.2)
    time.sleep(0.2)  # each file is written whole
    pids = {int(word) for path in tmp_path.glob("rank-*") for word in path.read_text().split()}
    assert all(_alive(pid) for pid in pids)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    killed = time.monotonic()
    while any(_alive(pid) for pid in pids) and time.monotonic() - killed < GONE_WITHIN:
        time.sleep(0.2)
    assert [pid for pid in pids if _alive(pid)] == [], "still running after the driver died"
    print(f"every rank and host supervisor gone {time.monotonic() - killed:.1f} s after the "
          f"driver was killed (pids {sorted(pids)}, this test's pid {os.getpid()})")
