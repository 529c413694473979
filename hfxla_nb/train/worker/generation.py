"""`generate`: greedy generation on XLA with fixed shapes, inside a launched worker.

`model.generate()` on XLA recompiles for every new token when the cache grows with the text
(transformers #18661). Here every shape is fixed before the first token: prompts are padded on
the left to a multiple of `bucket`, the key/value cache is a `StaticCache` of prompt + new
tokens, the attention mask covers that whole length from the start, and the position of each
new token is a device tensor. A whole generation compiles the prompt's graph (one per bucket),
the first and the steady decoding step, and the final gather: 4 graphs, however many tokens
(torch_xla 2.8 compiles 3: one fewer, measured on Kaggle's stack).
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from ... import _xla
from ...events import worker_channel
from ..quiet_loading import quiet_loading


def generate(model: str | os.PathLike, prompts: str | list[str], max_new_tokens: int = 32,
             *, bucket: int = 16, tokenizer: Any = None) -> list[str]:
    """Continue each prompt greedily on this worker's XLA device, with fixed shapes.

    Call it inside a function launched by `hx.notebook_launcher` (in the kernel, use
    `FineTuneResult.generate`, which runs on the CPU without starting the XLA runtime).

    Args:
        model: a causal-LM folder (`fine_tune` output, `save_pretrained`) or a Hub name.
        prompts: one prompt or a list of prompts, generated together as one batch.
        max_new_tokens: tokens added to every prompt (generation stops at the end-of-text
            token in the returned texts; the graphs always run `max_new_tokens` steps).
        bucket: prompt lengths are padded to a multiple of this, so prompts of similar length
            share compiled graphs.
        tokenizer: default: the one saved with the model.

    Returns:
        The new text of each prompt, without the prompt.
    """
    if worker_channel() is None:
        raise RuntimeError(
            "hx.generate runs on the XLA device inside a launched function: "
            "hx.notebook_launcher(lambda: hx.generate(folder, prompts)). In the kernel itself "
            "use result.generate(prompts) (on the CPU; the XLA runtime stays off)."
        )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
            max_new_tokens < 1):
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}.")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    texts = [prompts] if isinstance(prompts, str) else list(prompts)
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(os.fspath(model))
    with quiet_loading():  # no "Loading weights 21/21" bar in the launch panel
        network = AutoModelForCausalLM.from_pretrained(os.fspath(model))
    device = _xla.device()
    network.to(device).eval()
    ids, mask, positions, length = _left_padded(tokenizer, texts, bucket, max_new_tokens)
    with torch.no_grad():
        tokens = _decode(network, ids.to(device), mask.to(device), positions.to(device),
                         length, max_new_tokens)
    return decoded_texts(tokenizer, tokens)


def _left_padded(tokenizer: Any, texts: list[str], bucket: int, new: int):
    """Prompt ids padded on the left to a bucket length, the mask over prompt + new tokens,
    and each prompt token's position (padding does not count)."""
    import torch

    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    rows = [bos + list(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
    length = -(-max(map(len, rows)) // bucket) * bucket
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(rows), length), int(pad), dtype=torch.long)
    mask = torch.zeros((len(rows), length + new), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, length - len(row):] = torch.tensor(row)
        mask[i, length - len(row):] = 1
    mask[:, length:] = 1  # the new tokens: attended to once written (the cache is causal)
    positions = (mask[:, :length].cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions, length


def _decode(network: Any, ids: Any, mask: Any, positions: Any, length: int, new: int) -> Any:
    import torch
    from transformers import StaticCache

    cache = StaticCache(config=network.config, max_cache_len=length + new)
    # transformers 5 renames `past_key_values` to `cache`; take whichever this version has.
    cache_name = ("cache" if "cache" in inspect.signature(network.forward).parameters
                  else "past_key_values")
    device = ids.device
    output = network(input_ids=ids, attention_mask=mask[:, :length], position_ids=positions,
                     cache_position=torch.arange(length, device=device), use_cache=True,
                     **{cache_name: cache})
    token = output.logits[:, -1].argmax(-1, keepdim=True)
    tokens, position = [token], positions[:, -1:]
    for step in range(new - 1):
        position = position + 1
        where = torch.tensor([length + step], device=device)  # data, not a constant: no recompile
        output = network(input_ids=token, attention_mask=mask, position_ids=position,
                         cache_position=where, use_cache=True, **{cache_name: cache})
        token = output.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(token)
        _xla.sync()
    return _xla.to_cpu([torch.cat(tokens, dim=1)])[0]


def decoded_texts(tokenizer: Any, tokens: Any) -> list[str]:
    """Each row of `tokens` (`[rows, new]` token ids) as text, cut at the end-of-text token."""
    eos = tokenizer.eos_token_id
    texts = []
    for row in tokens.tolist():
        if eos is not None and eos in row:
            row = row[:row.index(eos)]
        texts.append(tokenizer.decode(row, skip_special_tokens=True))
    return texts
