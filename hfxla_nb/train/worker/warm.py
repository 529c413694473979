"""The model a `fine_tune` leaves on the devices between cells: the worker side of a warm
session (`launch.sessions`).

`train_worker` holds its `WorkerContext` here when the plan says so (`TrainPlan.keep_warm`):
the trained model on every device, its tokenizer or processor, and the graphs compiled for
it (XLA keeps them in the process). `FineTuneResult.predict`, `generate` and `evaluate` then
send the jobs below to the same worker: no fork, no load, and no compile for a shape that
already compiled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ... import patches
from ..config import GenerationOptions
from .evaluate import evaluate as evaluate_model
from .evaluate import predictions
from .generation import decode_prompts

if TYPE_CHECKING:
    from ..plan import TrainPlan
    from .context import WorkerContext

_held: WorkerContext | None = None


def hold(ctx: WorkerContext) -> None:
    """Keep `ctx` (its model on the devices) for the session's next jobs."""
    global _held
    _held = ctx


def held() -> WorkerContext:
    """The context `hold` kept.

    Raises:
        RuntimeError: this worker holds no fine-tuned model.
    """
    if _held is None:
        raise RuntimeError("this session's worker holds no fine-tuned model (fine_tune keeps "
                           "one warm in a notebook kernel).")
    return _held


def predict(plan: TrainPlan) -> dict[str, Any]:
    """`predict`'s worker side with the held model: `plan` holds the inputs, encoded in the
    kernel; returns what `evaluate.predictions` returns."""
    with patches.applied():
        return predictions(held().with_plan(plan))


def generate(rows: list[list[int]], settings: GenerationOptions, bucket: int,
             stream: bool, shown: list[str] | None = None) -> list[str] | list[list[str]]:
    """`generate` with the held causal LM: the prompts' token rows and the options, checked
    in the kernel, and the prompts as the stream shows them; returns the new text of each
    prompt."""
    ctx = held()
    return decode_prompts(ctx.base_model, ctx.plan.tokenizer, rows, settings, bucket, stream,
                          shown)


def evaluate(plan: TrainPlan) -> dict[str, float]:
    """The task's evaluation metrics of the held model on `plan`'s evaluation split (encoded
    in the kernel), as `fine_tune` computes them after training."""
    with patches.applied():
        return evaluate_model(held().with_plan(plan))
