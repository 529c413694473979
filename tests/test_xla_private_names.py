"""The private torch_xla names the seam uses (`hfxla_nb._xla.PRIVATE_NAMES`): each one is in
the installed torch_xla, the installed version is one they were checked on, and the table lists
every such name the seam's code reads. An upgrade of torch_xla fails here first, naming what
went missing, instead of somewhere deep in a launched worker.

The probe imports torch_xla in a fresh interpreter and never touches a device (the test process
must not start the XLA runtime: tests/conftest.py); it checks that the runtime stayed off.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hfxla_nb._xla import PRIVATE_NAMES

ROOT = Path(__file__).resolve().parents[1]
SEAM = ROOT / "hfxla_nb" / "_xla"
# Module paths torch_xla promises nothing about: underscored parts, experimental, debug.
UNSTABLE_PARTS = ("experimental", "debug")

PROBE = """
import importlib, json, sys
import torch_xla
from hfxla_nb._xla import PRIVATE_NAMES

def resolve(dotted):
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for part in parts[end:]:
            value = getattr(value, part)
        return value
    raise ImportError(dotted)

missing = {}
for name in PRIVATE_NAMES:
    try:
        resolve(name)
    except (ImportError, AttributeError) as error:
        missing[name] = f"{type(error).__name__}: {error}"
started = bool(torch_xla._XLAC._xla_runtime_is_initialized())
print(json.dumps({"version": torch_xla.__version__, "missing": missing, "started": started}))
"""


def probe() -> dict:
    """Resolve every name of the table in a fresh interpreter (XLA on the CPU, no device)."""
    env = dict(os.environ, PJRT_DEVICE="CPU")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                            timeout=300, env=env, cwd=str(ROOT))
    assert result.returncode == 0, f"the probe failed:\n{result.stderr[-4000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def installed_minor() -> str:
    version = importlib.metadata.version("torch_xla")
    return ".".join(version.split(".")[:2])


@pytest.mark.launch
def test_every_private_name_is_in_the_installed_torch_xla():
    pytest.importorskip("torch_xla")
    found = probe()
    missing = "\n".join(f"  {name} ({why})" for name, why in found["missing"].items())
    assert not found["missing"], (
        f"torch_xla {found['version']} lacks private names hfxla_nb/_xla uses (PRIVATE_NAMES):"
        f"\n{missing}\nFind what replaced each one, change the seam and the table.")
    assert not found["started"], "importing torch_xla and probing names started the runtime"


def test_the_installed_torch_xla_is_a_version_the_names_were_checked_on():
    pytest.importorskip("torch_xla")
    minor = installed_minor()
    unchecked = sorted(name for name, versions in PRIVATE_NAMES.items() if minor not in versions)
    assert not unchecked, (
        f"torch_xla {minor} is installed, but these private names were checked on other "
        f"versions only: {unchecked}. Once test_every_private_name_is_in_the_installed_"
        f"torch_xla passes (and the suite does), add {minor!r} to their versions.")


def test_the_table_lists_every_private_name_the_seam_reads():
    # Read the seam's code (nothing imported): each underscored attribute or getattr name,
    # and each name read from an unstable module (torch_xla._internal, experimental, debug).
    components = {part for name in PRIVATE_NAMES for part in name.split(".")}
    unlisted = []
    for path in sorted(SEAM.glob("*.py")):
        for line, name in unstable_reads(ast.parse(path.read_text())):
            if "." in name:  # a name, or a module, of an unstable module
                listed = name in PRIVATE_NAMES or any(key.startswith(name + ".")
                                                      for key in PRIVATE_NAMES)
            else:
                listed = name in components
            if not listed:
                unlisted.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert not unlisted, "private torch_xla names missing from PRIVATE_NAMES:\n" + "\n".join(
        unlisted)
    assert all(name.startswith(("torch_xla.", "torch.")) and versions for name, versions in
               PRIVATE_NAMES.items())


def unstable_reads(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of what the code reads that torch_xla does not promise to keep: a dotted
    name for what is read from an unstable module, a bare underscored name otherwise."""
    aliases = {}  # local name -> the torch_xla module it is
    reads = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({alias.asname: alias.name for alias in node.names
                            if alias.asname and alias.name.startswith("torch_xla")})
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch_xla"):
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if unstable(node.module):
                    reads.append((node.lineno, dotted))
                aliases[alias.asname or alias.name] = dotted
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            module = aliases.get(node.value.id) if isinstance(node.value, ast.Name) else None
            if module is not None and unstable(module):
                reads.append((node.lineno, f"{module}.{node.attr}"))
            elif private(node.attr):
                reads.append((node.lineno, node.attr))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "getattr" and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and private(str(node.args[1].value))):
            reads.append((node.lineno, str(node.args[1].value)))
    return reads


def unstable(module: str) -> bool:
    return any(private(part) or part in UNSTABLE_PARTS for part in module.split(".")[1:])


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_a_missing_private_name_with_a_public_fallback_degrades_and_says_so(monkeypatch):
    """A torch_xla without `_xla_runtime_is_initialized` (a fake module: only its `_XLAC` is
    read): the check answers "not started", and says once what that means."""
    import types
    import warnings

    from hfxla_nb._xla import loader

    fake = types.SimpleNamespace(__version__="2.99.0", _XLAC=types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "torch_xla", fake)
    monkeypatch.setattr(loader, "_said_missing", set())
    with pytest.warns(RuntimeWarning, match=r"torch_xla 2\.99\.0 has no "
                      r"torch_xla\._XLAC\._xla_runtime_is_initialized .*takes it as not started"):
        assert loader.runtime_is_initialized() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process, not at every check
        assert loader.runtime_is_initialized() is False
    with pytest.warns(RuntimeWarning, match="compile cache is set up without checking"):
        assert loader.computation_cache_initialized() is False
