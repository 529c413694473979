"""The words of the analyzer's alerts: `Alert`, and what a change of input shapes, a fetch or a
fallback is said to cause and how to fix it (`observe.analyzer` applies the rules)."""

from __future__ import annotations

from dataclasses import dataclass

from .._words import plural
from .metrics import XlaSummary
from .shapes import InputShapes, shape_changes

# torch_xla/csrc/runtime/metrics_analysis.cc
MAX_TRANSFERS_PER_STEP = 0.5
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
