"""`predict` for a causal LM: each prompt continued greedily on every device, fixed shapes.

Kernel side: prompts are tokenized as `hx.generate` does (the beginning-of-text token, then
the prompt) and padded on the left into length buckets; a prompt bucket plus the new tokens
must fit the model's positions (refused before any fork otherwise).

Worker side: `hx.generate`'s recipe (`generation.py`) over a sharded batch: a `StaticCache` of
prompt + new tokens, the attention mask over that whole length from the start, the position
of each new token a device tensor. Per prompt bucket two graphs: the prompt's and one
decoding step's (every step's inputs are replicated, so the first step is the same graph as
the later ones); the results of every batch are fetched in one transfer at the end. The
texts are cut at the end-of-text token, as `hx.generate` cuts them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import _xla
from .. import batching
from ..config import FineTuneError
from ..kernel import sources
from ..worker.generation import decoded_texts

if TYPE_CHECKING:
    import torch

    from ..worker.batch import Batch
    from ..worker.context import WorkerContext

#: New tokens per prompt when `predict` is not told.
DEFAULT_NEW_TOKENS = 32


@dataclass
class GenerationData(batching.EncodedData):
    """A causal LM's predict inputs: left-padded prompts and how many tokens to add."""

    max_new_tokens: int = DEFAULT_NEW_TOKENS


def prepare(inputs: list[Any], context: Any, max_length: int | None) -> GenerationData:
    """Prompts (str) tokenized and bucketed, padded on the left."""
    wrong = next((i for i, value in enumerate(inputs) if not isinstance(value, str)), None)
    if wrong is not None:
        raise FineTuneError(f"input {wrong} is a {type(inputs[wrong]).__name__}; causal-lm "
                            "predicts on prompts (str).")
    new = getattr(context, "max_new_tokens", None)
    new = DEFAULT_NEW_TOKENS if new is None else new
    if isinstance(new, bool) or not isinstance(new, int) or new < 1:
        raise FineTuneError(f"max_new_tokens must be a positive integer, got {new!r}.")
    tokenizer = context.tokenizer
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    ids = [bos + list(tokenizer(text, add_special_tokens=False)["input_ids"])
           for text in inputs]
    limit = sources.position_limit(context.model_config)
    longest = max(map(len, ids))
    if max_length is not None and max_length < longest:
        raise FineTuneError(f"max_length={max_length} is shorter than the longest prompt "
                            f"({longest} tokens); pass max_length>={longest} or leave it out.")
    room = (limit - new) if limit is not None else batching.round_up(longest)
    buckets = ([int(max_length)] if max_length else
               batching.choose_buckets([len(row) for row in ids], max(room, longest)))
    buckets[-1] = max(buckets[-1], longest)
    if limit is not None and buckets[-1] + new > limit:
        raise FineTuneError(
            f"the prompts ({buckets[-1]} tokens, padded) and max_new_tokens={new} need "
            f"{buckets[-1] + new} positions; the model has {limit}. Pass a smaller "
            "max_new_tokens, or shorter prompts.")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (
        tokenizer.eos_token_id)
    encoded = {"input_ids": ids, "attention_mask": [[1] * len(row) for row in ids]}
    names = ["input_ids", "attention_mask"]
    split = batching.encode_split("predict", encoded, np.zeros(len(ids), np.int64), names,
                                  buckets, {"input_ids": int(pad or 0), "attention_mask": 0},
                                  "left")
    return GenerationData(train=None, eval=split, input_names=names,
                          bucket_lengths=list(map(int, buckets)), label_names=[], notes=[],
                          host=tokenizer, max_new_tokens=int(new))


def generate_on_device(ctx: WorkerContext, batch: Batch,
                       new: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`[rows, new]` greedy tokens of a batch of left-padded prompts, on the device, and the
    last positions (already computed: returning them costs no graph)."""
    import torch
    from transformers import StaticCache

    model, mesh = ctx.model, ctx.mesh
    inputs = batch.inputs()
    ids, mask = inputs["input_ids"].long(), inputs["attention_mask"].long()
    device = ids.device
    full = torch.cat([mask, torch.ones(mask.shape[0], new, dtype=mask.dtype, device=device)],
                     dim=1)  # the new tokens: attended to once written (the cache is causal)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = StaticCache(config=model.config, max_cache_len=batch.length + new)
    # transformers 5 renames `past_key_values` to `cache`; take whichever this version has.
    name = ("cache" if "cache" in inspect.signature(model.forward).parameters
            else "past_key_values")

    def sync(*tensors: Any) -> None:
        if mesh is not None:  # the same input shardings for every step: one step graph
            for tensor in tensors:
                _xla.replicate(tensor, mesh)
        _xla.sync()

    with ctx.autocast():
        output = model(input_ids=ids, attention_mask=full[:, :batch.length], position_ids=positions,
                       cache_position=torch.arange(batch.length, device=device), use_cache=True,
                       **{name: cache})
    token = output.logits[:, -1].argmax(-1, keepdim=True)
    position = positions[:, -1:]
    tokens = torch.zeros(ids.shape[0], new, dtype=torch.long, device=device)
    columns = torch.arange(new, device=device)[None, :]
    tokens = torch.where(columns == 0, token, tokens)
    sync(token, position, tokens, full)
    for step in range(1, new):
        position = position + 1
        where = torch.tensor([batch.length + step - 1], device=device)  # data: no recompile
        with ctx.autocast():
            output = model(input_ids=token, attention_mask=full, position_ids=position,
                           cache_position=where, use_cache=True, **{name: cache})
        token = output.logits[:, -1].argmax(-1, keepdim=True)
        written = torch.tensor([step], device=device)
        tokens = torch.where(columns == written, token, tokens)
        sync(token, position, tokens, full)
    return tokens, position


def decode(data: GenerationData, batches: list, fetched: list,
           per_batch: Any) -> list[dict[str, str]]:
    """`{"generated_text": ...}` per prompt, in order, cut at the end-of-text token."""
    split = data.eval
    texts = [""] * split.num_rows
    for (bucket_index, positions, real), (tokens, _) in per_batch(batches, fetched):
        rows = split.buckets[bucket_index].rows[positions[:real]]
        for row, text in zip(rows, decoded_texts(data.host, tokens[:real]), strict=True):
            texts[row] = text
    return [{"generated_text": text} for text in texts]
