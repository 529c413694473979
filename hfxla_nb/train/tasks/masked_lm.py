"""`fine_tune(task="masked-lm")`: BERT-style masked language modeling on a text column.

Kernel side: texts are tokenized (at most the row length) into length buckets, and masked on
the host with fixed shapes, by transformers' `DataCollatorForLanguageModeling` rules: 15% of
the tokens that are not special tokens are chosen (at least one per row); of those 80% become
the mask token, 10% a random token, 10% stay; the labels are the original ids there, -100
elsewhere. The masks are drawn once from the seed (the batches keep one shape, and evaluation
is the same every time). Evaluation: the loss over masked tokens and its perplexity.

Explicit only (`task="masked-lm"`): a `...ForMaskedLM` architecture is what most pretrained
encoders (bert-base-cased) are saved as, and `task="auto"` keeps fine-tuning those as
classifiers.

`predict`: the top tokens of every mask token, on every device, as the fill-mask pipeline
gives them.

```python
hx.predict(folder, ["the movie was [MASK] ."], task="masked-lm", top_k=5)
# [{"masks": [[{"score": 0.41, "token": 2204, "token_str": "great",
#               "sequence": "the movie was great ."}, ...]]}]
```

A text without a mask token, or whose mask tokens a truncation would cut, is refused before
any fork. One graph per bucket gives each position's `top_k` probabilities and token ids on
the device; every batch's results are fetched in one transfer. On the host each mask's
candidates are written as transformers' fill-mask pipeline writes them (special tokens left
out of `sequence` when the text has one mask, kept when it has several).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import batching, data, preparation
from ..config import FineTuneError
from ..preparation import Prepared
from . import register_task
from .base import MaxLength, Task
from .token_classification import IGNORE, encode_blocks, pad_values

if TYPE_CHECKING:
    import torch

    from ..batching import EncodedData
    from ..config import FineTuneConfig
    from ..predict import PredictContext
    from ..preparation import Splits, TaskContext
    from ..worker.context import Batch, WorkerContext


# -- the task: masks drawn once, on the host --

MASK_SHARE = 0.15


def mask_tokens(ids: list[int], special: list[int], rng: np.random.Generator, mask_id: int,
                vocab_size: int) -> tuple[list[int], np.ndarray]:
    """One row masked by the 15% / 80-10-10 rules; returns (inputs, labels)."""
    ids_array = np.asarray(ids, dtype=np.int64)
    candidates = np.flatnonzero(np.asarray(special) == 0)
    labels = np.full(len(ids), IGNORE, dtype=np.int64)
    if len(candidates) == 0:
        return list(ids), labels
    chosen = candidates[rng.random(len(candidates)) < MASK_SHARE]
    if len(chosen) == 0:
        chosen = rng.choice(candidates, 1)
    labels[chosen] = ids_array[chosen]
    draw = rng.random(len(chosen))
    inputs = ids_array.copy()
    inputs[chosen[draw < 0.8]] = mask_id
    randomized = chosen[(draw >= 0.8) & (draw < 0.9)]
    inputs[randomized] = rng.integers(0, vocab_size, len(randomized))
    return inputs.tolist(), labels


def mask_split(tokenizer: Any, texts: list[str], cap: int, rng: np.random.Generator,
               vocab_size: int) -> dict[str, list]:
    """One split's texts tokenized (at most `cap` tokens) and masked (`mask_tokens`): the
    tokenizer's output with the masked "input_ids" and the "labels"."""
    rows = tokenizer(texts, truncation=True, max_length=cap, return_special_tokens_mask=True)
    inputs, labels = [], []
    for ids, special in zip(rows["input_ids"], rows["special_tokens_mask"], strict=True):
        masked, label = mask_tokens(ids, special, rng, tokenizer.mask_token_id, vocab_size)
        inputs.append(masked)
        labels.append(label)
    return {**{k: list(v) for k, v in rows.items() if k != "special_tokens_mask"},
            "input_ids": inputs, "labels": labels}


class MaskedLM(Task):
    """Masked tokens predicted from both sides; loss and perplexity."""

    name = "masked-lm"
    reported_metrics = ("loss", "perplexity", "masked_tokens")
    pipeline_tag = "fill-mask"
    eval_ahead = True
    auto_class = "AutoModelForMaskedLM"
    head_suffixes = ("ForMaskedLM",)
    pick_by_head = False  # pretrained encoders are ...ForMaskedLM: "auto" stays classification
    outputs_per_batch = 2
    title = "masked LM"

    def prepare(self, splits: Splits, config: FineTuneConfig,
                context: TaskContext) -> Prepared:
        """Every split's texts tokenized and masked once from the seed (`mask_split`), in
        length buckets."""
        tokenizer = context.tokenizer
        if getattr(tokenizer, "mask_token_id", None) is None:
            raise FineTuneError("task='masked-lm' needs a tokenizer with a mask token (BERT, "
                                "RoBERTa style); this one has none.")
        eval_name = splits.eval_name
        cap = preparation.length_cap(config, context.model_config, tokenizer)
        vocab = int(getattr(context.model_config, "vocab_size", len(tokenizer)))
        encoded = {}
        for index, (split, ds) in enumerate(splits.named.items()):
            try:
                data.check_columns(ds, split, [config.text_column])
                texts = data.check_texts(list(ds[config.text_column]), config.text_column,
                                         split)
            except data.DataError as error:
                raise FineTuneError(str(error)) from None
            rng = np.random.default_rng([config.seed, index])
            encoded[split] = mask_split(tokenizer, texts, cap, rng, vocab)
        preparation.check_batch_fits(config, len(encoded["train"]["input_ids"]))
        buckets = batching.split_buckets(encoded, cap, config.max_length, config.rows_per_step)
        notes: list[str] = []
        pads = pad_values(tokenizer, notes)
        input_names = batching.input_names_of(tokenizer, encoded["train"])
        side = getattr(tokenizer, "padding_side", "right") or "right"
        out = {split: encode_blocks(split, encoded[split], input_names, "labels", buckets,
                                    pads, side, 0) for split in splits.named}
        encoded_data = batching.EncodedData(
            train=out["train"], eval=out[eval_name] if eval_name is not None else None,
            input_names=input_names, bucket_lengths=list(map(int, buckets)), label_names=[],
            notes=notes)
        return Prepared(encoded_data)

    def prediction_table(self, predictions: list[dict[str, Any]]
                         ) -> tuple[list[dict[str, Any]], list[str] | None]:
        """One row per candidate token of each mask, as the fill-mask pipeline gives them."""
        rows = [{"input": i, "mask": m, **candidate} for i, item in enumerate(predictions)
                for m, candidates in enumerate(item["masks"]) for candidate in candidates]
        return rows, ["input", "mask", "score", "token", "token_str", "sequence"]

    def _losses(self, ctx: WorkerContext, batch: Batch,
                labels: torch.Tensor) -> torch.Tensor:
        import torch

        logits = ctx.logits(batch)
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE,
            reduction="none").view(labels.shape)

    def train_loss(self, ctx: WorkerContext, batch: Batch) -> torch.Tensor:
        labels = batch.tokens[:, -batch.length:].long()
        losses = self._losses(ctx, batch, labels)
        counted = (labels != IGNORE).float()
        return (losses * counted).sum() / counted.sum().clamp(min=1.0)

    def prepare_predict(self, inputs: list[Any], context: PredictContext,
                        max_length: int | None) -> EncodedData:
        """Texts with mask tokens, bucketed like evaluation rows (this module's `prepare`)."""
        return prepare(inputs, context, max_length)

    def decode(self, data: Any, batches: list, fetched: list) -> list[dict[str, Any]]:
        """Each text's top tokens per mask, as the fill-mask pipeline gives them (`predict`)."""
        return decode(data, batches, fetched, self.per_batch)

    def eval_outputs(self, ctx: WorkerContext, batch: Batch) -> list[torch.Tensor]:
        top_k = getattr(ctx.plan.data, "top_k", None)
        if top_k is not None:  # predict: each position's top tokens and their probabilities

            return top_tokens(ctx, batch, top_k)
        labels = batch.tokens[:, -batch.length - 1:-1].long()
        counted = (labels != IGNORE).float() * batch.weights.float()[:, None]
        losses = self._losses(ctx, batch, labels)
        return [(losses * counted).sum(-1), counted.sum(-1)]

    def eval_metrics(self, ctx: WorkerContext, batches: list, fetched: list) -> dict[str, float]:
        total = tokens = 0.0
        for _, (sums, counts) in self.per_batch(batches, fetched):
            total += float(sums.double().sum())
            tokens += float(counts.double().sum())
        loss = total / max(tokens, 1.0)
        return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 50.0)),
                "eval_masked_tokens": tokens, "eval_rows": float(ctx.plan.data.eval.num_rows)}


register_task(MaskedLM())


# -- predict: the top tokens of every mask --

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
    cap = preparation.length_cap(MaxLength(max_length), context.model_config, tokenizer)
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
