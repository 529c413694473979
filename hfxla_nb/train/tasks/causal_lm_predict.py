"""`predict` for a causal LM: each prompt continued on every device, at fixed shapes.

Kernel side: the generation options are resolved and checked (`generation_options.py`: the
model's `generation_config.json`, a `GenerationConfig`, keyword options); prompts are
tokenized as `hx.generate` does (the beginning-of-text token, then the prompt; a chat
through the tokenizer's chat template), each repeated `num_return_sequences` times, and
padded on the left into length buckets; a prompt bucket plus the new tokens must fit the
model's positions (refused before any fork otherwise). Each row's label column carries its
index: the key of its draws, so a seed gives the same answers whatever the batches.

Worker side: `decoding.decode` over a sharded batch (filler rows never waited for). Per
prompt bucket two graphs: the prompt's and one decoding step's (every step's inputs are
replicated, so the first step is the same graph as the later ones), and the early-stop
checks add none; the results of every batch are fetched in one transfer at the end. The texts
are cut at the end-of-text token and at the first stop string, as `hx.generate` cuts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import _xla
from .. import batching
from ..config import FineTuneError
from ..generation_options import (
    GenerationError,
    GenerationOptions,
    chat_texts,
    is_conversation,
    resolve_options,
)
from ..kernel import sources
from ..worker.decoding import DecodeHooks, decode
from ..worker.generation import texts_of

if TYPE_CHECKING:
    import torch

    from ..worker.batch import Batch
    from ..worker.context import WorkerContext

#: New tokens per prompt when `predict` is not told.
DEFAULT_NEW_TOKENS = 32


@dataclass
class GenerationData(batching.EncodedData):
    """A causal LM's predict inputs: left-padded prompts and how to decode them."""

    max_new_tokens: int = DEFAULT_NEW_TOKENS
    options: GenerationOptions = field(default_factory=GenerationOptions)
    prompts: int = 0  # inputs before num_return_sequences repeated them


def prepare_prompts(inputs: list[Any], context: Any, max_length: int | None) -> GenerationData:
    """Prompts (str) or chats (role/content dicts) tokenized and bucketed, padded on the left."""
    tokenizer = context.tokenizer
    try:
        options = resolve_options(tokenizer, getattr(context, "generation_config", None),
                                  getattr(context, "max_new_tokens", None),
                                  **(getattr(context, "generation", None) or {}))
        ids = _prompt_ids(inputs, tokenizer)
    except GenerationError as error:
        raise FineTuneError(str(error)) from None
    new, copies = options.max_new_tokens, options.num_return_sequences
    ids = [row for row in ids for _ in range(copies)]
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
    # The label column is the row's index: the key of its draws (`sampling.py`).
    split = batching.encode_split("predict", encoded, np.arange(len(ids), dtype=np.int64),
                                  names, buckets, {"input_ids": int(pad or 0),
                                                   "attention_mask": 0}, "left")
    return GenerationData(train=None, eval=split, input_names=names,
                          bucket_lengths=list(map(int, buckets)), label_names=[], notes=[],
                          host=tokenizer, max_new_tokens=int(new), options=options,
                          prompts=len(inputs))


def _prompt_ids(inputs: list[Any], tokenizer: Any) -> list[list[int]]:
    """Each input's ids: a text after the beginning-of-text token, a chat as its template
    renders it (which writes its own special tokens)."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    rows = []
    for i, value in enumerate(inputs):
        if is_conversation(value):
            text = chat_texts(tokenizer, value)[0]
            rows.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
        elif isinstance(value, str):
            rows.append(bos + list(tokenizer(value, add_special_tokens=False)["input_ids"]))
        else:
            raise GenerationError(
                f"input {i} is a {type(value).__name__}; causal-lm predicts on prompts (str) "
                'or chats (lists of {"role": ..., "content": ...} dicts).')
    return rows


def generate_on_device(ctx: WorkerContext, batch: Batch,
                       options: GenerationOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """`[rows, max_new_tokens]` tokens of a batch of left-padded prompts, on the device, and
    which rows ended (already computed by the last step: returning it costs no graph)."""
    mesh = ctx.mesh
    inputs = batch.inputs()
    keys = batch.tokens[:, 2 * batch.length]  # the label column: the row's index

    def sync(tensors: list) -> None:
        if mesh is not None:  # the same input shardings for every step: one step graph
            for tensor in tensors:
                _xla.replicate(tensor, mesh)
        _xla.sync()

    hooks = DecodeHooks(sync=sync, fetch=_xla.to_cpu, autocast=ctx.autocast,
                        tokenizer=ctx.plan.tokenizer)
    decoded = decode(ctx.model, inputs["input_ids"], inputs["attention_mask"], options, hooks,
                     keys=keys, live=batch.weights)
    return decoded.tokens, decoded.done


def decode_texts(data: GenerationData, batches: list, fetched: list,
                 per_batch: Any) -> list[dict[str, Any]]:
    """`{"generated_text": ...}` per prompt, in order, cut at its end (a list of texts per
    prompt when `num_return_sequences` > 1)."""
    split = data.eval
    texts: list[Any] = [""] * split.num_rows
    single = replace(data.options, num_return_sequences=1)
    for (bucket_index, positions, real), (tokens, _) in per_batch(batches, fetched):
        rows = split.buckets[bucket_index].rows[positions[:real]]
        for row, text in zip(rows, texts_of(data.host, tokens[:real], single, real),
                             strict=True):
            texts[row] = text
    copies = data.options.num_return_sequences
    if copies > 1:
        texts = [texts[i * copies:(i + 1) * copies] for i in range(len(texts) // copies)]
    return [{"generated_text": text} for text in texts]
