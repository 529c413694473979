"""The analyzer: a run's `XlaSummary` in, alerts in plain language out; and XLA's
out-of-memory texts explained.

It applies PyTorch/XLA's own thresholds (the ones `PT_XLA_DEBUG_LEVEL` reports): more than 0.5
compiles per step once past 10 warm-up steps, more than 0.5 device-to-host transfers per step,
any CPU fallback other than `aten::_local_scalar_dense`, any compile over 300 s or execution
over 30 s. Beyond torch_xla's rules, an input reported with more than `MAX_QUIET_SHAPES` shapes
is named even when every compilation fell in the warm-up; a run that compiled a new graph at
nearly every step is flagged even in its warm-up; transfers per step wait for
`MIN_RATE_STEPS` steps.

When the run was traced (`summary.trace`), the alerts name the line: the one that compiled the
different graphs, the one that fetched a value, the one whose graph needs more device memory
than the device has. The trace alone is enough to warn of recompiling (`recompiling_line`).
Severity follows what a problem costs, not how often it happens: recompilation that took most
of the XLA time (`COSTLY_COMPILE_SHARE`) is a warning even below torch_xla's rate threshold.

The alerts' words (`Alert`, and what a change of input shapes, a fetch or a fallback is said to
cause and how to fix it) are written apart from the rules. The fix for changing shapes names
the kind of input: tokenizer outputs are padded by the tokenizer, other tensors by the code
that builds them.

TPU memory (HBM) exhaustion: XLA says a program does not fit a TPU's HBM in a few forms, all a
wall of allocator text (at compile time "Ran out of memory in memory space hbm...", at run time
"Attempting to reserve 10.51G ... There are 8.97G free", PJRT's "Error allocating device
buffer: ...", the older "Resource exhausted: ..."). `parse_hbm_exhaustion` reads any of them
into an `HbmExhaustion`; its `explain()` gives one line that says what needed how much of how
much, then the fixes in order of cost. Pure functions of the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from .._words import data_size, duration, plural
from .metrics import MAX_QUIET_SHAPES, WARMUP_STEPS, InputShapes, XlaSummary, shape_changes
from .tracing import CompileRow, ExecutionSite, Frame

# -- the alerts' words: causes and fixes --

# torch_xla/csrc/runtime/metrics_analysis.cc
MAX_TRANSFERS_PER_STEP = 0.5
# The events of `transformers.TrainerCallback` (tests/test_trainer_flow.py holds the list to
# transformers'): a value read in one of them is a callback's, and `fine_tune` calls it every
# step or log.
CALLBACK_EVENTS = frozenset({
    "on_init_end", "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
    "on_step_begin", "on_pre_optimizer_step", "on_optimizer_step", "on_substep_end",
    "on_step_end", "on_evaluate", "on_predict", "on_save", "on_log", "on_prediction_step",
    "on_push_begin"})
# Compiling this share of the XLA time (compile + execute) or more makes recompilation a warning.
COSTLY_COMPILE_SHARE = 0.5
# Inputs a tokenizer makes (their fix is the tokenizer's padding); other tensors are the
# program's own.
TOKENIZER_INPUTS = frozenset({"input_ids", "attention_mask", "token_type_ids", "position_ids",
                              "special_tokens_mask", "offset_mapping"})


@dataclass(frozen=True)
class Alert:
    """One finding, in plain language.

    Attributes:
        code: a stable identifier ("frequent-compiles", "frequent-transfers", "cpu-fallback",
            "recompiled", "slow-compile", "slow-execution").
        severity: "error", "warning" or "info".
        title: one line.
        explanation: what happened and its likely cause.
        fix: what to change.
    """

    code: str
    severity: str
    title: str
    explanation: str
    fix: str


def shapes_listed(changed: dict[str, InputShapes], limit: int = 6,
                   opening: str = "input") -> str:
    """`input 'x' had 23 different shapes: (9, 8), ..., (14, 8) and 17 more; input 'y' ...`
    (`opening="Input"`: the same list opening a sentence)."""
    return "; ".join(
        f"{opening if index == 0 else 'input'} '{name}' had {info.count_text()}: "
        f"{info.listed_text(limit)}"
        for index, (name, info) in enumerate(changed.items())
    )


def shapes_cause(changed: dict[str, InputShapes]) -> str:
    return (
        "The likely cause: the input shapes changed ("
        + shapes_listed(changed)
        + "). XLA compiles a new graph for every new shape."
    )


# What follows "Give" (or "give", after a colon) in the fix for changing shapes.
_TOKENIZER_FIX = (
    "every batch the same shape: pad to a fixed length (tokenizer(..., "
    "padding='max_length', max_length=N, truncation=True)) or to a few bucket lengths"
)
_TENSOR_FIX = (
    "the tensors the same shape in every step: pad or crop them to a fixed size "
    "(torch.nn.functional.pad), or to a few bucket sizes, where the batch is built"
)
# How to name the input whose shape changes, when nothing named it. torch_xla's own analysis
# cannot name it (checked on torch_xla 2.9): its compilation block gives the cause, the graph
# hash, the number of graph inputs and outputs and the Python frames, and its post-compilation
# block the inputs' total size in GB (6 decimals), never an input's name or shape.
# `_XLAC._get_xla_tensors_text` and `_get_xla_tensor_debug_info` describe tensors one holds,
# and `_XLAC` lists no live tensors (`_xla_sync_live_tensors` syncs them); the IR dumps
# (`XLA_SAVE_TENSORS_FILE`, `XLA_IR_DEBUG`) write every graph of every step, far from cheap.
# So only `report(inputs=...)` names the input.
INPUTS_HINT = ("To see which input changes shape, pass the step's inputs to report: "
               "hx.report(step=step, loss=loss, inputs=batch) (a dict of tensors, or "
               "inputs={'x': x}).")


def last_batch_fix(summary: XlaSummary) -> str:
    """The DataLoader part of a shape fix, only where it can apply: said plainly when the
    code uses a DataLoader, as a condition when that is not known, not at all when it does
    not."""
    if summary.dataloader is False:
        return ""
    if summary.dataloader:
        return ", and use drop_last=True in the DataLoader so the last batch is not smaller"
    return "; if the batches come from a DataLoader, drop_last=True keeps the last one whole"


def shapes_fix(changed: dict[str, InputShapes], summary: XlaSummary,
                opening: str = "Give") -> str:
    """The fix for the inputs whose shape changed: the tokenizer's padding for tokenizer
    outputs, padding the tensors themselves for anything else (`opening="give"`: after a
    colon)."""
    fix = _TOKENIZER_FIX if any(name in TOKENIZER_INPUTS for name in changed) else _TENSOR_FIX
    return f"{opening} {fix}{last_batch_fix(summary)}."


def cost_severity(summary: XlaSummary) -> str:
    """"warning" when compiling took most of the XLA time, else "info"."""
    share = summary.compile_share
    return "warning" if share is not None and share >= COSTLY_COMPILE_SHARE else "info"


def share_text(summary: XlaSummary) -> str:
    """` Compiling took 99% of the XLA time.` (or '' when nothing was timed)."""
    share = summary.compile_share
    return "" if share is None else f" Compiling took {share * 100:.0f}% of the XLA time."


def compile_cause(summary: XlaSummary) -> tuple[str, str]:
    """The likely cause of recompilations and its fix, from shapes, transfers and fallbacks."""
    changed = shape_changes(summary.input_shapes)
    if changed:
        return shapes_cause(changed), shapes_fix(changed, summary)
    transfers = summary.per_step(summary.transfers_from_device)
    if transfers is not None and transfers > MAX_TRANSFERS_PER_STEP:
        return (
            "The likely cause: a value is fetched from the device inside the step "
            f"({plural(summary.transfers_from_device, 'transfer')} in "
            f"{plural(summary.steps or 0, 'step')}), which cuts "
            "the graph in two, and the pieces differ from step to step.",
            "Do not call .item(), print a tensor or branch on a tensor's value inside the step; "
            "report values with hfxla_nb.report(loss=loss), which fetches them every few steps.",
        )
    if summary.fallbacks:
        ops = ", ".join(summary.fallbacks)
        return (
            f"The likely cause: operations that ran on the CPU ({ops}) split the graph.",
            "Replace the operations listed in the CPU-fallback alert.",
        )
    return (
        f"No input shape change was reported. {INPUTS_HINT} PT_XLA_DEBUG_LEVEL=2 has "
        "PyTorch/XLA print the cause of each compilation.",
        "Keep shapes and Python control flow the same in every step.",
    )


# -- the analyzer: torch_xla's thresholds, and the traced lines --

# torch_xla/csrc/runtime/metrics_analysis.cc
MAX_COMPILES_PER_STEP = 0.5
MAX_COMPILE_SECONDS = 300.0
MAX_EXECUTE_SECONDS = 30.0
# Beyond torch_xla's rules: a run of at least this many steps that compiled a new graph at
# nearly every step (compiles >= steps) is flagged even inside the warm-up...
MIN_EVERY_STEP = 3
# ... and transfers per step are judged only over this many steps (one fetch in a 2-step
# cell is not a habit).
MIN_RATE_STEPS = 3
# More different graphs than this at one line of the user's is recompiling, even when all of
# them compiled in the warm-up: the first step's graph, and one per bucket of up to
# `MAX_QUIET_SHAPES` buckets (the fix the alert itself recommends).
MAX_QUIET_GRAPHS = MAX_QUIET_SHAPES + 1


def _shape_changes_alert(summary: XlaSummary, many: dict[str, InputShapes],
                         warmup_steps: int) -> Alert:
    """Inputs with many shapes, when the rate rules stay silent: every compile may have
    happened during warm-up (shapes that cycle), but each shape still cost a compilation and
    any new one costs another."""
    names = ", ".join(f"'{name}'" for name in many)
    if len(many) == 1:
        title = f"Input {names} took {next(iter(many.values())).count_text()}"
    else:
        title = f"Inputs {names} took many different shapes"
    listed = shapes_listed(many, opening="Input")
    compiled = ""
    if summary.compiles:
        during = _compiled_during(many, warmup_steps) if summary.compiles_after_warmup == 0 else ""
        compiled = (f" This run compiled {plural(summary.compiles, 'graph')}{during}."
                    f"{share_text(summary)}")
    return Alert(
        "shape-changes", cost_severity(summary), title,
        f"{listed}. XLA compiles a new graph for every new input "
        f"shape.{compiled} Later steps reuse those graphs, but each compilation can take "
        "minutes on a TPU, and every shape not seen yet (a longer text, a smaller last "
        "batch, an evaluation batch) compiles again.",
        shapes_fix(many, summary),
    )


def _compiled_during(many: dict[str, InputShapes], warmup_steps: int) -> str:
    """`, in steps 1-6, as each new shape first appeared`: the steps the shapes' first
    appearances span, when every shape is listed with its step; else the warm-up's bound
    (the bound alone said "all in the first 10 steps" of compiles made in steps 1-6)."""
    steps = [step for info in many.values() for step in info.first_steps]
    if steps and None not in steps and all(info.more == 0 for info in many.values()):
        low, high = min(steps), max(steps)
        span = f"step {low}" if low == high else f"steps {low}-{high}"
        return f", in {span}, as each new shape first appeared"
    return f", none after step {warmup_steps}"


def analyze(summary: XlaSummary, *, warmup_steps: int = WARMUP_STEPS) -> list[Alert]:
    """Alerts for a summary, at PyTorch/XLA's own thresholds, most severe first.

    Args:
        summary: from `summarize`.
        warmup_steps: steps allowed to compile freely before compiles per step count.
    """
    # Compilations after the last step (saving, evaluation) are not the training step's.
    alerts = _compile_alerts(summary.steps_only(), warmup_steps)
    for rule in (_transfers_alert, graph_memory_alert, _fallback_alert, _slow_compile_alert,
                 _slow_execution_alert):
        alert = rule(summary)
        if alert is not None:
            alerts.append(alert)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(alerts, key=lambda alert: order.get(alert.severity, 3))


def _unit(summary: XlaSummary) -> str:
    return "step" if summary.ranks <= 1 else f"step of each of the {summary.ranks} ranks"


def _compile_alerts(summary: XlaSummary, warmup_steps: int) -> list[Alert]:
    """At most one of: compiles nearly every step, recompiles after warm-up (with the input
    whose shape changed), or inputs of many shapes that have not (yet) recompiled much."""
    steps = summary.steps
    changed = shape_changes(summary.input_shapes)
    compile_rate = summary.per_step(summary.compiles)
    every_step = compiles_every_step(summary)
    fires = bool(steps) and ((steps > warmup_steps and compile_rate > MAX_COMPILES_PER_STEP)
                             or every_step)
    row = recompiling_row(summary)
    many = {name: info for name, info in changed.items() if info.distinct > MAX_QUIET_SHAPES}
    line = recompiling_line(summary)
    if fires or (many and row is not None and row.graphs >= 2) or line is not None:
        # An input of many shapes and the line that compiled a graph per shape are settled facts:
        # from the first snapshot that shows both, the alert stays this one, its numbers
        # updated, whatever the rate does (else the live panel switches between two alerts
        # as the rate crosses torch_xla's threshold, and its height jumps each time). The
        # trace alone settles it too, `inputs=` or not: a line of the user's that compiled a
        # new graph after the warm-up, or more graphs than a few buckets explain.
        severity = "warning" if fires else cost_severity(summary)
        named = row if fires or many else line
        return [_frequent_compiles(summary, warmup_steps, _unit(summary), named, severity)]
    if summary.compiles_after_warmup and summary.steps_after_warmup and changed:
        cause, fix = compile_cause(summary)
        return [Alert(
            "recompiled", cost_severity(summary),
            f"Recompiling: {plural(summary.compiles, 'compile')} in {plural(steps or 0, 'step')}, "
            f"{summary.compiles_after_warmup} after warm-up",
            f"XLA compiled {plural(summary.compiles_after_warmup, 'new graph')} in the "
            f"{plural(summary.steps_after_warmup, 'step')} after warm-up."
            f"{share_text(summary)} {cause}",
            fix,
        )]
    return [_shape_changes_alert(summary, many, warmup_steps)] if many else []


def _transfers_alert(summary: XlaSummary) -> Alert | None:
    steps, transfers = summary.steps, summary.transfers_from_device
    transfer_rate = summary.per_step(transfers)
    if not (steps and steps >= MIN_RATE_STEPS and transfer_rate > MAX_TRANSFERS_PER_STEP):
        return None
    if summary.reshards:
        return _reshard_alert(summary)
    items = f", {summary.item_calls} of them .item() calls" if summary.item_calls else ""
    title, where, fix = _fetch_sites(summary)
    if _mask_check(summary):
        return Alert(
            "frequent-transfers", "warning",
            f"Device-to-host transfers: {transfers} in {steps} steps{title}",
            f"The program fetched values from the device {transfer_rate:.2f} times per "
            f"{_unit(summary)} (more than {MAX_TRANSFERS_PER_STEP}).{where} That is "
            "transformers' attention-mask check: it asks the device whether the padding mask "
            "is all ones (padding_mask.all()) at every forward pass, which cuts the step's "
            "graph in two and waits for the device.",
            "Pad every batch to one fixed length (tokenizer(..., padding='max_length', "
            "max_length=N, truncation=True)) and apply hfxla_nb's transformers patches around "
            "the training: `with hx.patches.applied(): ...` (hx.patches keeps the mask on "
            "XLA, with the same results; fine_tune applies them itself).",
        )
    callback = _callback_site(summary)
    if callback is not None:
        return Alert(
            "frequent-transfers", "warning",
            f"Device-to-host transfers: {transfers} in {steps} steps, values read by a "
            f"TrainerCallback at {callback.text()}",
            f"The program fetched values from the device {transfer_rate:.2f} times per "
            f"{_unit(summary)} (more than {MAX_TRANSFERS_PER_STEP}){items}.{where} The callback "
            f"reads a tensor's value in `{callback.function}`, which runs at every step or log: "
            "each read waits for the device to finish and stops the next step's tracing from "
            "overlapping with it.",
            f"{fix}read the value every N steps (`if state.global_step % N == 0:`), or use "
            "what the run already fetched: `logs` in on_log (the loss and learning rate every "
            "log_every steps) and `metrics` in on_evaluate.",
        )
    return Alert(
        "frequent-transfers", "warning",
        f"Device-to-host transfers: {transfers} in {steps} steps{title}",
        f"The program fetched values from the device {transfer_rate:.2f} times per "
        f"{_unit(summary)} (more than {MAX_TRANSFERS_PER_STEP}){items}.{where} Each fetch waits "
        "for the device to finish and stops the next step's tracing from overlapping with it. "
        "Typical causes: .item(), print(tensor), `if tensor:`, logging every step (Trainer "
        "with logging_steps=1), and transformers' attention-mask check on padded batches.",
        f"{fix}{'f' if fix else 'F'}etch values only every N steps: "
        "fine_tune(..., log_every=N), hfxla_nb.report(loss=loss, log_every=N) or "
        "xm.add_step_closure; log less often; keep decisions on the host.",
    )


def _reshard_alert(summary: XlaSummary) -> Alert:
    """The transfers made by `xs.mark_sharding` on tensors already used (`observe.metrics.watch`
    counted each by its line): found, not guessed."""
    steps, transfers = summary.steps, summary.transfers_from_device
    copies = sum(count for _, count in summary.reshards)
    first = summary.reshards[0][0].text()
    listed = "; ".join(f"{frame.text()} ({plural(count, 'time')})"
                       for frame, count in summary.reshards[:3])
    size = ""
    if summary.bytes_from_device and steps:
        size = f", {data_size(summary.bytes_from_device / steps)} a step"
    rest = transfers - copies
    others = (f" The other {plural(rest, 'transfer')} came from elsewhere (value reads)."
              if rest > 0 else "")
    return Alert(
        "frequent-transfers", "warning",
        f"Device-to-host transfers: {transfers} in {steps} steps, by mark_sharding at {first}",
        f"{copies} of the {plural(transfers, 'transfer')} were made by xs.mark_sharding on a "
        "tensor that an operation had already used, so torch_xla copied the tensor to the "
        f"host and back to shard it{size}: {listed}. Each copy waits for the device.{others}",
        f"At {first}: call xs.mark_sharding on the tensor right after it is created or moved "
        "to the device, before any operation uses it (or upload it sharded: "
        "MpDeviceLoader's input_sharding).",
    )


def _fallback_alert(summary: XlaSummary) -> Alert | None:
    if not summary.fallbacks:
        return None
    ops = ", ".join(f"{op} ({count}x)" for op, count in summary.fallbacks.items())
    return Alert(
        "cpu-fallback", "warning",
        f"Operations ran on the CPU: {', '.join(summary.fallbacks)}",
        f"PyTorch/XLA has no XLA lowering for {ops}: each call copies its inputs to the "
        "host, runs there and copies the result back, which splits the graph.",
        "Replace the operation with one XLA supports (for example masks and torch.where "
        "instead of nonzero/boolean indexing), or move it outside the training step.",
    )


def _slow_compile_alert(summary: XlaSummary) -> Alert | None:
    if summary.max_compile_seconds <= MAX_COMPILE_SECONDS:
        return None
    return Alert(
        "slow-compile", "warning",
        f"A compilation took {duration(summary.max_compile_seconds)}",
        f"One graph took longer than {MAX_COMPILE_SECONDS:.0f} s to compile; large graphs "
        "(long unrolled loops, huge models traced at once) compile slowly.",
        "Sync more often (torch_xla.sync() inside long loops), use scan for repeated "
        "layers, or turn on the persistent compile cache on TPU.",
    )


def _slow_execution_alert(summary: XlaSummary) -> Alert | None:
    if summary.max_execute_seconds <= MAX_EXECUTE_SECONDS:
        return None
    return Alert(
        "slow-execution", "warning",
        f"An execution took {duration(summary.max_execute_seconds)}",
        f"One graph ran for longer than {MAX_EXECUTE_SECONDS:.0f} s: the step may be doing "
        "far more work than intended (a graph that keeps growing because it is never cut).",
        "Call torch_xla.sync() (or use MpDeviceLoader) once per step.",
    )


# ---------------------------------------------------------------------------------------------
# Rules that use the compilation trace (torch_xla's analysis, `summary.trace`)
# ---------------------------------------------------------------------------------------------


def compiles_every_step(summary: XlaSummary) -> bool:
    """Whether nearly every step compiled a new graph, over at least `MIN_EVERY_STEP` steps
    (per rank, for rank threads sharing a process's counters): with a trace, one line
    compiled at least as many different graphs as there were steps (so the usual first-step
    graph and a final fetch do not count); without one, compiles >= steps."""
    if not summary.steps or summary.steps < MIN_EVERY_STEP:
        return False
    row = recompiling_row(summary)
    rate = summary.per_step(row.graphs if row is not None else summary.compiles)
    return rate is not None and rate >= 1.0


def recompiling_line(summary: XlaSummary) -> CompileRow | None:
    """The line of the user's code that recompiled, from the trace alone (no `inputs=`
    needed): it compiled at least 2 different graphs, and either first compiled one of them
    after the warm-up, or compiled more than `MAX_QUIET_GRAPHS` (the first step's graph and
    one per bucket of a few). The one with the most graphs; None without a trace or such a
    line. Once a snapshot shows it, every later one does (graphs are only added), so the
    alert it raises holds still."""
    trace = summary.trace
    if trace is None:
        return None
    warm = (summary.warmup_compiles
            if summary.compiles_after_warmup and summary.steps_after_warmup else None)
    for row in sorted(trace.rows(), key=lambda row: (-row.graphs, -row.compiles)):
        if row.where is None or row.graphs < 2:
            continue
        if row.graphs > MAX_QUIET_GRAPHS or (warm is not None and row.graphs_since(warm)):
            return row
    return None


def recompiling_row(summary: XlaSummary) -> CompileRow | None:
    """The traced line that compiled the most different graphs (None without a trace)."""
    trace = summary.trace
    rows = trace.rows() if trace is not None else []
    return max(rows, key=lambda row: (row.graphs, row.compiles), default=None)


def _frequent_compiles(summary: XlaSummary, warmup_steps: int, unit: str,
                       row: CompileRow | None, severity: str) -> Alert:
    """The recompile alert; `row` is the traced line that compiled the most different graphs
    (`recompiling_row`), None without a trace."""
    steps = summary.steps
    if not steps:  # a cell (`%%xla_metrics`) or a function that reports no step: no rate
        numbers = (f"XLA compiled {plural(summary.compiles, 'graph')}, taking "
                   f"{duration(summary.compile_seconds)}.{share_text(summary)}")
    else:
        rate = summary.per_step(summary.compiles) or 0.0
        if steps <= warmup_steps:  # no warm-up words for a run no longer than the warm-up
            rule = "a new graph at nearly every step"
        else:
            rule = f"torch_xla warns above {MAX_COMPILES_PER_STEP}"
            # Only over enough steps to be a rate (the warm-up snapshot is read a step late);
            # said the same way before, so that the live alert keeps its length and the
            # panel its height when the figure arrives.
            after = summary.steps_after_warmup
            if after and after >= MIN_RATE_STEPS:
                rule += (f"; {summary.compiles_after_warmup or 'none'} of them in the "
                         f"{plural(after, 'step')} after the first {warmup_steps}")
            else:
                rule += (f"; under {MIN_RATE_STEPS} steps after the first {warmup_steps}, "
                         "too few to rate")
        numbers = (f"XLA compiled {rate:.2f} graphs per {unit} ({rule}), taking "
                   f"{duration(summary.compile_seconds)}.{share_text(summary)}")
    span = f" in {plural(steps, 'step')}" if steps else ""
    if row is None or row.graphs < 2:
        cause, fix = compile_cause(summary)
        return Alert("frequent-compiles", severity,
                     f"Recompiling: {plural(summary.compiles, 'compile')}{span}",
                     f"{numbers} {cause}", fix)
    place = row.place()
    # The trace's compilations arrive apart from the counters' snapshots: either may be ahead.
    compiled = max(summary.compiles, summary.trace.compiles if summary.trace else 0)
    changed = shape_changes(summary.input_shapes)
    if changed:
        cause, fix = shapes_cause(changed), shapes_fix(changed, summary, opening="give")
    elif row.fetched:
        cause = ("Each of them was cut there by reading a tensor's value (torch_xla: "
                 f"\"{row.cause}\"), and the part of the step before the read differs from "
                 "step to step.")
        fix = ("remove the .item(), print(tensor) or `if tensor:` there; report values with "
               "hfxla_nb.report(loss=loss), which fetches them every few steps.")
    else:
        cause = ("A different graph from the same line means the step's graph changes: a "
                 "tensor shape that changes (dynamic padding, a smaller last batch, boolean "
                 "indexing, nonzero), or a branch or loop that depends on the data."
                 + ("" if summary.input_shapes else f" {INPUTS_HINT}"))
        fix = ("keep shapes and Python control flow the same in every step: pad to fixed "
               f"shapes (or a few buckets){last_batch_fix(summary)}.")
    return Alert(
        "frequent-compiles", severity,
        f"Recompiling: {place} compiled {row.graphs} different graphs{span}",
        f"{numbers} {row.compiles} of the {compiled} graphs end at {place} "
        f"({row.cause_words()}), {row.graphs} of them different: what changes is in the "
        f"step's code that runs before that line. {cause}",
        f"At {place}: {fix}",
    )


# transformers' functions that read the padding mask on the device (`hx.patches` fixes them).
MASK_CHECKS = ("_ignore_bidirectional_mask_sdpa", "_ignore_causal_mask_sdpa")


def _mask_check(summary: XlaSummary) -> bool:
    """Whether the traced fetches came from transformers' attention-mask check."""
    trace = summary.trace
    sites = trace.fetch_sites() if trace is not None else []
    return any(site.via is not None and site.via.function in MASK_CHECKS for site in sites)


def _read_sites(summary: XlaSummary) -> list[ExecutionSite]:
    """The traced value reads that ran the graph early and name a line (the user's, or the
    library's one), most first; none without a trace."""
    trace = summary.trace
    return [site for site in (trace.fetch_sites() if trace is not None else [])
            if site.where is not None or site.via is not None]


def _callback_site(summary: XlaSummary) -> Frame | None:
    """The line in a `TrainerCallback` event (`on_step_end`, ...) when it is where values
    were read most often (`_fetch_sites`' first place), else None."""
    sites = _read_sites(summary)
    where = sites[0].where if sites else None
    return where if where is not None and where.function in CALLBACK_EVENTS else None


def _fetch_sites(summary: XlaSummary) -> tuple[str, str, str]:
    """(title suffix, explanation, fix prefix) naming the lines whose value fetches ran the
    graph, from the trace; empty strings without one."""
    sites = _read_sites(summary)
    if not sites and summary.item_calls and summary.item_lines:
        first = summary.item_lines[0]
        return (f", .item() at {first}",
                f" .item() is called at: {'; '.join(summary.item_lines[:3])}.", f"At {first}: ")
    if not sites:
        return "", "", ""
    first = sites[0]
    place = first.where.text() if first.where is not None else "library code"
    listed = "; ".join(
        (site.where.text() if site.where is not None else "library code")
        + (f" via {site.via.short()}" if site.via is not None else "")
        + f" ({site.count} {'time' if site.count == 1 else 'times'})"
        for site in sites[:3])
    where = (" torch_xla ran the step's graph early to read a value at: "
             f"{listed}.")
    return f", values read at {place}", where, f"At {place}: "


def graph_memory_alert(summary: XlaSummary) -> Alert | None:
    """A warning when the traced graph that needs the most memory needs more than one device
    has (a TPU's HBM, from the live memory or the generation table)."""
    trace = summary.trace
    largest = trace.largest() if trace is not None else None
    limit = (summary.memory or {}).get("bytes_limit") or (trace.device_memory if trace else None)
    if largest is None or not limit or (largest.memory or 0) <= limit:
        return None
    name = trace.device_name if trace.device_name else "one device"
    place = largest.where.text() if largest.where is not None else "library code"
    gib = 1024**3
    return Alert(
        "graph-memory", "warning",
        f"The graph compiled at {place} needs {largest.memory / gib:.1f} GiB; {name} has "
        f"{limit / gib:.1f} GiB",
        f"XLA's analysis of that graph: inputs, outputs, intermediate buffers and program need "
        f"{largest.memory / gib:.1f} GiB on each device, more than the {limit / gib:.1f} GiB "
        "there are: expect RESOURCE_EXHAUSTED (out of device memory) when it runs.",
        "Make the step smaller: a smaller batch (gradient_accumulation_steps keeps the "
        "effective batch), bfloat16 (precision='bf16'), gradient checkpointing with torch_xla's "
        "own checkpoint (torch_xla.utils.checkpoint; torch's is undone by the compiler), or "
        "shard parameters and optimizer state over the devices (FSDP via SPMD).",
    )


# -- TPU memory exhaustion, read from XLA's texts and explained --

# XLA prints sizes with tsl's HumanReadableNumBytes: binary units, "0B", "4.0K", "21.95G".
_SIZE = r"(-?[\d.,]+\s*(?:[KMGTPE](?:iB|B)?|B))"
_UNITS = {"B": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}

_EXHAUSTED = re.compile(r"RESOURCE_EXHAUSTED|Resource exhausted", re.IGNORECASE)
_MEMORY_SPACE = re.compile(r"Ran out of memory in memory space (\w+)")
_COMPILE = re.compile(rf"Used {_SIZE} of {_SIZE} hbm")
_EXCEEDED = re.compile(rf"Exceeded hbm capacity by {_SIZE}")
_RESERVE = re.compile(
    rf"Attempting to (reserve|allocate) {_SIZE}(?: at the bottom of memory)?\. "
    rf"That was not possible\. There are {_SIZE} free")
_CAPACITY = re.compile(rf"HBM capacity {_SIZE}", re.IGNORECASE)
_ALLOCATED = re.compile(rf"Currently allocated:\s*{_SIZE}")
_PROGRAM = re.compile(rf"Program hbm requirement {_SIZE}")
_OPERATOR = re.compile(r'Operator: op_name="([^"]*)"')
_SOURCE = re.compile(r'source_file="([^"]+)" source_line=(\d+)')

# The same changes, in the same order of cost, as `hx.plan_memory` proposes (docs/memory.md).
FIXES = (
    "LoRA (fine_tune(..., lora=True)): only small adapters train; the frozen base needs no "
    "gradients and no optimizer state",
    "bfloat16 (precision='bf16'): activations take half the memory, and so does a frozen base",
    "gradient checkpointing: only each layer's input is kept, the rest is recomputed in the "
    "backward pass",
    "sharding='fsdp': parameters, gradients and optimizer state split over the devices (more "
    "chips, e.g. a v5e-8, split them further)",
    "a smaller batch_size (with gradient_accumulation_steps to keep the effective batch)",
)


def parse_size(text: str) -> int:
    """Bytes of a size as XLA prints it ("21.95G", "530.00M", "4.0K", "0B"; binary units)."""
    match = re.fullmatch(r"(-?[\d.,]+)\s*([KMGTPE]?)(?:iB|B)?", text.strip())
    if match is None:
        raise ValueError(f"not a size as XLA prints one: {text!r}")
    number, unit = match.groups()
    return round(float(number.replace(",", "")) * 1024 ** _UNITS[unit or "B"])


def format_size(size: int) -> str:
    """A size for people: "21.95 GiB", "530 MiB", "4 KiB", "12 B"."""
    magnitude = abs(size)
    for unit, power in (("TiB", 4), ("GiB", 3), ("MiB", 2), ("KiB", 1)):
        if magnitude >= 1024**power:
            value = size / 1024**power
            return f"{value:.2f} {unit}" if unit in ("TiB", "GiB") else f"{value:.0f} {unit}"
    return f"{size} B"


@dataclass(frozen=True)
class HbmExhaustion:
    """What a RESOURCE_EXHAUSTED text says about a TPU device's memory. Sizes are bytes; a
    figure the text does not give is None.

    Attributes:
        when: "compile" (the program cannot fit at all), "run" (it did not fit what was free
            when it ran), or "unknown" (the text names no figures).
        needed: what was asked for: the program's HBM use at compile time, the reservation or
            buffer at run time.
        available: what there was: the device's usable HBM at compile time, what was free at
            run time.
        capacity: the device's HBM, when the text gives it ("HBM capacity 8.00G", or the
            compile-time "of 15.48G").
        exceeded: by how much the compiled program is over (compile time).
        allocated: what live buffers held when the run-time request came ("Currently
            allocated"): tensors kept from earlier steps, the model, the optimizer state.
        program: the "Program hbm requirement" total.
        operator: the op of the largest program allocation, when the text lists it.
        source: "file:line" of that allocation, when the text gives it.
    """

    when: Literal["compile", "run", "unknown"]
    needed: int | None = None
    available: int | None = None
    capacity: int | None = None
    exceeded: int | None = None
    allocated: int | None = None
    program: int | None = None
    operator: str | None = None
    source: str | None = None

    def first_line(self, where: str | None = None) -> str:
        """One line: what needed how much of how much. `where` names the graph or the user's
        line ("fine_tune's training step", "train.py:42") when the caller knows it."""
        place = f" in {where}" if where else ""
        if self.when == "compile" and self.needed is not None and self.available is not None:
            over = self.exceeded if self.exceeded is not None else self.needed - self.available
            return (f"TPU memory (HBM) exhausted while compiling{place}: the program needs "
                    f"{format_size(self.needed)} of the {format_size(self.available)} one device "
                    f"has ({format_size(over)} too much).")
        if self.when == "run" and self.needed is not None and self.available is not None:
            text = (f"TPU memory (HBM) exhausted at run time{place}: "
                    f"{format_size(self.needed)} were needed and {format_size(self.available)} "
                    "were free")
            if self.capacity is not None:
                text += f" of the device's {format_size(self.capacity)}"
            if self.allocated is not None:
                text += f" ({format_size(self.allocated)} held by tensors already on the device)"
            return text + "."
        return (f"TPU memory (HBM) exhausted{place}; XLA's message gives no figures "
                "(the allocator's full text is kept with the launch).")

    @property
    def fixes(self) -> tuple[str, ...]:
        """What to change, cheapest first; a run-time failure with much memory already held
        first points at tensors kept alive across steps."""
        fixes = list(FIXES)
        if self.when == "run" and self.allocated and self.needed and (
                self.allocated >= self.needed):
            fixes.insert(0, "tensors held across steps: keep no device tensors alive between "
                            "steps (a list of losses: fetch them as floats every N steps), and "
                            "delete what the previous cell left on the device")
        if self.source:
            fixes.append(f"the largest allocation comes from {self.source}")
        return tuple(fixes)

    def explain(self, where: str | None = None) -> str:
        """The first line, then the fixes numbered in order of cost."""
        lines = [self.first_line(where), "What would make it fit, cheapest first:"]
        lines += [f"  {number}. {fix}" for number, fix in enumerate(self.fixes, start=1)]
        lines.append("hx.plan_memory(model, batch_size=..., max_length=...) shows what fits "
                     "before a launch.")
        return "\n".join(lines)


def parse_hbm_exhaustion(text: str) -> HbmExhaustion | None:
    """Read XLA's text about exhausted TPU memory into an `HbmExhaustion`.

    Args:
        text: an exception message, a traceback or a worker's output.

    Returns:
        The figures the text gives, or None when it is not about HBM: no RESOURCE_EXHAUSTED,
        or another memory space (vmem, smem: compiler limits a smaller batch does not fix).
    """
    space = _MEMORY_SPACE.search(text)
    if space is not None and space.group(1).lower() != "hbm":
        return None
    if _EXHAUSTED.search(text) is None:
        return None
    details = {
        "capacity": _size(_CAPACITY, text),
        "allocated": _size(_ALLOCATED, text),
        "program": _size(_PROGRAM, text),
        "operator": _group(_OPERATOR, text),
        "source": _source(text),
    }
    compile_match = _COMPILE.search(text)
    if compile_match is not None:
        used, usable = (parse_size(size) for size in compile_match.groups())
        details["capacity"] = details["capacity"] or usable
        return HbmExhaustion("compile", needed=used, available=usable,
                             exceeded=_size(_EXCEEDED, text), **details)
    run_match = _RESERVE.search(text)
    if run_match is not None:
        _, needed, free = run_match.groups()
        return HbmExhaustion("run", needed=parse_size(needed), available=parse_size(free),
                             **details)
    return HbmExhaustion("unknown", **details)


def explain_hbm_exhaustion(text: str, where: str | None = None) -> str | None:
    """`parse_hbm_exhaustion(text).explain(where)`, or None when the text is not about HBM."""
    exhaustion = parse_hbm_exhaustion(text)
    return None if exhaustion is None else exhaustion.explain(where)


def _size(pattern: re.Pattern[str], text: str) -> int | None:
    match = pattern.search(text)
    return None if match is None else parse_size(match.group(1))


def _group(pattern: re.Pattern[str], text: str) -> str | None:
    match = pattern.search(text)
    return None if match is None else match.group(1)


def _source(text: str) -> str | None:
    match = _SOURCE.search(text)
    return None if match is None else f"{match.group(1)}:{match.group(2)}"
