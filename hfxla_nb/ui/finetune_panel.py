"""The `FineTuneResult` panel: rows of plain text, as HTML (notebooks) and as text."""

from __future__ import annotations

from html import escape
from typing import Any

from .._words import plural
from .html import sparkline_svg


def _number(name: str, value: float) -> str:
    if name.endswith("_rows"):
        return f"{value:.0f}"
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.1f}"


def result_rows(result: Any) -> list[tuple[str, str]]:
    """(label, text) rows of a `FineTuneResult`."""
    rows = []
    speed = f", {result.samples_per_second:,.1f} samples/s" if result.samples_per_second else ""
    rows.append(("training", f"{plural(result.steps, 'step')} ({result.epochs:.2f} epochs) in "
                 f"{result.train_seconds:.1f} s{speed}"))
    if result.loss_history:
        first, last = result.loss_history[0][1], result.loss_history[-1][1]
        rows.append(("loss", f"{first:.4f} -> {last:.4f}"))
    if result.metrics:
        rows.append(("evaluation", "  ".join(f"{k}={_number(k, v)}"
                                             for k, v in result.metrics.items())))
    per_step = ""
    if result.executions_per_step is not None:
        per_step = (f"; per step: {result.executions_per_step:.2f} executions, "
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
    chart = sparkline_svg([loss for _, loss in result.loss_history], width=240, height=40)
    cells = "".join(
        f'<tr><th style="text-align:left;padding:2px 12px 2px 0;vertical-align:top">'
        f"{escape(name)}</th><td style=\"text-align:left;padding:2px 0\">{escape(value)}"
        + (f"<br>{chart}" if name == "loss" and chart else "")
        + "</td></tr>"
        for name, value in result_rows(result)
    )
    return ('<div style="font-family:var(--jp-ui-font-family,sans-serif);font-size:13px">'
            "<b>FineTuneResult</b><table style=\"border-collapse:collapse;margin-top:4px\">"
            f"{cells}</table></div>")
