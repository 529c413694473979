"""hfxla_nb: train Hugging Face models on TPUs (PyTorch/XLA) from a notebook.

```python
%load_ext hfxla_nb
import hfxla_nb as hx
hx.detect()                                    # what hardware, what runtime, what is wrong
hx.doctor()                                    # check it end to end, a report for an issue
hx.configure(cores=8)                          # before any device use
results = hx.notebook_launcher(train, args=(cfg,))
result = hx.fine_tune("bert-base-cased", dataset)
```

Importing the package is cheap: torch, torch_xla and transformers are imported only by the
functions that need them, and nothing here starts the XLA runtime. In a Jupyter kernel, what
the first launch needs in the kernel is imported once the importing cell is done, while the
kernel is idle (`launch.launcher.warm_up`), so the first launch is as quick as the next ones.
"""

from __future__ import annotations

from ._lazy import lazy_exports
from ._version import __version__

# public name -> module that defines it (imported on first use)
_EXPORTS = {
    "detect": "runtime.info",
    "RuntimeInfo": "runtime.info",
    "doctor": "diagnosis",
    "DoctorReport": "runtime.doctor_report",
    "configure": "runtime.configure",
    "RuntimeAlreadyStartedError": "runtime.configure",
    "TpuNotFoundError": "runtime.configure",
    "CompileCacheRefusedError": "runtime.compile_cache",
    "notebook_launcher": "launch.launcher",
    "last_launch": "launch.launcher",
    "session": "launch.sessions",
    "Session": "launch.sessions",
    "LaunchRecord": "launch.supervision",
    "RankRecord": "launch.supervision",
    "LaunchError": "launch.errors",
    "LaunchRefusedError": "launch.preflight",
    "report": "observe.reporting",
    "fine_tune": "train.finetune",
    "prepare_fine_tune": "train.prepare",
    "generate": "train.worker.generation",
    "predict": "train.predict",
    "FineTuneConfig": "train.config",
    "FineTuneError": "train.config",
    "FineTuneResult": "train.result",
    "plan_memory": "train.memory",
    "MemoryPlan": "train.memory",
    "MemoryPlanError": "train.memory",
    "XlaProgressCallback": "train.trainer",
    "xla_training_arguments": "train.trainer",
    "xla_trainer": "train.trainer",
    "TrainingArgumentsInKernelError": "train.trainer",
}
# public module name -> the module it is (imported on first use): `hx.patches.applied()`
_MODULES = {
    "patches": "patches",
}

__all__ = sorted([*_EXPORTS, *_MODULES]) + ["__version__", "load_ipython_extension",
                                            "unload_ipython_extension"]
_display_registered = False


def _register_display() -> None:
    """Once per process, in a running IPython shell: draw `RuntimeInfo` and `FineTuneResult`
    as panels (`ui.panels.register`). The data classes themselves never import `ui`."""
    global _display_registered
    if not _display_registered:
        from .ui import panels

        _display_registered = panels.register()


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _MODULES, on_first_use=_register_display)


def load_ipython_extension(ipython) -> None:
    """`%load_ext hfxla_nb`: registers %xla_info, %xla_doctor, %xla_config and %%xla_metrics."""
    from .magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    """`%unload_ext hfxla_nb`: removes the magics again."""
    from .magics import unload_ipython_extension as unload

    unload(ipython)


def _warm_up_in_a_kernel() -> None:
    import sys

    from .launch.processes import keep_compile_pool_cold

    keep_compile_pool_cold()  # no inductor pool in an XLA notebook's kernel (processes.py)
    if "ipykernel" in sys.modules:
        from .launch import launcher

        launcher.schedule()


_warm_up_in_a_kernel()
