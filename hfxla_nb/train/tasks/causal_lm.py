"""Causal language modelling: next-token prediction, perplexity, and generation for `predict`.

Kernel side: texts or prompt/response pairs, tokenized into one fixed length, with labels
masked where nothing is to be learned. Every row becomes `[input_ids | attention_mask |
labels]`, all `max_length` long (labels -100 on padding, and on the prompt of a pair), so a
training step never changes shape:

- plain text (a `text_column`) is packed by default: the documents, each ended by the
  end-of-text token, are concatenated and cut into rows of `max_length` (no padding at all;
  the last partial row is dropped);
- prompt/response pairs are joined by a template ("{prompt}" and "{response}" placeholders)
  or by the tokenizer's chat template, one pair per row, padded; rows longer than
  `max_length` are cut at the end and counted.

`prepare` also gives the LoRA settings and the memory plan (which decides `sharding="auto"`
and `lora="auto"`, and refuses what cannot fit).

`predict`: each prompt continued on every device, at fixed shapes. Prompts are tokenized as
`hx.generate` tokenizes them, each repeated `num_return_sequences` times and padded on the
left into length buckets; a bucket plus the new tokens must fit the model's positions. Each
row's label column carries its index: the key of its draws, so a seed gives the same answers
whatever the batches. In the worker, `decode` (`train.worker.generation`) runs over a sharded
batch: two graphs per prompt bucket, and the results of every batch fetched in one transfer
at the end. The texts are cut at the end-of-text token and the first stop string.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import _xla
from ..._words import plural
from .. import batching, data, preparation
from ..batching import Bucket, EncodedData, EncodedSplit, round_up
from ..config import (
    OPTION_NAMES,
    FineTuneConfig,
    FineTuneError,
    GenerationError,
    GenerationOptions,
    chat_texts,
    is_conversation,
    resolve_options,
)
from ..data import DataError
from ..finetune import warn_user
from ..memory import meta_model
from ..preparation import Prepared, Splits, TaskContext
from ..worker.generation import DecodeHooks, decode, texts_of
from . import register_task
from .base import Task

if TYPE_CHECKING:
    import torch

    from ..batching import EncodedData
    from ..config import FineTuneConfig
    from ..predict import PredictContext
    from ..preparation import Prepared, Splits, TaskContext
    from ..worker.context import Batch, WorkerContext


# -- the kernel side: packed texts and prompt/response pairs --

IGNORE = -100  # the label transformers' causal-LM loss skips
DEFAULT_TEMPLATE = "{prompt}\n{response}"
INPUT_NAMES = ["input_ids", "attention_mask", "labels"]
#: What training keeps per parameter with AdamW in float32: weights, gradients, 2 moments.
BYTES_PER_PARAMETER = 16
DEFAULT_MAX_LENGTH = 512
#: peft's task type for a causal LM.
PEFT_TASK_TYPE = "CAUSAL_LM"


@dataclass
class LmRows:
    """One split's token rows before padding: ids and which of them are learned."""

    ids: list[list[int]]
    learned: list[list[bool]]
    cut: int = 0  # rows longer than max_length, cut at the end


def check_template(template: str) -> tuple[str, str]:
    """Split a template into the prompt side and the response side, or refuse it."""
    missing = [name for name in ("{prompt}", "{response}") if name not in template]
    if missing:
        raise DataError(
            f"template {template!r} has no {' and no '.join(missing)} placeholder: write it with "
            "both, e.g. template='### Question: {prompt}\\n### Answer: {response}'."
        )
    head, tail = template.split("{response}", 1)
    if "{prompt}" not in head:
        raise DataError(
            f"template {template!r} puts {{response}} before {{prompt}}: the response must "
            "come after the prompt (it is what the model learns to continue with)."
        )
    return head, "{response}" + tail


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _ends(tokenizer) -> tuple[list[int], list[int]]:
    bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
    eos = [tokenizer.eos_token_id] if getattr(tokenizer, "eos_token_id", None) is not None else []
    return bos, eos


def pair_rows(tokenizer, prompts: Sequence[str], responses: Sequence[str], template: str | None,
              max_length: int) -> LmRows:
    """One row per pair: the prompt side unlearned, the response side (and end token) learned."""
    bos, eos = _ends(tokenizer)
    chat = template is None and getattr(tokenizer, "chat_template", None)
    head, tail = check_template(template or DEFAULT_TEMPLATE)
    rows = LmRows([], [])
    for prompt, response in zip(prompts, responses, strict=True):
        if chat:
            user = [{"role": "user", "content": prompt}]
            prompt_ids = list(tokenizer.apply_chat_template(user, add_generation_prompt=True))
            whole = list(tokenizer.apply_chat_template(
                user + [{"role": "assistant", "content": response}]))
            ids, learned_from = whole, len(prompt_ids)
        else:
            prompt_ids = bos + _ids(tokenizer, head.format(prompt=prompt))
            ids = prompt_ids + _ids(tokenizer, tail.format(response=response)) + eos
            learned_from = len(prompt_ids)
        if len(ids) > max_length:
            ids, rows.cut = ids[:max_length], rows.cut + 1
        rows.ids.append(ids)
        rows.learned.append([i >= learned_from for i in range(len(ids))])
    return rows


def text_rows(tokenizer, texts: Sequence[str], max_length: int, packing: bool) -> LmRows:
    """Rows of plain text: packed into `max_length` chunks, or one document per row."""
    bos, eos = _ends(tokenizer)
    documents = [bos + _ids(tokenizer, text) + eos for text in texts]
    if not packing:
        rows = LmRows([], [])
        for ids in documents:
            if len(ids) > max_length:
                ids, rows.cut = ids[:max_length], rows.cut + 1
            rows.ids.append(ids)
            rows.learned.append([True] * len(ids))
        return rows
    stream = [token for ids in documents for token in ids]
    chunks = [stream[start:start + max_length]
              for start in range(0, len(stream) - max_length + 1, max_length)]
    return LmRows(chunks, [[True] * max_length for _ in chunks])


def longest_row(rows: LmRows) -> int:
    return max((len(ids) for ids in rows.ids), default=0)


def encode_rows(name: str, rows: LmRows, max_length: int, pad_id: int) -> EncodedSplit:
    """`[input_ids | attention_mask | labels]` int32 rows of `max_length`, in one bucket."""
    count = len(rows.ids)
    inputs = np.empty((count, 3 * max_length), dtype=np.int32)
    inputs[:, :max_length] = pad_id
    inputs[:, max_length:2 * max_length] = 0
    inputs[:, 2 * max_length:] = IGNORE
    for i, (ids, learned) in enumerate(zip(rows.ids, rows.learned, strict=True)):
        n = len(ids)
        inputs[i, :n] = ids
        inputs[i, max_length:max_length + n] = 1
        inputs[i, 2 * max_length:2 * max_length + n] = np.where(learned, ids, IGNORE)
    bucket = Bucket(max_length, inputs, np.zeros(count, dtype=np.int64), np.arange(count))
    return EncodedSplit(name, [bucket] if count else [], count, rows.cut)


def prepare(splits: Splits, config: FineTuneConfig, context: TaskContext) -> Prepared:
    """Every split's rows at one length, the LoRA settings, and the memory plan of the run,
    which decides `sharding="auto"` and `lora="auto"` (and refuses what cannot fit)."""
    notes: list[str] = []
    tokenizer, model_config = context.tokenizer, context.model_config
    pad_id = _pad_token(tokenizer, notes)
    max_length = preparation.length_cap(config, model_config, tokenizer, DEFAULT_MAX_LENGTH)
    stream = splits.train if data.is_stream(splits.train) else None
    if stream is not None:  # its first rows stand for it in every check below
        try:
            splits = Splits({**splits.named, "train": data.peek(stream)}, splits.eval_name)
        except DataError as error:
            raise FineTuneError(str(error)) from None
    rows = _read_splits(splits, config, tokenizer, max_length, notes)
    encoded = {name: encode_rows(name, split_rows, max_length, pad_id)
               for name, split_rows in rows.items()}
    if stream is None:
        preparation.check_batch_fits(config, encoded["train"].num_rows)
    else:
        encoded["train"] = streamed_split(stream, config, tokenizer, max_length, pad_id,
                                          encoded["train"], notes)
    lora_json, memory = preparation.lora_and_memory(
        config, context.instance or model_config, model_config, PEFT_TASK_TYPE, max_length,
        context.devices, notes)
    sharding = memory.sharding if context.devices > 1 and config.strategy == "spmd" else None
    eval_name = splits.eval_name
    encoded_data = EncodedData(
        train=encoded["train"], eval=encoded[eval_name] if eval_name is not None else None,
        input_names=list(INPUT_NAMES), bucket_lengths=[max_length], label_names=[],
        notes=notes)
    kwargs = ({} if getattr(model_config, "pad_token_id", None) is not None
              else {"pad_token_id": int(pad_id)})
    return Prepared(encoded_data, kwargs, lora=lora_json, memory=memory, sharding=sharding)


class LmStream:
    """Rows of a stream as causal-LM rows of `max_length` (`batching.StreamedSplit`'s
    `encode`): texts packed (the tokens that do not fill a row are carried into the next
    chunk's), or one padded row per text, or per prompt/response pair (the prompt unlearned).

    Args:
        tokenizer: the tokenizer.
        columns: the text column, or the prompt and response columns.
        pairs: whether `columns` are a prompt and a response.
        template: the pairs' template (None: the default, or the chat template).
        packing: whether texts are packed.
        max_length: the rows' length.
        pad_id: what pads a row.
    """

    def __init__(self, tokenizer: Any, columns: list[str], pairs: bool, template: str | None,
                 packing: bool, max_length: int, pad_id: int) -> None:
        self.tokenizer, self.columns, self.pairs = tokenizer, columns, pairs
        self.template, self.packing = template, packing
        self.max_length, self.pad_id = max_length, pad_id
        self.carry: list[int] = []
        self.seen = 0

    def reset(self) -> None:
        self.carry, self.seen = [], 0

    def __call__(self, rows: list[dict]) -> Bucket:
        texts = [self._texts(rows, column) for column in self.columns]
        self.seen += len(rows)
        length = self.max_length
        if self.pairs:
            lm = pair_rows(self.tokenizer, texts[0], texts[1], self.template, length)
        elif not self.packing:
            lm = text_rows(self.tokenizer, texts[0], length, packing=False)
        else:
            bos, eos = _ends(self.tokenizer)
            ids = self.tokenizer(texts[0], add_special_tokens=False)["input_ids"]
            stream = self.carry + [token for row in ids for token in bos + list(row) + eos]
            full = len(stream) // length * length
            self.carry = stream[full:]
            chunks = [stream[start:start + length] for start in range(0, full, length)]
            lm = LmRows(chunks, [[True] * length for _ in chunks])
        split = encode_rows("train", lm, length, self.pad_id)
        if split.buckets:
            return split.buckets[0]
        return Bucket(length, np.empty((0, 3 * length), np.int32), np.zeros(0, np.int64),
                      np.arange(0))

    def _texts(self, rows: list[dict], column: str) -> list[str]:
        values = []
        for i, row in enumerate(rows):
            value = row.get(column)
            if not isinstance(value, str):
                raise DataError(
                    f"row {self.seen + i} of the streamed training data: column {column!r} "
                    f"holds {data.short(value)}, not text. Filter or convert such rows in the "
                    f"stream first, e.g. stream.filter(lambda row: isinstance(row[{column!r}], "
                    "str)).")
            values.append(value)
        return values


def streamed_split(stream: Any, config: FineTuneConfig, tokenizer: Any, max_length: int,
                   pad_id: int, first: EncodedSplit, notes: list[str]) -> batching.StreamedSplit:
    """The training split of a streamed dataset, read in the worker (`LmStream`); `first`: its
    first rows as encoded here, which identify it for a resume."""
    pairs = config.prompt_column is not None
    columns = ([config.prompt_column, config.response_column] if pairs
               else [config.text_column])
    packing = (not pairs) if config.packing is None else bool(config.packing)
    encoder = LmStream(tokenizer, columns, pairs, config.template, packing, max_length, pad_id)
    notes.append(f"the training data is streamed: read and tokenized in the worker as "
                 f"training consumes it ({config.rows_per_step} rows of {max_length} tokens a "
                 f"step, in the stream's order); its first {data.PEEK_ROWS} rows were checked "
                 "before the start")
    return batching.StreamedSplit("train", stream, encoder, max_length,
                                  digest=preparation.digest(first))


def _pad_token(tokenizer, notes: list[str]) -> int:
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is not None:
        return int(pad_id)
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise FineTuneError(
            "the tokenizer has neither a padding nor an end-of-text token; set one, e.g. "
            "tokenizer.pad_token = '<pad>' after adding it, or pass another tokenizer."
        )
    notes.append(f"the tokenizer has no padding token: padding with its end-of-text token "
                 f"{tokenizer.eos_token!r} (padding is masked out of the loss)")
    return int(eos)


def _read_splits(splits: Splits, config: FineTuneConfig, tokenizer, max_length: int,
                 notes: list[str]) -> dict[str, LmRows]:
    """Token rows of the training split and of the evaluation split, if any."""
    pairs = config.prompt_column is not None
    if config.template is not None and not pairs:
        raise FineTuneError("template= joins prompt_column and response_column; pass both "
                            "columns, or drop template to learn the text_column as it is.")
    if pairs and config.packing:
        raise FineTuneError("packing=True is for plain text: prompt/response pairs are padded, "
                            "one pair per row, so that each prompt stays unlearned.")
    packing = (not pairs) if config.packing is None else bool(config.packing)
    columns = ([config.prompt_column, config.response_column] if pairs
               else [config.text_column])
    try:
        if config.template is not None:
            check_template(config.template)
        result = {}
        for split, ds in splits.named.items():
            data.check_columns(ds, split, columns)
            texts = [data.check_texts(data.column_values(ds, c), c, split) for c in columns]
            if pairs:
                result[split] = pair_rows(tokenizer, texts[0], texts[1], config.template,
                                          max_length)
            else:
                result[split] = text_rows(tokenizer, texts[0], max_length, packing)
    except DataError as error:
        raise FineTuneError(str(error)) from None
    _note_lengths(result, max_length, packing, notes)
    return result


def _note_lengths(splits: dict[str, LmRows], max_length: int, packing: bool,
                  notes: list[str]) -> None:
    """Say before anything runs how many rows would be cut, and if max_length is wasteful."""
    for split, rows in splits.items():
        if rows.cut:
            message = (f"{rows.cut} of {plural(len(rows.ids), f'{split} row')} are longer than "
                       f"max_length={max_length} and will be cut at the end")
            notes.append(message)
            warn_user(f"hfxla_nb.fine_tune: {message}.")  # at the user's call
    if packing:
        notes.append(f"texts packed into rows of {max_length} tokens (no padding)")
        if not splits["train"].ids:
            raise FineTuneError(f"the training texts hold fewer than max_length={max_length} "
                                "tokens in all: pass a smaller max_length or more text.")
        return
    longest = max(longest_row(rows) for rows in splits.values())
    if longest and round_up(longest) < max_length:
        notes.append(f"the longest row has {longest} tokens: max_length={round_up(longest)} "
                     f"would compute less than {max_length}")


def parameter_count(model_config) -> int:
    """Parameters of the model a config describes, counted without allocating them."""
    return sum(parameter.numel() for parameter in meta_model(model_config).parameters())


# -- CausalLM: the task's hooks --

class CausalLM(Task):
    """Next-token prediction: labels in the row (-100 where nothing is learned); the loss is
    the mean over learned tokens, evaluation reports it and its perplexity."""

    name = "causal-lm"
    reported_metrics = ("loss", "perplexity", "tokens")
    pipeline_tag = "text-generation"
    eval_ahead = True
    auto_class = "AutoModelForCausalLM"
    head_suffixes = ("ForCausalLM", "LMHeadModel")
    peft_task_type = PEFT_TASK_TYPE
    streams = True
    predict_rows_per_device = 8  # a key/value cache per row grows with the new tokens
    title = "causal LM"
    continues_prompts = True
    generation_options = OPTION_NAMES

    # -- kernel side ---------------------------------------------------------------------------

    def check_model(self, model_config: Any, names: list[str]) -> None:
        """Refuse an encoder-decoder model (a name or folder too, before any fork)."""
        if getattr(model_config, "is_encoder_decoder", False):
            what = ", ".join(names) or getattr(model_config, "model_type", "the model")
            raise FineTuneError(
                f"task='causal-lm', but the model ({what}) is an encoder-decoder model: it "
                "learns a target from a source. Use task='seq2seq' with source_column= and "
                "target_column= (or source_lang= and target_lang=), or a decoder-only model.")

    def prepare(self, splits: Splits, config: FineTuneConfig,
                context: TaskContext) -> Prepared:
        """Texts or prompt/response pairs as rows of one length (`prepare`), the
        LoRA settings and the memory plan (`sharding="auto"`, `lora="auto"`)."""
        return prepare(splits, config, context)

    def _output(self, ctx: WorkerContext, batch: Batch,
                with_labels: bool) -> tuple[Any, torch.Tensor]:
        inputs = batch.inputs()
        labels = inputs.pop("labels").long()
        with ctx.autocast():
            # No key/value cache while training: nothing reads it, and a layer recomputed by
            # gradient checkpointing would append to it a second time.
            output = ctx.model(**inputs, labels=labels if with_labels else None, use_cache=False)
        return output, labels

    def train_loss(self, ctx: WorkerContext, batch: Batch) -> torch.Tensor:
        output, _ = self._output(ctx, batch, with_labels=True)
        return output.loss.float()

    def prepare_predict(self, inputs: list[Any], context: PredictContext,
                        max_length: int | None) -> EncodedData:
        """Prompts, padded on the left into buckets (`prepare_prompts`)."""
        return prepare_prompts(inputs, context, max_length)

    def decode(self, data: Any, batches: list, fetched: list) -> list[dict[str, str]]:
        """Each prompt's generated text (`predict`)."""
        return decode_texts(data, batches, fetched, self.per_batch)

    def eval_outputs(self, ctx: WorkerContext, batch: Batch) -> list[torch.Tensor]:
        import torch

        data = ctx.plan.data
        if isinstance(data, GenerationData):  # predict: generated tokens (and which rows ended)
            tokens, done = generate_on_device(ctx, batch, data.options)
            return [tokens, done]
        output, labels = self._output(ctx, batch, with_labels=False)
        logits = output.logits.float()[:, :-1]
        targets = labels[:, 1:]
        losses = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
            reduction="none",
        ).view(targets.shape)
        weights = (targets != -100).float() * batch.weights.float()[:, None]
        return [(losses * weights).sum(-1), weights.sum(-1)]

    def eval_metrics(self, ctx: WorkerContext, batches: list, fetched: list) -> dict[str, float]:
        total = tokens = 0.0
        for (_, _, real), sums, counts in zip(batches, fetched[0::2], fetched[1::2],
                                              strict=True):
            total += float(sums.double().numpy()[:real].sum())
            tokens += float(counts.double().numpy()[:real].sum())
        loss = total / max(tokens, 1.0)
        return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 50.0)),
                "eval_tokens": tokens, "eval_rows": float(ctx.plan.data.eval.num_rows)}


register_task(CausalLM())


# -- predict: prompts continued at fixed shapes --

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
    limit = preparation.position_limit(context.model_config)
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
    # The label column is the row's index: the key of its draws (`worker/generation.py`).
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
    inputs = batch.inputs()
    keys = batch.tokens[:, 2 * batch.length]  # the label column: the row's index

    def sync(tensors: list) -> None:
        ctx.replicate(tensors)  # the same input shardings for every step: one step graph
        _xla.sync()

    hooks = DecodeHooks(sync=sync, fetch=_xla.to_cpu, autocast=ctx.autocast,
                        tokenizer=ctx.plan.tokenizer, capture=ctx.plan.capture_steps,
                        mark=ctx.replicate)
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
