"""Rich display of the data objects of the lower layers, through IPython's own formatters.

`RuntimeInfo`, `DoctorReport`, `FineTuneResult`, `Predictions` and `MemoryPlan` are plain
data and import nothing from `ui`; IPython is told here, by type name, how to draw them (HTML,
and text for nbconvert and terminals). The package's entry points call `register()` when a
shell is running.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from .doctor_panel import doctor_html, doctor_text
from .finetune_panel import result_html, result_text
from .plan_panel import plan_table, plan_table_html
from .predictions_panel import predictions_html, predictions_text
from .runtime_panel import runtime_html, runtime_text

# (module, class name) -> (html, text) renderers
RENDERERS: dict[tuple[str, str], tuple[Callable[[Any], str], Callable[[Any], str]]] = {
    ("hfxla_nb.runtime.info", "RuntimeInfo"): (runtime_html, runtime_text),
    ("hfxla_nb.runtime.doctor_report", "DoctorReport"): (doctor_html, doctor_text),
    ("hfxla_nb.train.result", "FineTuneResult"): (result_html, result_text),
    ("hfxla_nb.train.memory_plan", "MemoryPlan"): (plan_table_html, plan_table),
    ("hfxla_nb.train.predict", "Predictions"): (predictions_html, predictions_text),
}


def register(shell: Any = None) -> bool:
    """Teach the running IPython shell (or `shell`) to draw hfxla_nb's data objects.

    Returns False when there is no shell (a plain script): nothing to do then.
    """
    if shell is None:
        ipython = sys.modules.get("IPython")  # never import IPython just to find no shell
        shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return False
    formatters = shell.display_formatter.formatters
    for (module, name), (html_of, text_of) in RENDERERS.items():
        formatters["text/html"].for_type_by_name(module, name, html_of)
        formatters["text/plain"].for_type_by_name(module, name, _pretty(text_of))
    return True


def _pretty(text_of: Callable[[Any], str]) -> Callable[[Any, Any, bool], None]:
    def printer(obj: Any, p: Any, cycle: bool) -> None:
        p.text(text_of(obj))

    return printer
