"""A launch's processes and output, in a real Jupyter kernel: a flood of lines arrives whole
and in order, every descendant of a launch is stopped whatever session it moved to, and the
kernel itself gains no process from a launch.

One kernel serves every test (each leaves it usable); speed comparisons are in bench/relay.py
and bench/launch_latency.py.
"""

from __future__ import annotations

import re
import textwrap

import pytest

from tests.kernel import Kernel

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


@pytest.fixture(scope="module")
def kernel():
    kernel = Kernel()
    setup = kernel.run(SETUP)
    assert setup.error is None, setup.error
    yield kernel
    kernel.close()


def run_ok(kernel: Kernel, code: str, timeout: float = 120):
    output = kernel.run(textwrap.dedent(code), timeout=timeout)
    assert output.error is None, (output.error or {}).get("traceback")
    return output


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
