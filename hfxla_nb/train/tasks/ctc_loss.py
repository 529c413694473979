"""The CTC loss spelled out in tensor operations, so that it traces into the step's graph on
XLA at fixed shapes.

torch_xla has no lowering of `torch.nn.functional.ctc_loss` (pytorch/xla#2399): it would run
on the CPU every step, cutting the graph in two and fetching the log-probabilities, and
`...ForCTC`'s own loss also packs the labels with `masked_select` (a shape known only from
the data). Here the labels stay padded (`[rows, label length]`, -100 on the padding) and the
forward (alpha) recursion of Graves et al. (2006) runs over the frames in log space; autograd
gives its gradient. The values are `ctc_loss(..., reduction="none")`'s (a test compares
them, and their gradients).

The recursion is unrolled, one step per frame: a bucket of F frames traces about 10 F
operations (1 s of wav2vec2 at 50 frames a second: 50 steps), compiled once per bucket.
"""

from __future__ import annotations

from typing import Any

#: Log-probability of what cannot happen: finite, so that no gradient is NaN.
IMPOSSIBLE = -1e30
#: A row's loss above this is an impossible alignment (more labels than frames allow).
INFINITE = 1e29


def extended_labels(labels: Any, blank: int) -> tuple[Any, Any, Any]:
    """The labels with a blank before, between and after them (`[rows, 2 S + 1]`), where a
    path may skip a blank (between two different labels), and each row's label count."""
    import torch

    real = labels >= 0
    counts = real.sum(-1)
    targets = torch.where(real, labels, torch.full_like(labels, blank))
    rows, width = targets.shape
    blanks = torch.full_like(targets, blank)
    extended = torch.cat([torch.stack([blanks, targets], -1).reshape(rows, 2 * width),
                          blanks[:, :1]], dim=1)
    skip = torch.zeros_like(extended, dtype=torch.bool)
    skip[:, 2:] = (extended[:, 2:] != blank) & (extended[:, 2:] != extended[:, :-2])
    return extended, skip, counts


def ctc_losses(log_probs: Any, labels: Any, blank: int, input_lengths: Any = None,
               zero_infinity: bool = False) -> Any:
    """Each row's CTC loss (the negative log-likelihood of its labels), as
    `torch.nn.functional.ctc_loss(..., reduction="none")` computes it.

    Args:
        log_probs: `[rows, frames, vocabulary]` float log-probabilities (log_softmax).
        labels: `[rows, S]` int label ids, -100 (any negative) on the padding after them.
        blank: the blank's id (wav2vec2: the padding token's).
        input_lengths: `[rows]` frames that count per row; None: every frame.
        zero_infinity: an impossible alignment (more labels than frames) costs 0, not a
            huge loss (`...ForCTC`'s `ctc_zero_infinity`).

    Returns:
        `[rows]` float32 losses.
    """
    import torch

    log_probs = log_probs.float()
    rows, frames, _ = log_probs.shape
    extended, skip, counts = extended_labels(labels.long(), blank)
    states = extended.shape[1]
    emissions = log_probs.gather(2, extended[:, None, :].expand(rows, frames, states))
    impossible = torch.full((rows, states), IMPOSSIBLE, dtype=log_probs.dtype,
                            device=log_probs.device)
    positions = torch.arange(states, device=log_probs.device)[None, :]
    alpha = torch.where(positions < 2, emissions[:, 0], impossible)
    pad = impossible[:, :2]
    for frame in range(1, frames):
        shifted = torch.cat([pad, alpha], dim=1)
        one_back, two_back = shifted[:, 1:states + 1], shifted[:, :states]
        two_back = torch.where(skip, two_back, impossible)
        step = torch.logsumexp(torch.stack([alpha, one_back, two_back]), dim=0)
        step = step + emissions[:, frame]
        if input_lengths is not None:
            step = torch.where((input_lengths > frame)[:, None], step, alpha)
        alpha = step
    last = alpha.gather(1, (2 * counts)[:, None])[:, 0]
    before = alpha.gather(1, (2 * counts - 1).clamp(min=0)[:, None])[:, 0]
    before = torch.where(counts > 0, before, torch.full_like(before, IMPOSSIBLE))
    losses = -torch.logsumexp(torch.stack([last, before]), dim=0)
    if zero_infinity:
        losses = torch.where(losses > INFINITE, torch.zeros_like(losses), losses)
    return losses


def reduced(losses: Any, labels: Any, reduction: str) -> Any:
    """The batch's loss as `...ForCTC` reduces it (`ctc_loss_reduction`): "mean" divides
    each row's loss by its label count (at least 1) and averages the rows; "sum" adds them."""
    if reduction == "sum":
        return losses.sum()
    counts = (labels >= 0).sum(-1).clamp(min=1)
    return (losses / counts).mean()
