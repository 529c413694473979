"""tests/xla_in_process use XLA in their own process (the optimizer and clipping traced as
the training step traces them): run here in a pytest of their own, so the XLA runtime never
starts in this one, the kernel of every launch the other tests make."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT, subprocess_env

pytestmark = pytest.mark.launch


def test_the_xla_in_process_tests_pass_in_a_process_of_their_own():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(ROOT / "tests" / "xla_in_process")],
        capture_output=True, text=True, timeout=600, env=subprocess_env(), cwd=str(ROOT))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]
