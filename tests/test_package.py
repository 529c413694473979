"""The package imports fast and without side effects; every public name resolves."""

from __future__ import annotations

import importlib
import pydoc
import subprocess
import sys

import pytest

import hfxla_nb

SUBPACKAGES = ("launch", "observe", "runtime", "train")


@pytest.mark.launch
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


@pytest.mark.parametrize("package", ["hfxla_nb", *(f"hfxla_nb.{name}" for name in SUBPACKAGES)])
def test_every_public_name_is_what_its_module_defines(package):
    """Each lazily resolved name is the object of the module `_EXPORTS` names, defined there
    (not re-exported from elsewhere), and listed by `__all__` and `dir()`."""
    module = importlib.import_module(package)
    assert set(module._EXPORTS) <= set(module.__all__) <= set(dir(module))
    for name, where in module._EXPORTS.items():
        defining = importlib.import_module(f"{package}.{where}")
        value = getattr(module, name)
        assert value is getattr(defining, name), name
        assert getattr(value, "__module__", defining.__name__) == defining.__name__, name
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        module.not_a_name  # noqa: B018 - the lookup itself is the test


@pytest.mark.launch
def test_subpackage_imports_load_nothing_they_do_not_use():
    """`from hfxla_nb.launch import group_processes` imports processes.py, not the launcher."""
    code = ("import sys\nfrom hfxla_nb.launch import group_processes\n"
            "print('hfxla_nb.launch.launcher' in sys.modules, group_processes.__module__)")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.split() == ["False", "hfxla_nb.launch.processes"]


def test_patches_are_public_as_hx_patches():
    """`hx.patches` (the name a fine_tune result's note points at) is the patches module, found
    by `help("hfxla_nb.patches")` and `from hfxla_nb import patches`, and it patches
    transformers for a block and restores it."""
    from transformers import masking_utils

    from hfxla_nb import patches
    from hfxla_nb import patches as internal

    assert hfxla_nb.patches is patches is internal
    assert "patches" in hfxla_nb.__all__
    assert pydoc.locate("hfxla_nb.patches") is internal
    original = masking_utils._ignore_bidirectional_mask_sdpa
    with hfxla_nb.patches.applied() as applied:
        assert "bidirectional_mask" in applied and applied == hfxla_nb.patches.active()
        assert masking_utils._ignore_bidirectional_mask_sdpa.__wrapped__ is original
    assert masking_utils._ignore_bidirectional_mask_sdpa is original
    assert hfxla_nb.patches.active() == []


@pytest.mark.launch
@pytest.mark.parametrize("first", ["import hfxla_nb.patches as found",
                                   "from hfxla_nb import patches as found",
                                   "import hfxla_nb as hx; found = hx.patches; "
                                   "import hfxla_nb.patches"])
def test_hfxla_nb_patches_is_an_import_path(first):
    """`import hfxla_nb.patches` (the path a fine_tune result's note names) works in a fresh
    process, whichever way the module is reached first, and every way gives the one module
    that holds the patches and their state."""
    code = (f"{first}\n"
            "import sys, hfxla_nb, hfxla_nb.patches, hfxla_nb.patches as internal\n"
            "print(found is internal, hfxla_nb.patches is internal, "
            "sys.modules['hfxla_nb.patches'] is internal, callable(found.applied))")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True"] * 4


@pytest.mark.launch
def test_a_launch_record_lists_its_leftover_processes():
    """`hx.last_launch().leftover_processes()`: the live processes of the launch's process
    group, as /proc has them; none once they are gone, none for a launch that forked nothing."""
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)  # its own process group
    record = hfxla_nb.LaunchRecord("debug", 1, [], process_group=child.pid)
    try:
        assert record.leftover_processes() == [child.pid]
    finally:
        child.kill()
        child.wait()
    assert record.leftover_processes() == []
    assert hfxla_nb.LaunchRecord("spmd", 1, []).leftover_processes() == []


def test_the_xla_extras_cap_torch_at_the_newest_torch_xla():
    # pip pairs its newest torch with the newest torch_xla, built for an older torch: the
    # extras cap both, at the release `runtime.info` names in its fixes.
    from pathlib import Path

    import tomllib

    from hfxla_nb.runtime.info import NEWEST_TORCH_XLA

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    cap = f"<{NEWEST_TORCH_XLA[0]}.{NEWEST_TORCH_XLA[1] + 1}"
    for extra in ("xla", "tpu"):
        torch = [r for r in extras[extra] if r.startswith("torch>")]
        xla = [r for r in extras[extra] if r.startswith("torch_xla")]
        assert torch and torch[0].endswith(cap), (extra, extras[extra])
        assert xla and xla[0].endswith(cap), (extra, extras[extra])
