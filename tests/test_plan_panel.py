"""The memory plan in the cell before the fork (`ui.panels`, shown by `fine_tune` through
`launch.launcher`): one line, the words of the result's memory row, in each display mode. Real
plans (`plan_memory` on published configs), real ipywidgets; `IPython.display.display` is
recorded, as in tests/test_ui.py, so no kernel is needed."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from hfxla_nb.train.memory import plan_memory
from hfxla_nb.ui.live import widget_state
from hfxla_nb.ui.panels import (
    as_plan,
    memory_row,
    plan_line,
    plan_table,
    plan_text,
    show_memory_plan,
)
from hfxla_nb.ui.state import BOX, heading
from tests.helpers import Shown

transformers = pytest.importorskip("transformers")


def llama_7b_auto() -> dict:
    config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008,
                                      num_hidden_layers=32, num_attention_heads=32,
                                      vocab_size=32000)
    return dataclasses.asdict(plan_memory(config, hardware="v5e-8", batch_size=8,
                                          max_length=512, lora="auto", sharding="auto"))



def test_a_plan_and_the_results_dict_of_it_draw_the_same():
    # fine_tune shows the MemoryPlan itself; the result keeps it as plain data (asdict).
    config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008,
                                      num_hidden_layers=32, num_attention_heads=32,
                                      vocab_size=32000)
    plan = plan_memory(config, hardware="v5e-1", batch_size=8, max_length=1024)
    data = dataclasses.asdict(plan)
    assert plan_line(plan) == plan_line(data) and plan_text(plan) == plan_text(data)
    assert plan_table(plan) == plan_table(as_plan(data)) and plan.changes
    assert show_memory_plan(plan, "console").text == f"memory  {plan_line(data)}"


def test_the_line_has_the_result_rows_words_the_device_and_why_auto_chose():
    plan = llama_7b_auto()
    line = plan_line(plan)
    assert line.startswith(plan_text(plan) + " of ")
    assert plan_text(plan).startswith("plan ") and " per device (parameters " in line
    assert f" of {plan['device_memory_gib']:.1f} GiB per device on v5e-8: fits; " in line
    assert "lora='auto' chose LoRA" in line and "sharding='auto' chose 'fsdp'" in line
    # The result's memory row starts with the same words.
    result = SimpleNamespace(memory_plan=plan, xla={"largest_graph_bytes": 2**30})
    assert memory_row(result).startswith(plan_text(plan) + ", XLA measured 1.0 GiB")


def test_console_prints_the_line_and_none_shows_nothing(capsys):
    plan = llama_7b_auto()
    notice = show_memory_plan(plan, "console")
    printed = capsys.readouterr().out
    assert printed == f"memory  {plan_line(plan)}\n"
    assert repr(notice) == printed.strip()
    notice.close()  # nothing to close in a terminal
    assert show_memory_plan(plan, False) is None and show_memory_plan(None, "console") is None
    assert capsys.readouterr().out == ""


def test_html_mode_shows_html_and_text(monkeypatch):
    shown = Shown(monkeypatch)
    plan = llama_7b_auto()
    notice = show_memory_plan(plan, "html")
    notice.close()
    assert [kind for kind, _ in shown.calls] == ["display"]
    bundle = shown.calls[0][1]
    assert set(bundle) == {"text/html", "text/plain"}
    assert bundle["text/plain"] == f"memory  {plan_line(plan)}"
    assert heading("memory") in bundle["text/html"]
    assert "lora=&#x27;auto&#x27; chose LoRA" in bundle["text/html"]


def test_widget_mode_is_a_live_widget_that_ends_as_static_html(monkeypatch):
    shown = Shown(monkeypatch)
    plan = llama_7b_auto()
    notice = show_memory_plan(plan, "widgets")
    widget = notice.widget
    state = widget_state(widget)
    assert state["class"] == "HTML" and plan_text(plan).replace("'", "&#x27;") in state["value"]
    kind, first = shown.calls[0]
    assert kind == "display"
    assert first["application/vnd.jupyter.widget-view+json"]["model_id"] == widget.model_id
    assert first["text/plain"] == f"memory  {plan_line(plan)}"
    assert widget.comm is not None
    notice.close()  # the launch ended: static HTML and text, the widget's comm closed
    kind, final = shown.calls[-1]
    assert kind == "update" and set(final) == {"text/html", "text/plain"}
    assert final["text/html"] == state["value"]
    assert widget.comm is None and notice.widget is None


@pytest.mark.kernel
def test_in_a_real_kernel_auto_draws_a_widget_and_the_saved_output_is_static():
    """progress="auto" in a Jupyter kernel: the widget, while the launch would run; what the
    notebook keeps is static HTML and text (no widget view needing the kernel's models)."""
    from tests.helpers import bundles_of, run_notebook, stdout_of

    code = """
        import dataclasses
        from transformers import LlamaConfig
        from hfxla_nb.train.memory import plan_memory
        from hfxla_nb.launch.launcher import show_memory_plan
        plan = dataclasses.asdict(plan_memory(LlamaConfig(hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4, vocab_size=256),
                                  hardware="v5e-1", lora=True))
        notice = show_memory_plan(plan, "auto")
        print(notice.mode, notice.widget is not None)
        notice.close()
        print(notice.widget is None)
        """
    (outputs,) = run_notebook([code])
    assert stdout_of(outputs) == "widgets True\nTrue\n"
    (bundle,) = bundles_of(outputs)
    assert set(bundle) == {"text/html", "text/plain"}  # the update replaced the widget view
    assert bundle["text/plain"].startswith("memory  plan ") and "per device on v5e-1" in (
        bundle["text/plain"])


@pytest.mark.kernel
def test_in_a_real_kernel_a_plan_shows_its_table():
    """A `MemoryPlan` as a cell's value: the table as text and as an HTML table (not the
    line fine_tune shows before the fork); `print()` gives the plan in words."""
    from tests.helpers import bundles_of, run_notebook, stdout_of

    code = """
        from transformers import LlamaConfig
        import hfxla_nb as hx
        plan = hx.plan_memory(LlamaConfig(hidden_size=64, intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=4, vocab_size=256),
                              hardware="v5e-1", lora=True)
        print(plan)
        plan
        """
    (outputs,) = run_notebook([code])
    (bundle,) = bundles_of(outputs)
    assert bundle["text/plain"].startswith("Llama on v5e-1 (1 device, 15.48 GiB each): ")
    assert "  optimizer state      AdamW " in bundle["text/plain"]
    # The HTML is a panel with a table, not monospaced text nor fine_tune's line again.
    assert bundle["text/html"].startswith(f'<div class="hfxla-plan" style="{BOX}">')
    assert "<pre>" not in bundle["text/html"] and "<table" in bundle["text/html"]
    assert heading("memory plan") in bundle["text/html"] and "fits" in bundle["text/html"]
    assert "per device on v5e-1" not in bundle["text/html"]
    assert stdout_of(outputs).startswith("Llama on v5e-1 (1 device): ")
