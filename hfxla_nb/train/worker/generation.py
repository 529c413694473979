"""`generate`: generation on XLA with fixed shapes, inside a launched worker; and the same
decoding on the CPU for `FineTuneResult.generate`.

`model.generate()` on XLA recompiles for every new token when the cache grows with the text
(transformers #18661). Here every shape is fixed before the first token (`decoding.py`):
prompts are padded on the left to a multiple of `bucket`, the key/value cache is a
`StaticCache` of prompt + new tokens, and the next token is chosen on the device, greedy or
drawn (`sampling.py`). A whole generation compiles 2 graphs per prompt bucket, however many
tokens and however early every row ends: the prompt's and one decoding step's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ... import _xla
from ...events import Generated, emit, worker_channel, worker_rank
from .. import patches
from ..generation_options import (
    GenerationOptions,
    check_room,
    finished_text,
    model_generation_config,
    prompt_rows,
    resolve_options,
)
from ..kernel import sources
from ..quiet_loading import quiet_loading
from .decoding import Decoded, DecodeHooks, decode


def generate(model: str | os.PathLike, prompts: str | list[str] | None = None,
             max_new_tokens: int | None = None, *, messages: Any = None,
             generation_config: Any = None, bucket: int = 16, tokenizer: Any = None,
             stream: bool = True, **options: Any) -> list[str] | list[list[str]]:
    """Continue each prompt on this worker's XLA device, with fixed shapes.

    Call it inside a function launched by `hx.notebook_launcher` (in the kernel, use
    `FineTuneResult.generate`, which runs on the CPU without starting the XLA runtime).

    Args:
        model: a causal-LM folder (`fine_tune` output, `save_pretrained`) or a Hub name.
        prompts: one prompt or a list of prompts, generated together as one batch.
        max_new_tokens: at most this many tokens per prompt (default: the generation
            config's, else 32); the loop stops early once every row has ended.
        messages: instead of prompts, chat turns (`[{"role": ..., "content": ...}]`, or a
            list of such lists) rendered by the tokenizer's chat template.
        generation_config: a `transformers.GenerationConfig` (default: the model's own).
        bucket: prompt lengths are padded to a multiple of this, so prompts of similar length
            share compiled graphs.
        tokenizer: default: the one saved with the model.
        stream: send each row's new text to the notebook every `check_every` tokens and at
            the end (`Generated` events: the cell prints them; `hx.last_launch().streamed`);
            False: only the returned texts.
        options: `do_sample`, `temperature`, `top_k`, `top_p`, `min_p`, `repetition_penalty`,
            `num_return_sequences`, `seed`, `eos_token_id`, `stop_strings`, `check_every`
            (as transformers' `GenerationConfig`; `docs/tasks.md`).

    Returns:
        The new text of each prompt, without the prompt (a list of texts per prompt when
        `num_return_sequences` > 1).

    Raises:
        RuntimeError: called in the kernel rather than in a launched function.
        GenerationError: an option or a prompt that cannot work.
    """
    if worker_channel() is None:
        raise RuntimeError(
            "hx.generate runs on the XLA device inside a launched function: "
            "hx.notebook_launcher(lambda: hx.generate(folder, prompts)). In the kernel itself "
            "use result.generate(prompts) (on the CPU; the XLA runtime stays off).")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = tokenizer or AutoTokenizer.from_pretrained(os.fspath(model))
    config = generation_config or model_generation_config(model)
    settings = resolve_options(tokenizer, config, max_new_tokens, **options)
    rows = prompt_rows(tokenizer, prompts, messages)
    with quiet_loading():  # no "Loading weights 21/21" bar in the launch panel
        network = AutoModelForCausalLM.from_pretrained(os.fspath(model))
    device = _xla.device()
    network.to(device).eval()
    streamer = Streamer(tokenizer, settings, emit, rows) if stream else None
    hooks = DecodeHooks(sync=lambda tensors: _xla.sync(), fetch=_xla.to_cpu,
                        tokenizer=tokenizer, on_check=streamer.send if streamer else None)
    # The mask check's patch (`patches.py`): without it, masking syncs once more, a graph.
    with torch.no_grad(), patches.applied():
        decoded = generate_rows(network, tokenizer, rows, settings, bucket, hooks)
    tokens = _xla.to_cpu([decoded.tokens])[0]
    if streamer is not None:
        streamer.send(tokens[:, :decoded.steps].tolist(), decoded.steps, done=True)
    return texts_of(tokenizer, tokens, settings, len(rows))


class Streamer:
    """Hands each row's new text (what was not sent before) to `deliver` as a `Generated`
    event: `emit` in a worker, `print_generated` in the kernel."""

    def __init__(self, tokenizer: Any, options: GenerationOptions,
                 deliver: Callable[[Generated], Any], prompts: Sequence[list[int]] = ()) -> None:
        self.tokenizer, self.options, self.deliver = tokenizer, options, deliver
        self.sent: list[str] = []
        # The prompts as the model read them, sent once: the panel shows each under the bars.
        self.prompts = [tokenizer.decode(row, skip_special_tokens=True) for row in prompts]

    def send(self, rows: list[list[int]], steps: int, done: bool = False) -> None:
        """Send the text of `rows` (every row's tokens so far) beyond what was sent."""
        texts = [finished_text(self.tokenizer, row, self.options) for row in rows]
        sent = self.sent or [""] * len(texts)
        # A text that no longer starts with what was sent (a word re-split) is sent whole.
        pieces = tuple(text[len(old):] if text.startswith(old) else text
                       for text, old in zip(texts, sent, strict=True))
        first = not self.sent
        self.sent = texts
        prompts = ()
        if first and self.prompts:  # num_return_sequences rows per prompt, in prompt order
            prompts = tuple(self.prompts[i * len(self.prompts) // len(texts)]
                            for i in range(len(texts)))
        self.deliver(Generated(worker_rank(), steps, self.options.max_new_tokens, pieces,
                               done, prompts))


def print_generated(event: Generated) -> None:
    """Print a generation's new text in this process, as a launch's cell shows it."""
    sys.stdout.write(event.shown())
    sys.stdout.flush()


def generate_rows(network: Any, tokenizer: Any, rows: list[list[int]],
                  options: GenerationOptions, bucket: int, hooks: DecodeHooks) -> Decoded:
    """Decode prompt token rows on the network's device: left-padded to a multiple of
    `bucket`, each repeated `num_return_sequences` times (its copies draw differently).

    Raises:
        GenerationError: the padded prompts and the new tokens exceed the model's positions.
    """
    ids, mask, length = left_padded(tokenizer, rows, bucket, options.num_return_sequences)
    check_room(rows, length, options, sources.position_limit(network.config))
    device = next(network.parameters()).device
    return decode(network, ids.to(device), mask.to(device), options, hooks)


def left_padded(tokenizer: Any, rows: list[list[int]], bucket: int, copies: int = 1):
    """Prompt ids `[rows * copies, length]` padded on the left to a multiple of `bucket`, their
    mask (0 on padding), and the length."""
    import torch

    rows = [row for row in rows for _ in range(copies)]
    length = -(-max(map(len, rows)) // bucket) * bucket
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(rows), length), int(pad or 0), dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, length - len(row):] = torch.tensor(row)
        mask[i, length - len(row):] = 1
    return ids, mask, length


def texts_of(tokenizer: Any, tokens: Any, options: GenerationOptions,
             prompts: int) -> list[str] | list[list[str]]:
    """Each row's text, cut at its end (`finished_text`); grouped per prompt when
    `num_return_sequences` > 1."""
    texts = [finished_text(tokenizer, row, options) for row in tokens.tolist()]
    copies = options.num_return_sequences
    if copies == 1:
        return texts
    return [texts[i * copies:(i + 1) * copies] for i in range(prompts)]


def cpu_hooks(tokenizer: Any, streamer: Streamer | None = None) -> DecodeHooks:
    """The engine's hooks on the CPU: nothing to sync, tensors already on the host; the new
    text to `streamer` at each check, when given."""
    return DecodeHooks(sync=lambda tensors: None, fetch=list, tokenizer=tokenizer,
                       on_check=streamer.send if streamer is not None else None)
