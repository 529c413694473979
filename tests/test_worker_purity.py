"""Workers never draw, at run time too: the modules a forked worker runs import no renderer.

import-linter checks the import graph (`pyproject.toml`); this checks what a fresh interpreter
actually loads, where a package's `__init__` can pull in more than the module imports (an eager
`hfxla_nb.train/__init__` once loaded `fine_tune`, hence the launcher and `hfxla_nb.ui`).
`make lint` runs this file.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.launch

# What a forked worker runs: `notebook_launcher`'s worker, fine_tune's loop, `hx.report`.
WORKER_MODULES = ("hfxla_nb.launch.worker", "hfxla_nb.train.worker.loop",
                  "hfxla_nb.observe.reporting")
# A module is a renderer when it is, or is inside, one of these.
RENDERERS = ("hfxla_nb.ui", "ipywidgets", "IPython.display")


def loaded_modules(module: str) -> list[str]:
    """Every module a fresh interpreter has loaded after `import module`."""
    code = f"import json, sys\nimport {module}\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def renderers_in(modules: list[str]) -> list[str]:
    """The modules of `modules` that draw (see `RENDERERS`)."""
    return [name for name in modules
            if any(name == renderer or name.startswith(renderer + ".") for renderer in RENDERERS)]


def test_renderers_are_recognized():
    """The check itself can fail: the launcher, which draws, loads `hfxla_nb.ui`."""
    assert "hfxla_nb.ui" in renderers_in(loaded_modules("hfxla_nb.launch.launcher"))


@pytest.mark.parametrize("module", WORKER_MODULES)
def test_worker_module_loads_no_renderer(module):
    modules = loaded_modules(module)
    assert module in modules
    assert renderers_in(modules) == [], f"{module} loads renderers at run time"
