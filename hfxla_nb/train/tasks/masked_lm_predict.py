"""`predict` for a masked LM: the top tokens of every mask token, on every device.

```python
hx.predict(folder, ["the movie was [MASK] ."], task="masked-lm", top_k=5)
# [{"masks": [[{"score": 0.41, "token": 2204, "token_str": "great",
#               "sequence": "the movie was great ."}, ...]]}]
```

Kernel side: texts are tokenized (truncated to the model's positions) into length buckets;
a text without a mask token, or whose mask tokens a truncation would cut, is refused before
any fork. Worker side: one graph per bucket gives each position's `top_k` probabilities and
token ids (softmax over the vocabulary, then `topk`, on the device); every batch's results
are fetched in one transfer. On the host each mask's candidates are written as
transformers' fill-mask pipeline writes them: `score`, `token`, `token_str` (the token
decoded alone) and `sequence` (the text with that mask filled; special tokens left out when
the text has one mask, kept when it has several).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import batching
from ..config import FineTuneError
from ..kernel import steps
from .base import MaxLength
from .token_classification_data import encode_blocks, pad_values

if TYPE_CHECKING:
    import torch

    from ..predict import PredictContext
    from ..worker.batch import Batch
    from ..worker.context import WorkerContext

#: Candidates per mask when `predict` is not told (the fill-mask pipeline's default).
DEFAULT_TOP_K = 5


@dataclass
class MaskRows:
    """What the host needs to write each mask's candidates: every row's token ids and the
    positions of its mask tokens, and the tokenizer that decodes them."""

    ids: list[list[int]]
    masks: list[np.ndarray]
    tokenizer: Any
    padding_side: str = "right"
    pad_id: int | None = None


@dataclass
class FillMaskData(batching.EncodedData):
    """A masked LM's predict inputs: the texts' buckets and how many candidates per mask."""

    top_k: int = DEFAULT_TOP_K


def prepare(inputs: list[Any], context: PredictContext, max_length: int | None) -> FillMaskData:
    """Texts with mask tokens, tokenized and bucketed like evaluation rows (no labels)."""
    tokenizer = context.tokenizer
    mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask_id is None:
        raise FineTuneError("task='masked-lm' needs a tokenizer with a mask token (BERT, "
                            "RoBERTa style); this one has none.")
    wrong = next((i for i, value in enumerate(inputs) if not isinstance(value, str)), None)
    if wrong is not None:
        raise FineTuneError(f"input {wrong} is a {type(inputs[wrong]).__name__}; masked-lm "
                            f"predicts on texts (str) with {tokenizer.mask_token!r} where a "
                            "token is to be filled in.")
    top_k = getattr(context, "top_k", None)
    top_k = DEFAULT_TOP_K if top_k is None else top_k
    vocab = int(getattr(context.model_config, "vocab_size", len(tokenizer)))
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= vocab:
        raise FineTuneError(f"top_k must be an integer from 1 to the vocabulary's {vocab} "
                            f"tokens, got {top_k!r}.")
    unmasked = [i for i, text in enumerate(inputs) if tokenizer.mask_token not in text]
    if unmasked:
        raise FineTuneError(
            f"{len(unmasked)} input(s) have no mask token (the first: input {unmasked[0]}, "
            f"{inputs[unmasked[0]][:60]!r}); write {tokenizer.mask_token!r} where a token is "
            "to be filled in.")
    cap = steps.length_cap(MaxLength(max_length), context.model_config, tokenizer)
    encoded, _ = batching.tokenize(tokenizer, list(inputs), None, cap)
    masks = [np.flatnonzero(np.asarray(ids) == mask_id) for ids in encoded["input_ids"]]
    cut = [i for i, (text, found) in enumerate(zip(inputs, masks, strict=True))
           if len(found) < text.count(tokenizer.mask_token)]
    if cut:
        raise FineTuneError(
            f"{len(cut)} input(s) are longer than {cap} tokens and would lose mask tokens to "
            f"truncation (the first: input {cut[0]}); shorten them"
            + (" or pass a larger max_length." if max_length else "."))
    lengths = [len(ids) for ids in encoded["input_ids"]]
    buckets = ([int(max_length)] if max_length else
               batching.choose_buckets(lengths, cap, min_rows=1))
    notes: list[str] = []
    input_names = batching.input_names_of(tokenizer, encoded)
    side = getattr(tokenizer, "padding_side", "right") or "right"
    encoded["labels"] = [np.full(n, -100, np.int64) for n in lengths]
    split = encode_blocks("predict", encoded, input_names, "labels", buckets,
                          pad_values(tokenizer, notes), side, 0)
    rows = MaskRows([list(ids) for ids in encoded["input_ids"]], masks, tokenizer, side,
                    tokenizer.pad_token_id)
    return FillMaskData(train=None, eval=split, input_names=input_names,
                        bucket_lengths=list(map(int, buckets)), label_names=[], notes=notes,
                        host={"eval": rows}, top_k=top_k)


def top_tokens(ctx: WorkerContext, batch: Batch,
               top_k: int) -> list[torch.Tensor]:
    """`[rows, length, top_k]` probabilities and token ids of every position (the host reads
    the mask positions): softmax over the vocabulary and `topk` in the graph."""
    import torch

    probabilities = torch.softmax(ctx.logits(batch), dim=-1)
    scores, tokens = probabilities.topk(top_k, dim=-1)
    return [scores, tokens.int()]


def decode(data: FillMaskData, batches: list, fetched: list,
           per_batch: Any) -> list[dict[str, Any]]:
    """`{"masks": [[candidate, ...] per mask token]}` per text, in order; each candidate as
    the fill-mask pipeline gives it: score, token, token_str, sequence."""
    split, rows_info = data.eval, data.host["eval"]
    tokenizer = rows_info.tokenizer
    out: list[Any] = [None] * split.num_rows
    for (bucket_index, positions, real), (scores, tokens) in per_batch(batches, fetched):
        length = split.buckets[bucket_index].length
        rows = split.buckets[bucket_index].rows[positions[:real]]
        scores, tokens = scores.float().numpy(), tokens.numpy()
        for i, row in enumerate(rows):
            ids = rows_info.ids[row]
            shift = length - len(ids) if rows_info.padding_side == "left" else 0
            masks = []
            # The pipeline's rules: one mask, special tokens left out of the sequence; several,
            # kept (the other masks would vanish); pad tokens left out.
            single = len(rows_info.masks[row]) == 1
            for position in rows_info.masks[row]:
                candidates = []
                for score, token in zip(scores[i, position + shift].tolist(),
                                        tokens[i, position + shift].tolist(), strict=True):
                    filled = list(ids)
                    filled[position] = token
                    filled = [t for t in filled if t != rows_info.pad_id]
                    candidates.append({
                        "score": score, "token": token,
                        "token_str": tokenizer.decode([token]),
                        "sequence": tokenizer.decode(filled, skip_special_tokens=single)})
                masks.append(candidates)
            out[row] = {"masks": masks}
    return out
