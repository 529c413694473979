"""The package imports fast and without side effects; every public name resolves."""

from __future__ import annotations

import subprocess
import sys

import hfxla_nb


def test_import_pulls_in_no_heavy_module_and_starts_nothing():
    code = (
        "import sys, hfxla_nb, hfxla_nb.runtime, hfxla_nb.launch, hfxla_nb.observe.reporting, "
        "hfxla_nb.magics\n"
        "heavy = ('torch', 'torch_xla', 'transformers', 'datasets')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "print(heavy)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


def test_every_public_name_resolves():
    for name in hfxla_nb.__all__:
        assert getattr(hfxla_nb, name) is not None, name
    assert callable(hfxla_nb.last_launch)
