"""The next token of every row, chosen on the device inside the fixed-shape decoding step.

transformers' logits processors as tensor ops with fixed shapes (no host round trip, no
shape that depends on the data): `RepetitionPenaltyLogitsProcessor` (over a `[rows, vocab]`
mask of the tokens seen so far, instead of gathering over a growing `input_ids`), then, when
sampling, `TemperatureLogitsWarper`, `TopKLogitsWarper`, `TopPLogitsWarper` and
`MinPLogitsWarper`, in transformers' order, each with the same arithmetic
(`tests/test_generation.py` compares them on the same logits).

A draw uses the Gumbel-max trick: the argmax of the processed logits plus Gumbel noise is a
draw from their softmax. The noise is a counter-based hash of (seed, row key, step, token),
computed in int32 tensor ops on the device: no RNG state to carry between graphs, the step
is graph data (no recompile), and the same seed gives the same tokens on the same hardware,
whatever the batch size or the number of devices (a row's key is its prompt's index). The
noise itself is the same on XLA and on the CPU (`tests/test_generation.py`); the tokens can
still differ where the two compute the logits differently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..generation_options import GenerationOptions

if TYPE_CHECKING:
    import torch

# lowbias32's constants (Chris Wellons' hash prospector), written as signed int32.
_MULTIPLY_1 = 0x7FEB352D
_MULTIPLY_2 = 0x846CA68B - 2**32
_GOLDEN = 0x9E3779B9 - 2**32


def uses_seen(options: GenerationOptions) -> bool:
    """Whether the decoding keeps a mask of the tokens seen so far (repetition penalty)."""
    return options.repetition_penalty is not None and options.repetition_penalty != 1.0


def seen_tokens(ids: torch.Tensor, mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """`[rows, vocab]` bool: the prompt's tokens (padding, `mask` 0, left out)."""
    import torch

    seen = torch.zeros(ids.shape[0], vocab, dtype=torch.bool, device=ids.device)
    return seen.scatter(1, ids.long(), mask.bool())


def add_seen(seen: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """`seen` with each row's new token (`[rows, 1]`) marked (a comparison, no scatter)."""
    import torch

    return seen | (torch.arange(seen.shape[1], device=seen.device)[None, :] == token)


def processed_logits(logits: torch.Tensor, options: GenerationOptions,
                     seen: torch.Tensor | None = None) -> torch.Tensor:
    """`[rows, vocab]` float32 logits after transformers' processors for these options
    (removed tokens at -inf), as `generate` would apply them."""
    import torch

    scores = logits.float()
    if seen is not None and uses_seen(options):
        penalty = float(options.repetition_penalty)
        penalised = torch.where(scores < 0, scores * penalty, scores / penalty)
        scores = torch.where(seen, penalised, scores)
    if not options.do_sample:
        return scores
    if options.temperature is not None and options.temperature != 1.0:
        scores = scores / float(options.temperature)
    if options.top_k is not None and options.top_k != 0:
        k = min(max(int(options.top_k), 1), scores.shape[-1])
        kth = torch.topk(scores, k)[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if options.top_p is not None and options.top_p < 1.0:
        scores = _top_p(scores, float(options.top_p))
    if options.min_p is not None:
        probs = scores.softmax(-1)
        # The most likely token always stays (its probability is the maximum).
        floor = float(options.min_p) * probs.amax(-1, keepdim=True)
        scores = scores.masked_fill(probs < floor, -float("inf"))
    return scores


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """TopPLogitsWarper: drop the least likely tokens whose total probability is at most
    1 - top_p, keeping at least the most likely one."""
    import torch

    ordered, order = torch.sort(scores, descending=False)
    cumulative = ordered.softmax(-1).cumsum(-1)
    drop = cumulative <= (1 - top_p)
    last = torch.arange(drop.shape[-1], device=drop.device)[None, :] == drop.shape[-1] - 1
    drop = drop & ~last
    removed = drop.scatter(1, order, drop)
    return scores.masked_fill(removed, -float("inf"))


def next_tokens(logits: torch.Tensor, options: GenerationOptions, seen: torch.Tensor | None,
                seed: torch.Tensor, keys: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """`[rows, 1]` int64: each row's next token, greedy or drawn.

    Args:
        logits: `[rows, vocab]` of the last position.
        options: the decoding's options.
        seen: the tokens seen so far (repetition penalty), or None.
        seed: `[1]` int32 on the device (data: another seed compiles nothing).
        keys: `[rows]` int32 row keys (the prompt's index: draws do not depend on the batch).
        step: `[1]` int32, the new token's index.
    """
    scores = processed_logits(logits, options, seen)
    if options.do_sample:
        scores = scores + gumbel_noise(seed, keys, step, scores.shape[-1])
    return scores.argmax(-1, keepdim=True)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int32 `x`, shifting only non-negative values: torch_xla's `>>`
    of a negative int32 rounds toward zero (a division), torch's CPU one toward -inf."""
    return ((x & 0x7FFFFFFF) >> bits) + (x < 0).int() * (1 << (31 - bits))


def _hash(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int32 tensors (products wrap around, as on any two's-complement device)."""
    x = x ^ _shift_right(x, 16)
    x = x * _MULTIPLY_1
    x = x ^ _shift_right(x, 15)
    x = x * _MULTIPLY_2
    return x ^ _shift_right(x, 16)


def uniform_noise(seed: torch.Tensor, keys: torch.Tensor, step: torch.Tensor,
                  vocab: int) -> torch.Tensor:
    """`[rows, vocab]` float32 in (0, 1): a hash of (seed, row key, step, token)."""
    import torch

    row = _hash(_hash(_hash(seed.int()) ^ keys.int()) ^ (step.int() * _GOLDEN))
    tokens = torch.arange(vocab, dtype=torch.int32, device=keys.device)
    bits = _hash(row[:, None] ^ (tokens[None, :] * _GOLDEN + 0x632BE5AB))
    return (_shift_right(bits, 8).float() + 0.5) / float(1 << 24)


def gumbel_noise(seed: torch.Tensor, keys: torch.Tensor, step: torch.Tensor,
                 vocab: int) -> torch.Tensor:
    """`[rows, vocab]` Gumbel(0, 1) noise: argmax(logits + noise) draws from softmax(logits)."""
    return -(-uniform_noise(seed, keys, step, vocab).log()).log()
