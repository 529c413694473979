"""Causal-LM rows for `fine_tune(task="causal-lm")`: texts or prompt/response pairs, tokenized
into one fixed length, with labels masked where nothing is to be learned.

Runs in the kernel before anything is forked. Every row becomes `[input_ids | attention_mask |
labels]`, all `max_length` long (labels -100 on padding, and on the prompt of a prompt/response
pair), so a training step never changes shape:

- plain text (a `text_column`) is packed by default: the documents, each ended by the
  end-of-text token, are concatenated and cut into rows of `max_length` (no padding at all;
  the last partial row is dropped);
- prompt/response pairs are joined by a template ("{prompt}" and "{response}" placeholders)
  or by the tokenizer's chat template, one pair per row, padded; rows longer than
  `max_length` are cut at the end and counted.

`prepare` is the task's kernel side: the rows of every split, the LoRA settings, and the
memory plan (which decides `sharding="auto"` and `lora="auto"`, and refuses what cannot fit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..._words import plural
from ..batching import Bucket, EncodedData, EncodedSplit, round_up
from ..config import FineTuneConfig, FineTuneError
from ..kernel import data, steps
from ..kernel.data import DataError
from ..kernel.preparation import Prepared, Splits, TaskContext
from ..model_facts import meta_model
from ..user_warnings import warn_user

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
    max_length = steps.length_cap(config, model_config, tokenizer, DEFAULT_MAX_LENGTH)
    rows = _read_splits(splits, config, tokenizer, max_length, notes)
    encoded = {name: encode_rows(name, split_rows, max_length, pad_id)
               for name, split_rows in rows.items()}
    steps.check_batch_fits(config, encoded["train"].num_rows)
    lora_json, memory = steps.lora_and_memory(
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
