"""The `FineTuneResult` panel: rows of plain text, as HTML (notebooks) and as text."""

from __future__ import annotations

import re
from html import escape
from typing import Any

from .._words import plural
from .html import COLORS, SERIES, sparkline_svg
from .metric_table import evaluation_html, evaluation_text
from .plan_panel import plan_text
from .sharding_words import sharding_words
from .table_style import (
    LABEL,
    SMALL,
    TABLE,
    TD,
    TR,
    cell,
    heading,
    panel,
    row,
    table,
    text_color,
)
from .units import duration, size

# Loss entries shown in the text chart; longer histories are sampled down to this many.
TEXT_CHART_WIDTH = 32
SPARK_CHARS = "▁▂▃▄▅▆▇█"
GIB = 2**30


def sampled(values: list[float], width: int) -> list[float]:
    """At most `width` of `values`, evenly spaced, the first and the last kept."""
    if len(values) <= width:
        return list(values)
    stride = (len(values) - 1) / (width - 1)
    return [values[round(i * stride)] for i in range(width)]


def loss_extremes(result: Any) -> tuple[tuple[int, float], tuple[int, float]]:
    """((step, highest loss), (step, lowest loss)) of the logged losses."""
    history = [(step, loss) for step, loss in result.loss_history if loss == loss]
    return (max(history, key=lambda pair: pair[1]), min(history, key=lambda pair: pair[1]))


def loss_scale(result: Any) -> str:
    """`█ 2.3145 at step 4, ▁ 0.1234 at step 44`: the text chart's scale."""
    (high_step, high), (low_step, low) = loss_extremes(result)
    return (f"{SPARK_CHARS[-1]} {high:.4f} at step {high_step}, "
            f"{SPARK_CHARS[0]} {low:.4f} at step {low_step}")


def loss_text_chart(losses: list[float], width: int = TEXT_CHART_WIDTH) -> str:
    """The loss as a line of block characters, lowest `▁`, highest `█`."""
    values = [loss for loss in losses if loss == loss]
    points = sampled(values, width)
    low, high = min(values), max(values)  # the scale of every loss, sampled out or not
    top = len(SPARK_CHARS) - 1
    return "".join(SPARK_CHARS[top // 2 if high == low
                               else round((value - low) / (high - low) * top)]
                   for value in points)


def lora_row(result: Any) -> str | None:
    """`r=8, alpha=16, on all-linear; 73,728 of 1,234,567 parameters trained (5.97%); the
    adapter alone in <output_dir>/adapter`; None for a full fine-tune."""
    lora = result.lora
    if not lora:
        return None
    targets = lora.get("target_modules") or "all-linear"
    if not isinstance(targets, str):
        targets = ", ".join(sorted(targets))
    text = f"r={lora.get('r')}, alpha={lora.get('lora_alpha')}, on {targets}"
    trainable, total = result.trainable_parameters, result.parameters
    if trainable and total:
        text += f"; {trainable:,} of {total:,} parameters trained ({trainable / total:.2%})"
    if result.output_dir:
        text += (f"; the adapter alone in {result.output_dir}/adapter "
                 "(result.load_model(merge=False) loads it on its base)")
    return text


def memory_row(result: Any) -> str | None:
    """`plan 1.2 GiB per device (...), XLA measured 1.0 GiB (the largest graph): 0.83x the
    plan`: the memory plan the run was checked with beside what XLA's analysis of the
    compiled graphs says the largest one needs; None when the run had no plan."""
    plan = result.memory_plan
    if not plan:
        return None
    planned = round(plan["total_gib"] * GIB)
    text = plan_text(plan)  # the words the cell showed before the launch
    measured = result.xla.get("largest_graph_bytes")
    if measured:
        text += (f", XLA measured {size(measured)} (the largest graph): "
                 f"{measured / planned:.2f}x the plan")
    else:
        text += ", XLA measured nothing (trace_compiles=False)"
    return text


def next_step(result: Any) -> str | None:
    """What to do with the result now, as code to type."""
    if not result.output_dir:
        return None
    if result.generates:
        return ('result.generate(["a prompt"], max_new_tokens=32) continues prompts on the '
                "CPU here; result.load_model() and result.load_tokenizer() give the model "
                "and its tokenizer (the XLA runtime stays off, so you can launch again)")
    example = result.predict_example or '["a text"]'
    processor = getattr(result, "processor", None) or "tokenizer"
    load = "load_tokenizer" if processor == "tokenizer" else "load_processor"
    return (f"result.predict({example}) predicts on every XLA device (in a launched worker); "
            f"result.load_model() and result.{load}() give the trained model and its "
            f"{processor} on the CPU here (the XLA runtime stays off, so you can launch again)")


def _time_row(result: Any) -> str:
    """`launch 10.4 s: training loop 7.4 s, evaluation 0.4 s, start-up and saving 2.6 s`:
    what each time counts, so the launch panel's, the bar's and this one agree."""
    parts = [f"training loop {duration(result.train_seconds)}"]
    if result.metrics:
        parts.append(f"evaluation {duration(result.eval_seconds)}")
    launch = result.launch_seconds
    if launch is None:
        return ", ".join(parts)
    rest = launch - result.train_seconds - result.eval_seconds
    if rest > 0:
        parts.append(f"start-up and saving {duration(rest)}")
    return f"launch {duration(launch)}: " + ", ".join(parts)


def _speed_row(result: Any) -> str | None:
    """`493.2 samples/s after warm-up; 205.0 samples/s over the whole training loop`."""
    parts = []
    if result.samples_per_second:
        parts.append(f"{result.samples_per_second:,.1f} samples/s after warm-up (the compiling "
                     "first steps left out)")
    overall = result.samples_per_second_overall
    if overall:
        parts.append(f"{overall:,.1f} samples/s over the whole training loop")
    return "; ".join(parts) or None


def _task_text(result: Any) -> str:
    """`labels ['neg', 'pos']` for a classifier (the task's `shows_labels`); else the task, its
    sharding and checkpointing: `causal LM, fsdp sharding, torch_xla gradient checkpointing`."""
    if result.shows_labels:
        return f"labels {result.label_names}"
    text = f"{result.task_title or result.task}, {result.sharding} sharding"
    if result.gradient_checkpointing:
        text += ", torch_xla gradient checkpointing"
    return text


def mesh_axis(result: Any) -> str:
    """The mesh axis a sharded parameter lies on: the worker's SPMD mesh is `(devices, 1)`,
    its first axis named "fsdp" for FSDPv2 and "data" otherwise (`WorkerContext.axis`)."""
    return "fsdp" if result.sharding == "fsdp" else "data"


def result_rows(result: Any) -> list[tuple[str, str]]:
    """(label, text) rows of a `FineTuneResult`; warnings first."""
    rows = [("warning", warning) for warning in result.warnings]
    rows.append(("training", f"{plural(result.steps, 'step')} "
                             f"({plural(round(result.epochs, 2), 'epoch')})"))
    rows.append(("time", _time_row(result)))
    speed = _speed_row(result)
    if speed:
        rows.append(("throughput", speed))
    if result.loss_history:
        first, last = result.loss_history[0][1], result.loss_history[-1][1]
        steps = (f" over steps {result.loss_history[0][0]}-{result.loss_history[-1][0]}"
                 if len(result.loss_history) > 1 else "")
        rows.append(("loss", f"{first:.4f} -> {last:.4f}{steps}"))
    if result.metrics:
        rows.append(("evaluation", evaluation_text(result.metrics)))
    per_step = ""
    if result.executions_per_step is not None:
        per_step = (f"; per step after warm-up: {result.executions_per_step:.2f} executions, "
                    f"{result.transfers_per_step:.2f} device-to-host transfers")
    setup = ""
    if result.setup_compiles:  # the metrics count them: say which they are (#28 item 9)
        setup = (f"; and {result.setup_compiles} before step 1 (AdamW's first state), "
                 f"{result.compiles + result.eval_compiles + result.setup_compiles} in all")
    rows.append(("XLA", f"{result.compiles} training + {result.eval_compiles} evaluation graphs "
                 f"compiled{per_step}{setup}"))
    what = _task_text(result)
    rows.append(("setup", f"{result.strategy} over {plural(result.devices, 'device')}, "
                 f"{result.precision}, batch {result.batch_size}, lengths "
                 f"{result.bucket_lengths}, {what}"))
    adapter = lora_row(result)
    if adapter:
        rows.append(("LoRA", adapter))
    memory = memory_row(result)
    if memory:
        rows.append(("memory", memory))
    for name, spec in list(result.parameter_sharding.items())[:2]:
        if not result.shows_labels or "devices=" in spec:
            rows.append(("layout", f"{name}: {sharding_words(spec, mesh_axis(result))}"))
    if result.resumed_from:
        rows.append(("resumed from", result.resumed_from))
    if result.output_dir:
        rows.append(("saved to", result.output_dir))
    rows += [("note", note) for note in result.notes]
    hint = next_step(result)
    if hint:
        rows.append(("next", hint))
    return rows


def result_text(result: Any) -> str:
    rows = result_rows(result)
    width = max(len(name) for name, _ in rows)
    lines = ["FineTuneResult"]
    for name, value in rows:
        first, *more = value.split("\n")  # a table (evaluation) continues under its first line
        lines.append(f"  {name:<{width}}  {first}")
        lines += [f"  {'':<{width}}  {line}" for line in more]
        if name == "loss" and len(result.loss_history) > 1:
            chart = loss_text_chart([loss for _, loss in result.loss_history])
            lines.append(f"  {'':<{width}}  {chart}  ({loss_scale(result)})")
    return "\n".join(lines)


CHART_WIDTH, CHART_HEIGHT = 240, 40
# The chart's scale: small secondary text, on one line.
_SCALE = SMALL + "line-height:1;"


def loss_chart_html(result: Any) -> str:
    """The loss chart with its scale: the highest and lowest loss beside it, the first and
    last step under it; '' for fewer than 2 losses."""
    history = [(step, loss) for step, loss in result.loss_history if loss == loss]
    points = sampled([loss for _, loss in history], CHART_WIDTH)
    chart = sparkline_svg(points, width=CHART_WIDTH, height=CHART_HEIGHT, color=SERIES["loss"])
    if not chart:
        return ""
    # The one table, its cells tight around the chart: the scale sits against the line.
    edge = "border:none;padding:0 4px 0 0;background:transparent;"
    return (
        f'<table style="{TABLE}"><tbody>'
        f'<tr style="{TR}"><td style="{edge}{_SCALE}text-align:right;'
        f'vertical-align:top">{max(points):.4f}</td><td rowspan="2" style="{edge}">{chart}'
        f'</td></tr><tr style="{TR}"><td style="{edge}{_SCALE}'
        f'text-align:right;vertical-align:bottom">{min(points):.4f}</td></tr>'
        f'<tr style="{TR}"><td style="{edge}"></td><td style="{edge}">'
        f"{step_axis_html(history[0][0], history[-1][0])}</td></tr></tbody></table>"
    )


def step_axis_html(first: int, last: int) -> str:
    """The chart's step axis: `step <first>` under its left end, `step <last>` under its right.

    A row of two elements spread apart (flex, `space-between`, a gap), with a space between
    them: where the styles are dropped (a sanitizer, a copy as text) the labels still read
    `step 10 step 60`, never `step 10step 60`.
    """
    return (f'<div style="display:flex;justify-content:space-between;gap:12px;'
            f'width:{CHART_WIDTH}px;{_SCALE}"><span>step {first}</span> '
            f"<span>step {last}</span></div>")


def result_html(result: Any) -> str:
    """The result in the one box: its heading, then a row per `result_rows` entry (the loss
    with its chart, the evaluation as its own table, warnings in the warning colour)."""
    chart = loss_chart_html(result)

    def value_html(name: str, value: str) -> str:
        if name == "evaluation":
            return evaluation_html(result.metrics)
        # The code to type (`result.load_model()`, ...), as code.
        text = re.sub(r"(result\.\w+\([^)]*\))", r"<code>\1</code>", escape(value))
        return text + (chart if name == "loss" else "")

    def line(name: str, value: str) -> str:
        warn = text_color(COLORS["warning"]) + "font-weight:600;" if name == "warning" else ""
        return row([cell(escape(name), LABEL + warn, "th"),
                    cell(value_html(name, value), TD + warn)])

    rows = [line(name, value) for name, value in result_rows(result)]
    return panel(heading("FineTuneResult") + table(rows), "hfxla-result")
