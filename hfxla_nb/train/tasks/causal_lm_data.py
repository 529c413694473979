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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..batching import Bucket, EncodedSplit
from ..kernel.data import DataError

IGNORE = -100  # the label transformers' causal-LM loss skips
DEFAULT_TEMPLATE = "{prompt}\n{response}"
INPUT_NAMES = ["input_ids", "attention_mask", "labels"]


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
