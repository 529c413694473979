"""The `FineTuneResult` panel: rows of plain text, as HTML (notebooks) and as text."""

from __future__ import annotations

from html import escape
from typing import Any

from .._words import plural
from .html import COLORS, SERIES, sparkline_svg, text_color
from .units import duration


def _number(name: str, value: float) -> str:
    if name.endswith("_rows"):
        return f"{value:.0f}"
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.1f}"


def _time_row(result: Any) -> str:
    """`launch 10.4 s: training loop 7.4 s, evaluation 0.4 s, start-up and saving 2.6 s`:
    what each time counts, so the launch panel's, the bar's and this one agree."""
    parts = [f"training loop {duration(result.train_seconds)}"]
    if result.metrics:
        parts.append(f"evaluation {duration(result.eval_seconds)}")
    launch = getattr(result, "launch_seconds", None)
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
    overall = getattr(result, "samples_per_second_overall", None)
    if overall:
        parts.append(f"{overall:,.1f} samples/s over the whole training loop")
    return "; ".join(parts) or None


def result_rows(result: Any) -> list[tuple[str, str]]:
    """(label, text) rows of a `FineTuneResult`; warnings first."""
    rows = [("warning", warning) for warning in getattr(result, "warnings", [])]
    rows.append(("training", f"{plural(result.steps, 'step')} "
                             f"({plural(round(result.epochs, 2), 'epoch')})"))
    rows.append(("time", _time_row(result)))
    speed = _speed_row(result)
    if speed:
        rows.append(("throughput", speed))
    if result.loss_history:
        first, last = result.loss_history[0][1], result.loss_history[-1][1]
        rows.append(("loss", f"{first:.4f} -> {last:.4f}"))
    if result.metrics:
        rows.append(("evaluation", "  ".join(f"{k}={_number(k, v)}"
                                             for k, v in result.metrics.items())))
    per_step = ""
    if result.executions_per_step is not None:
        per_step = (f"; per step after warm-up: {result.executions_per_step:.2f} executions, "
                    f"{result.transfers_per_step:.2f} device-to-host transfers")
    rows.append(("XLA", f"{result.compiles} training + {result.eval_compiles} evaluation graphs "
                 f"compiled{per_step}"))
    task = getattr(result, "task", "classification")
    what = (f"labels {result.label_names}" if task == "classification"
            else f"causal LM, {getattr(result, 'sharding', 'data')} sharding"
            + (", torch_xla gradient checkpointing"
               if getattr(result, "gradient_checkpointing", False) else ""))
    rows.append(("setup", f"{result.strategy} over {plural(result.devices, 'device')}, "
                 f"{result.precision}, batch {result.batch_size}, lengths "
                 f"{result.bucket_lengths}, {what}"))
    for name, spec in list((getattr(result, "parameter_sharding", None) or {}).items())[:2]:
        if task != "classification" or "devices=" in spec:
            rows.append(("layout", f"{name}: {spec}"))
    if result.resumed_from:
        rows.append(("resumed from", result.resumed_from))
    if result.output_dir:
        rows.append(("saved to", result.output_dir))
    rows += [("note", note) for note in result.notes]
    return rows


def result_text(result: Any) -> str:
    rows = result_rows(result)
    width = max(len(name) for name, _ in rows)
    return "\n".join(["FineTuneResult"] + [f"  {name:<{width}}  {value}" for name, value in rows])


def result_html(result: Any) -> str:
    chart = sparkline_svg([loss for _, loss in result.loss_history], width=240, height=40,
                          color=SERIES["loss"])
    cell = "text-align:left;vertical-align:top;line-height:1.4;border:none;"

    def row(name: str, value: str) -> str:
        warn = text_color(COLORS["warning"]) + "font-weight:600;" if name == "warning" else ""
        return (f'<tr style="background:transparent"><th style="{cell}padding:2px 12px 2px 0;'
                f'{warn}">{escape(name)}</th><td style="{cell}padding:2px 0;{warn}">'
                f"{escape(value)}" + (f"<br>{chart}" if name == "loss" and chart else "")
                + "</td></tr>")

    cells = "".join(row(name, value) for name, value in result_rows(result))
    return ('<div style="font-family:var(--jp-ui-font-family,sans-serif);font-size:13px">'
            '<b>FineTuneResult</b><table style="border-collapse:collapse;margin-top:4px;'
            'font-size:13px;table-layout:auto;color:inherit"><tbody>'
            f"{cells}</tbody></table></div>")
