"""One visual language for every panel: each HTML panel (`%xla_info`, the
launch's status and progress, a failed launch, `%%xla_metrics`, the memory plan, a
`FineTuneResult`, `Predictions`, the compilations table) is drawn in the one box of
`ui.state`, with its one table style, labels that never wrap, numbers right-aligned,
and colours only from JupyterLab's theme variables (their fallbacks from the one palette).
A result's parameter layout is said in words, not as XLA's sharding text.

Real objects in (a `RuntimeInfo`, launch events, a `MemoryPlan`, a `FineTuneResult`,
`Predictions`, a `TraceLog`), strings out: nothing is launched.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from hfxla_nb.events import Failed, Finished, MetricsSnapshot, Progress, Started
from hfxla_nb.launch.supervision import LaunchRecord, RankRecord
from hfxla_nb.observe import alerts, metrics
from hfxla_nb.observe.tracing import CompileRecord, Frame, TraceLog
from hfxla_nb.runtime import Accelerator, Problem, RuntimeInfo
from hfxla_nb.train.predict import Predictions
from hfxla_nb.train.result import FineTuneResult
from hfxla_nb.ui import html
from hfxla_nb.ui.html import MetricsPanel
from hfxla_nb.ui.panels import (
    PlanNotice,
    plan_table_html,
    predictions_html,
    result_html,
    runtime_html,
)
from hfxla_nb.ui.state import (
    BORDER,
    BORDER_GREY,
    BOX,
    FONT,
    HEADING,
    LABEL,
    NUMBER,
    PALETTE,
    TABLE,
    TRACK_GREY,
    LaunchState,
    heading,
    sharding_words,
)
from tests.helpers import T0, Clock, Elements
from tests.test_ui import SNAPSHOT  # one snapshot of a loop that compiled twice

transformers = pytest.importorskip("transformers")

# What torch_xla's `_get_xla_sharding_spec` returns for the demo LM's embedding under FSDPv2
# over 4 devices, and for a parameter on one device (tests/test_causal_lm.py).
FSDP_4 = "{devices=[4,1]0,1,2,3}"
REPLICATED = "{replicated}"


# -- the panels, from real objects --------------------------------------------------------------


def runtime_panel() -> str:
    info = RuntimeInfo(
        Accelerator("cpu", devices=8, host_cores=2, found_by=["CPU_NUM_DEVICES=8"]),
        "jupyter", {"python": "3.11.7", "torch": "2.9.0", "torch_xla": "2.9.0"}, False,
        {"PJRT_DEVICE": "CPU"},
        [Problem("error", "The runtime started.", "Restart the kernel."),
         Problem("warning", "XLA_USE_BF16 is set.", "Use torch.bfloat16."),
         Problem("info", "A note.", "Nothing to do.")],
        compile_cache="/root/.cache/hfxla_nb/xla (12 entries, 3.0 MiB of 10.0 GiB)")
    return runtime_html(info)


def launch_view(ok: bool):
    """A launch of 2 ranks with bars, charts, metrics with the compilations table and alerts:
    finished, or failed (rank 1 raised)."""
    state = LaunchState(2, clock=Clock())
    for rank in (0, 1):
        state.handle(Started(rank, 2, 100 + rank))
        for step in range(1, 5):
            state.handle(Progress(rank, step, 8, {"loss": 1.0 / step, "lr": 0.001},
                                  samples=8 * step, time=T0 + step * 0.024))
        if ok:
            state.handle(Finished(rank, result=None))
    if not ok:
        state.handle(Failed(1, "ValueError", "bad batch", ""))
    state.handle(MetricsSnapshot(0, 20, SNAPSHOT))
    states = {0: "finished", 1: "finished" if ok else "failed"}
    state.close(LaunchRecord("spmd", 2, [
        RankRecord(rank=rank, exit_state=exit_state, duration=1.0,
                   error=None if exit_state == "finished" else "ValueError: bad batch")
        for rank, exit_state in states.items()], duration=4.0,
        outcome="finished" if ok else "failed"))
    view = state.view()
    return dataclasses.replace(view, metrics=dataclasses.replace(view.metrics, trace=traced()))


def traced() -> TraceLog:
    """Two graphs compiled at one line of a cell: the compilations table's rows."""
    trace = TraceLog()
    where = Frame("train", "/tmp/ipykernel_1/27.py", 12, cell=3)
    trace.add([CompileRecord(1, "user torch_xla.sync", "h1", where=where),
               CompileRecord(2, "user torch_xla.sync", "h2", where=where)])
    return trace


def metrics_panel() -> str:
    summary = dataclasses.replace(metrics.summarize(SNAPSHOT), trace=traced())
    panel = MetricsPanel(summary, alerts.analyze(summary), title="cell 3",
                         note="the XLA runtime started in this kernel")
    return panel._repr_html_()


def llama_7b():
    """Llama-2-7B's shape: too big for one v5e chip, a fit on eight with LoRA."""
    return transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008,
                                    num_hidden_layers=32, num_attention_heads=32,
                                    vocab_size=32000)


def plan_panels() -> list[str]:
    """The plan as a cell's value (with the changes that would make it fit), and the line
    `fine_tune` shows before the fork."""
    from hfxla_nb.train.memory import plan_memory

    too_big = plan_memory(llama_7b(), hardware="v5e-1", batch_size=8, max_length=1024)
    assert too_big.changes
    fits = plan_memory(llama_7b(), hardware="v5e-8", batch_size=8, max_length=512,
                       lora="auto", sharding="auto")
    return [plan_table_html(too_big), PlanNotice(fits, "none").html]


def fine_tune_result(**changes) -> FineTuneResult:
    values = dict(
        output_dir="/runs/lm", loss_history=[(5, 2.5), (10, 1.25), (15, 0.5), (20, 0.25)],
        metrics={"eval_loss": 0.0075, "eval_tokens": 71900.0}, steps=20, epochs=1.0,
        samples_per_second=100.0, train_seconds=3.0, compiles=1, eval_compiles=1,
        executions_per_step=1.0, transfers_per_step=0.1, label_names=[], strategy="spmd",
        devices=4, precision="fp32", bucket_lengths=[64], launch_seconds=5.0,
        task="causal-lm", sharding="fsdp", warnings=["The model learned little."],
        parameter_sharding={"model.embed_tokens.weight": FSDP_4,
                            "model.layers.0.self_attn.q_proj.weight": FSDP_4})
    values.update(changes)
    return FineTuneResult(**values)


def predictions_panel() -> str:
    predicted = Predictions([{"label": "positive", "score": 0.987654321},
                             {"label": "negative", "score": 0.5}])
    predicted.task, predicted.compiles, predicted.seconds = "classification", 1, 0.52
    return predictions_html(predicted)


def every_panel() -> dict[str, str]:
    plan, plan_line = plan_panels()
    return {
        "runtime": runtime_panel(),
        "launch": html.launch_html(launch_view(ok=True)),
        "failure": html.launch_html(launch_view(ok=False)),
        "metrics": metrics_panel(),
        "plan": plan,
        "plan line": plan_line,
        "result": result_html(fine_tune_result()),
        "predictions": predictions_panel(),
    }


@pytest.fixture(scope="module")
def panels() -> dict[str, str]:
    return every_panel()


# -- reading the HTML ---------------------------------------------------------------------------


COLOR = re.compile(r"#[0-9a-fA-F]{3,8}\b|rgba?\([^)]*\)")
THEMED = re.compile(r"var\(--jp-[\w-]+, ?(#[0-9a-fA-F]{3,8}|rgba?\([^)]*\))\)")
# `prop:<value with a colour>;prop:<the same value, the colour as a var()'s fallback>;`
PAIR = re.compile(r"([\w-]+):([^;]*);\1:([^;]*);")
GREYS = {BORDER_GREY, TRACK_GREY}


def bare_colors(style: str) -> list[str]:
    """The colour literals of a style attribute outside a `var(--jp-…, fallback)`, after each
    plain fallback declaration written for sanitizers (`color:#d62728;color:var(…,#d62728);`)
    is taken out; asserts every fallback is the palette's (or its border and track grey)."""
    def unpaired(match: re.Match) -> str:
        prop, plain, themed = match.groups()
        if THEMED.search(themed) and THEMED.sub(lambda m: m[1], themed) == plain:
            return f"{prop}:{themed};"
        return match[0]

    style = PAIR.sub(unpaired, style)
    for fallback in THEMED.findall(style):
        assert fallback in PALETTE | GREYS, fallback
    return COLOR.findall(THEMED.sub("var()", style))


# -- the one box, heading and table -------------------------------------------------------------


def test_every_panels_outer_element_is_the_one_box(panels):
    assert f"border:{BORDER};" in BOX and BOX.startswith(FONT)
    assert BORDER == "1px solid var(--jp-border-color2, rgba(128,128,128,.5))"
    assert "font-family:var(--jp-ui-font-family,sans-serif)" in BOX
    assert "color:var(--jp-content-font-color1," in BOX and "border-radius:" in BOX
    classes = {}
    for name, page in panels.items():
        elements = Elements(page, boxed=True)
        tag, attrs, _ = elements.elements[0]
        assert (tag, attrs["style"]) == ("div", BOX), name
        assert elements.tops == 1, f"{name}: more than the one box at the top"
        # No box inside the box: the panels nest their parts without a border of their own.
        assert [style for style in elements.styles("div")].count(BOX) == 1, name
        classes[name] = attrs["class"]
    # The classes the tests and the browser tests find the panels by.
    assert classes["runtime"] == "hfxla-nb-runtime" and classes["launch"] == "hfxla-launch"
    assert classes["failure"] == "hfxla-launch" and classes["plan"] == "hfxla-plan"
    assert classes["plan line"] == "hfxla-plan"
    assert len(set(classes.values())) == 6


def test_every_panel_has_the_one_heading(panels):
    # How each heading starts (the words after it are the panels' own).
    headings = {"runtime": "hfxla_nb runtime", "metrics": "cell 3", "plan": "memory",
                "plan line": "memory", "result": "FineTuneResult",
                "predictions": "Predictions: 2 inputs (classification)",
                "launch": "XLA metrics", "failure": "XLA metrics"}
    for name, words in headings.items():
        assert heading(words).removesuffix("</b>") in panels[name], name
    (style,) = Elements(heading("x"), boxed=True).styles("b")
    assert style == HEADING == "font-weight:600;font-size:13px;"
    for name, page in panels.items():  # a bold element with a style is a heading, all alike
        assert {found for found in Elements(page, boxed=True).styles("b") if found} == {style}, name


def test_every_table_is_the_one_table_and_its_labels_never_wrap(panels):
    for name, page in panels.items():
        elements = Elements(page, boxed=True)
        assert set(elements.styles("table")) <= {TABLE}, name
        for style in elements.styles("th"):
            assert "white-space:nowrap" in style and "font-weight:600" in style, (name, style)
    # "compile cache" never wraps: the runtime panel's labels are the one label cell.
    assert f'<th style="{LABEL}">compile cache</th>' in panels["runtime"]
    assert f'<td style="{LABEL}">device → host</td>' in panels["metrics"]
    assert f'<th style="{LABEL}">layout</th>' in panels["result"]
    for page in (panels["metrics"], panels["launch"], panels["runtime"], panels["result"]):
        assert len(Elements(page, boxed=True).styles("table")) >= 1


def test_numbers_are_right_aligned_in_tabular_figures(panels):
    assert "text-align:right" in NUMBER and "font-variant-numeric:tabular-nums" in NUMBER
    assert f'<td style="{NUMBER}">0.9877</td>' in panels["predictions"]
    assert f'<td style="{NUMBER}">71,900</td>' in panels["result"]
    assert f'<td style="{NUMBER}">2 graphs</td>' in panels["metrics"]  # compilations table


# -- colours --------------------------------------------------------------------------------------


def test_colours_are_the_themes_variables_with_the_palettes_fallbacks(panels):
    for name, page in panels.items():
        for tag, attrs, _ in Elements(page, boxed=True).elements:
            style = attrs.get("style") or ""
            assert not re.search(r"(?<![-\w])(white|black)(?![-\w])", style), (name, style)
            bare = bare_colors(style)
            if name in ("runtime", "plan") and tag == "span" and "color:#fff;" in style:
                bare.remove("#fff")  # a badge: white on the darker tone of its meaning
            assert not bare, (name, tag, style)
            for attribute in ("stroke", "fill"):  # the charts' lines: the palette's
                assert attrs.get(attribute, "none") in PALETTE | {"none"}, (name, attrs)
    assert "opacity" not in "".join(panels.values())  # muted text is a colour, not a dimming
    assert "color:var(--jp-ui-font-color2,#7f7f7f)" in panels["predictions"]


def test_the_colour_check_catches_a_literal():
    assert bare_colors("color:#333;") == ["#333"]
    assert bare_colors("background:#fff;border:1px solid rgb(0,0,0)") == ["#fff", "rgb(0,0,0)"]
    assert bare_colors("color:#d62728;color:var(--jp-error-color1,#d62728);") == []
    assert bare_colors("color:#111;color:var(--jp-error-color1,#d62728);") == ["#111"]
    with pytest.raises(AssertionError):
        bare_colors("color:var(--jp-ui-font-color1,#123456);")


# -- the layout in words --------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "axis", "words"), [
    (FSDP_4, None, "sharded 4 ways on dim 0"),
    (FSDP_4, "fsdp", "sharded 4 ways on fsdp"),
    (REPLICATED, None, "replicated"),
    ("{devices=[2,2]0,1,2,3}", None, "sharded 2x2 (dims 0 and 1)"),
    ("{devices=[2,2,2]0,1,2,3,4,5,6,7}", "fsdp", "sharded 2x2x2 (dims 0, 1 and 2)"),
    ("{devices=[1,4]0,1,2,3}", "fsdp", "sharded 4 ways on fsdp (dim 1)"),
    ("{devices=[1,4]0,1,2,3 last_tile_dim_replicate}", None, "replicated"),
    ("{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}", "data",
     "sharded 2 ways on data, each shard on 2 devices"),
    ("{devices=[4,1]<=[4]}", "fsdp", "sharded 4 ways on fsdp"),  # XLA's iota form
    ("{devices=[2,1,2]<=[2,2]T(1,0) last_tile_dims={replicated}}", None,
     "sharded 2 ways on dim 0, each shard on 2 devices"),
    ('{devices=[8,1]0,1,2,3,4,5,6,7 metadata={op_name="embed"}}', None,
     "sharded 8 ways on dim 0"),
    ("{maximal device=0}", None, "on device 0 only"),
])
def test_a_sharding_spec_reads_as_words(spec, axis, words):
    assert sharding_words(spec, axis) == words


@pytest.mark.parametrize("spec", ["{manual}", "{devices=[2,1,2]0,1,2,3 last_tile_dims={manual}}",
                                  "{{replicated}, {devices=[4]0,1,2,3}}", "", "not a spec"])
def test_a_spec_of_another_form_is_shown_as_it_is(spec):
    assert sharding_words(spec, "fsdp") == spec


def test_the_results_layout_rows_say_the_sharding_in_words(panels):
    page = panels["result"]
    assert "model.embed_tokens.weight: sharded 4 ways on fsdp" in page
    assert "devices=" not in page and "{replicated}" not in page
    one_device = result_html(fine_tune_result(
        sharding="data", parameter_sharding={"model.embed_tokens.weight": REPLICATED}))
    assert "model.embed_tokens.weight: replicated" in one_device
    # The data keeps XLA's own text.
    assert fine_tune_result().parameter_sharding["model.embed_tokens.weight"] == FSDP_4
