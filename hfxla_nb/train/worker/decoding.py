"""The decoding engine of a causal LM at fixed shapes: `decode`, for `hx.generate`, causal-LM
`predict` and `FineTuneResult.generate` (on the CPU, the same code runs eagerly).

Every shape is fixed before the first token: prompts padded on the left, a `StaticCache` of
prompt + new tokens, the attention mask over that whole length from the start, the position
of each new token and the step's index device tensors, the tokens written into a
`[rows, max_new_tokens]` buffer with a mask. The next token is chosen on the device
(`sampling.py`). A decoding compiles two graphs per prompt bucket, however many tokens: the
prompt's (with the first token) and one decoding step's.

Early stop, without a sync per token: every `check_every` steps (default 16) one small
transfer fetches which rows have ended (an end-of-text token); with `stop_strings` (or
streaming), the tokens so far come in the same transfer and the host looks for the stop
strings (or sends the new text). When every
row has ended the loop stops: a batch of short answers runs a few checks' worth of steps, not
`max_new_tokens`. The fetched values are already computed, so a check adds no graph.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..generation_options import GenerationOptions, cut_at_stop
from . import sampling

if TYPE_CHECKING:
    import torch


@dataclass
class DecodeHooks:
    """What the engine does between steps, by where it runs.

    Attributes:
        sync: called with the state's tensors after the prompt and after every step (on XLA:
            replicate them over the mesh, then `torch_xla.sync()`; on the CPU: nothing).
        fetch: copies device tensors to the host in one transfer (on the CPU: as they are).
        autocast: the context the forward passes run in (mixed precision), or None.
        tokenizer: decodes the tokens at a check when there are stop strings.
        on_check: called at each check with every row's tokens so far (host lists) and the
            steps run: the tokens come in the check's one transfer (streaming).
    """

    sync: Callable[[list], None]
    fetch: Callable[[list], list]
    autocast: Callable[[], Any] | None = None
    tokenizer: Any = None
    on_check: Callable[[list[list[int]], int], None] | None = None


@dataclass
class Decoded:
    """What a decoding returns.

    Attributes:
        tokens: `[rows, max_new_tokens]` on the device: the new tokens (after a row ended,
            or after the last step run, whatever the buffer held).
        steps: the decoding steps run (tokens chosen per row), `max_new_tokens` at most.
        checks: the early-stop checks made (one small transfer each).
        done: `[rows]` bool on the device: which rows produced an end-of-text token.
    """

    tokens: torch.Tensor
    steps: int
    checks: int
    done: torch.Tensor


def cache_argument(model: Any) -> str:
    """The forward's name for the key/value cache (transformers 5: `cache`, before:
    `past_key_values`)."""
    return ("cache" if "cache" in inspect.signature(model.forward).parameters
            else "past_key_values")


def decode(model: Any, ids: torch.Tensor, mask: torch.Tensor, options: GenerationOptions,
           hooks: DecodeHooks, keys: torch.Tensor | None = None,
           live: torch.Tensor | None = None) -> Decoded:
    """Decode up to `options.max_new_tokens` tokens for a batch of left-padded prompts.

    Args:
        model: a causal LM in eval mode, on the device of `ids`.
        ids, mask: `[rows, length]` prompt ids and their attention mask (0 on padding).
        options: the decoding's options.
        hooks: sync, fetch and autocast for where it runs.
        keys: `[rows]` row keys for the draws (default: the row's index).
        live: `[rows]`, 0 for filler rows (never waited for); default every row.

    Returns:
        `Decoded`: the token buffer, the steps run and the checks made.
    """
    import torch
    from transformers import StaticCache

    rows, length = ids.shape
    new, device = options.max_new_tokens, ids.device
    ids, mask = ids.long(), mask.long()
    full = torch.cat([mask, torch.ones(rows, new, dtype=mask.dtype, device=device)], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = StaticCache(config=model.config, max_cache_len=length + new)
    name, autocast = cache_argument(model), hooks.autocast or nullcontext
    state = {
        "tokens": torch.zeros(rows, new, dtype=torch.long, device=device),
        "done": (torch.zeros(rows, dtype=torch.bool, device=device) if live is None
                 else live.reshape(rows) == 0),
        "seen": (sampling.seen_tokens(ids, mask, model.config.vocab_size)
                 if sampling.uses_seen(options) else None),
        "position": positions[:, -1:],
    }
    seed = torch.tensor([options.seed & 0x7FFFFFFF], dtype=torch.int32, device=device)
    keys = (torch.arange(rows, dtype=torch.int32, device=device) if keys is None
            else keys.reshape(rows).int())
    # Padded to 8 ids with -1 (no token): one, two or three end tokens share the graphs.
    ends = list(options.eos_token_ids)
    eos = torch.tensor(ends + [-1] * max(8 - len(ends), 0), dtype=torch.long, device=device)
    columns = torch.arange(new, device=device)[None, :]
    with autocast():
        output = model(input_ids=ids, attention_mask=full[:, :length], position_ids=positions,
                       cache_position=torch.arange(length, device=device), use_cache=True,
                       **{name: cache})
    step_tensor = torch.zeros(1, dtype=torch.int32, device=device)
    state = _chosen(state, output.logits[:, -1], options, (seed, keys, step_tensor), columns,
                    eos)
    hooks.sync([tensor for tensor in state.values() if tensor is not None] + [full])
    steps, checks, ended = 1, 0, [False] * rows
    while steps < new:
        if steps % options.check_every == 0:
            checks += 1
            if _all_ended(state, steps, options, hooks, ended):
                break
        state["position"] = state["position"] + 1
        # Data, not constants: every step is the same graph.
        where = torch.tensor([length + steps - 1], device=device)
        step_tensor = torch.tensor([steps], dtype=torch.int32, device=device)
        with autocast():
            output = model(input_ids=state["token"], attention_mask=full,
                           position_ids=state["position"], cache_position=where,
                           use_cache=True, **{name: cache})
        state = _chosen(state, output.logits[:, -1], options, (seed, keys, step_tensor),
                        columns, eos)
        hooks.sync([tensor for tensor in state.values() if tensor is not None] + [full])
        steps += 1
    return Decoded(state["tokens"], steps, checks, state["done"])


def _chosen(state: dict, logits: torch.Tensor, options: GenerationOptions, draw: tuple,
            columns: torch.Tensor, eos: torch.Tensor) -> dict:
    """The state after choosing each row's token at step `draw[2]` and writing it down."""
    import torch

    seed, keys, step = draw
    token = sampling.next_tokens(logits, options, state["seen"], seed, keys, step)
    tokens = torch.where(columns == step.long(), token, state["tokens"])
    done = state["done"] | (token == eos[None, :]).any(-1)
    seen = sampling.add_seen(state["seen"], token) if state["seen"] is not None else None
    return {"tokens": tokens, "done": done, "seen": seen, "position": state["position"],
            "token": token}


def _all_ended(state: dict, steps: int, options: GenerationOptions, hooks: DecodeHooks,
               ended: list[bool]) -> bool:
    """Whether every row has ended: an end-of-text token (on the device), or a stop string
    in its text so far (on the host; `ended` remembers those rows). One transfer."""
    with_tokens = bool(options.stop_strings) or hooks.on_check is not None
    fetched = hooks.fetch([state["done"], state["tokens"]] if with_tokens else [state["done"]])
    done = fetched[0].tolist()
    rows = fetched[1][:, :steps].tolist() if with_tokens else []
    if hooks.on_check is not None:
        hooks.on_check(rows, steps)
    if options.stop_strings:
        for i, row in enumerate(rows):
            if not (done[i] or ended[i]):
                text = hooks.tokenizer.decode(row, skip_special_tokens=True)
                ended[i] = cut_at_stop(text, options.stop_strings)[1]
    return all(d or e for d, e in zip(done, ended, strict=True))
