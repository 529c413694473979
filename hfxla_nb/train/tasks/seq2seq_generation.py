"""Greedy generation for encoder-decoder models (T5, BART) with fixed shapes.

`model.generate()` on XLA grows the decoder input by one token per step: a new shape, a new
graph, every token. Here every shape is fixed before the first token: the encoder runs once,
then each step runs the decoder over the whole target length (a causal decoder does not look
ahead, so the tokens not written yet change nothing), reads the logits at the current
position through a device index, and writes the chosen token into the next position with a
mask. The position is a device tensor, so every step is the same graph: a whole generation
compiles the encoder's graph and one step graph per source length, however many tokens.

A decoder prompt (Whisper's `<|startoftranscript|><|en|><|transcribe|><|notimestamps|>`)
is written into the decoder inputs before the first step, and the first step starts after
it: the same graphs, fewer steps.

Without a key/value cache each step recomputes the decoder over the whole target length;
for the short targets of fine-tuning evaluation that costs less than the compiles it avoids.

`predict` may pass `GenerationOptions`: a step then draws its token on the device as a causal
LM's does (`worker/sampling.py`: temperature, top_k, top_p, min_p, seeded), and every
`check_every` steps one small transfer asks whether every row has ended, so a batch of short
targets stops early, in the same graphs. Evaluation passes none: greedy, every step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..generation_options import GenerationOptions


def decoder_start_id(config: Any) -> int:
    """The token the decoder starts from: the config's `decoder_start_token_id` (T5: the
    padding token; BART: `</s>`), else the padding token."""
    for name in ("decoder_start_token_id", "pad_token_id"):
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    raise ValueError("the model config has neither decoder_start_token_id nor pad_token_id.")


def greedy_state(model: Any, encoder_hidden: Any, target_length: int,
                 prompt: list[int] | None = None) -> dict[str, Any]:
    """The generation state before the first step, on the device of `encoder_hidden`:
    decoder inputs (the prompt, by default the start token alone, then padding), the output
    buffer (the prompt after its first token: as the labels hold it), which rows are done,
    and the current position (a device scalar: the prompt's last token)."""
    import torch

    config = model.config
    pad = int(config.pad_token_id)
    prompt = list(prompt) if prompt else [decoder_start_id(config)]
    batch, device = encoder_hidden.shape[0], encoder_hidden.device
    ids = torch.full((batch, target_length), pad, dtype=torch.long, device=device)
    ids[:, :len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=device)
    out = torch.full_like(ids, pad)
    if len(prompt) > 1:
        out[:, :len(prompt) - 1] = torch.tensor(prompt[1:], dtype=torch.long, device=device)
    return {"ids": ids, "out": out,
            "done": torch.zeros(batch, dtype=torch.bool, device=device),
            "step": torch.full((1,), len(prompt) - 1, dtype=torch.long, device=device)}


def draw_keys(input_ids: Any, attention_mask: Any, seed: int) -> dict[str, Any]:
    """What a sampling step reads besides the state: the seed (`[1]` int32) and each row's
    key, from its source tokens (the same source draws alike in any batch) and its place."""
    import torch

    device = input_ids.device
    places = torch.arange(1, input_ids.shape[1] + 1, device=device)[None, :]
    content = (input_ids.long() * attention_mask.long() * places).sum(-1) % (2**31 - 1)
    keys = (content * 31 + torch.arange(input_ids.shape[0], device=device)) % (2**31 - 1)
    return {"seed": torch.tensor([seed & 0x7FFFFFFF], dtype=torch.int32, device=device),
            "keys": keys.int()}


def greedy_step(model: Any, encoder_hidden: Any, attention_mask: Any,
                state: dict[str, Any], options: GenerationOptions | None = None,
                draw: dict[str, Any] | None = None) -> dict[str, Any]:
    """One decoding step: the next token of every row at position `state["step"]` (the most
    likely, or drawn with `options` and `draw`'s seed and keys); rows that produced the
    end-of-text token go on with padding."""
    import torch
    from transformers.modeling_outputs import BaseModelOutput

    config = model.config
    pad, eos = int(config.pad_token_id), config.eos_token_id
    ids, out, done, step = state["ids"], state["out"], state["done"], state["step"]
    logits = model(encoder_outputs=BaseModelOutput(last_hidden_state=encoder_hidden),
                   attention_mask=attention_mask, decoder_input_ids=ids,
                   use_cache=False).logits
    # The position is data (index_select), not a Python int: every step is the same graph.
    scores = logits.index_select(1, step).squeeze(1)
    if options is not None and draw is not None:
        from ..worker.sampling import next_tokens

        token = next_tokens(scores, options, None, draw["seed"], draw["keys"],
                            step.int()).squeeze(1)
    else:
        token = scores.argmax(-1)
    token = torch.where(done, torch.full_like(token, pad), token)
    positions = torch.arange(ids.shape[1], device=ids.device)[None, :]
    out = torch.where(positions == step, token[:, None], out)
    ids = torch.where(positions == step + 1, token[:, None], ids)
    if eos is not None:
        done = done | (token == int(eos))
    return {"ids": ids, "out": out, "done": done, "step": step + 1}


def greedy_generate(model: Any, input_ids: Any, attention_mask: Any, target_length: int,
                    sync: Callable[[dict[str, Any]], None] | None = None,
                    encoder_hidden: Any = None, prompt: list[int] | None = None,
                    options: GenerationOptions | None = None,
                    fetch: Callable[[list], list] | None = None) -> Any:
    """Greedy decoding of `target_length` tokens for a batch of padded sources.

    Args:
        model: a `...ForConditionalGeneration` (T5, BART, ...) in eval mode.
        input_ids, attention_mask: `[batch, source length]` on the model's device (Whisper:
            the features `[batch, mel bins, frames]`, and no mask).
        target_length: tokens generated per row (the loop always runs this many steps).
        sync: called with the state after the encoder and after every step (on XLA: mark
            what must be fetched, then `torch_xla.sync()`), so each step is one graph.
        encoder_hidden: the encoder's output when already computed (by the loss forward).
        prompt: the decoder's first tokens (None: the config's decoder start token); the
            loop runs `target_length - len(prompt) + 1` steps.
        options: `predict`'s generation options (sampling, `check_every`); None: greedy,
            every step (evaluation).
        fetch: copies device tensors to the host in one transfer (the early-stop checks).

    Returns:
        `[batch, target_length]` token ids: the prompt after its first token, then what each
        row generated, padding after its end-of-text token.
    """
    import torch

    with torch.no_grad():
        if encoder_hidden is None:
            # Positional: token ids for T5 and BART, log-mel features for Whisper.
            encoder_hidden = model.get_encoder()(
                input_ids, attention_mask=attention_mask).last_hidden_state
        state = greedy_state(model, encoder_hidden, target_length, prompt)
        draw = (draw_keys(input_ids, attention_mask, options.seed)
                if options is not None and options.do_sample else None)
        if draw is not None:
            state.update(draw)  # synced with the state: device data for every step
        if sync is not None:
            sync(state)
        for index in range(target_length - max(len(prompt or ()), 1) + 1):
            if (options is not None and fetch is not None and index
                    and index % options.check_every == 0 and bool(fetch([state["done"]])[0].all())):
                break  # every row has ended: the rest would be padding
            step = greedy_step(model, encoder_hidden, attention_mask, state, options,
                               {"seed": state["seed"], "keys": state["keys"]} if draw else None)
            state = {**state, **step}
            if sync is not None:
                sync(state)
    return state["out"]


def generated_texts(tokenizer: Any, tokens: Any, strip: bool = True) -> list[str]:
    """Decoded rows, cut at the end-of-text token, special tokens left out (and the spaces
    around each text, unless `strip` is False: Whisper's pipeline keeps them)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    texts = []
    for row in tokens.tolist():
        if eos is not None and eos in row:
            row = row[:row.index(eos)]
        text = tokenizer.decode(row, skip_special_tokens=True)
        texts.append(text.strip() if strip else text)
    return texts
