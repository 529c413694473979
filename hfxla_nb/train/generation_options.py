"""`GenerationOptions`: how `generate` and `predict` decode, decided and checked in the kernel.

The options mean what transformers' `GenerationConfig` means by them (greedy or sampling,
`temperature`, `top_k`, `top_p`, `min_p`, `repetition_penalty`, `num_return_sequences`,
`max_new_tokens`, `eos_token_id`, `stop_strings`). A `GenerationConfig` is taken as it is;
the model's own `generation_config.json` is the default, and keyword arguments override both.
Everything that cannot work is refused here, before any fork, saying what to change.

The prompts are also made here: plain texts get the beginning-of-text token, as training saw
them; chat `messages` go through the tokenizer's chat template with the assistant's turn
opened (`add_generation_prompt=True`). On the way back, `finished_text` cuts a row at its
first end-of-text token or stop string.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: New tokens per prompt when neither the caller nor the generation config says.
DEFAULT_NEW_TOKENS = 32
#: Decoding steps between two checks of whether every row has ended (one small transfer).
DEFAULT_CHECK_EVERY = 16
#: What `generate` accepts beyond `max_new_tokens` and `generation_config`.
OPTION_NAMES = ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                "num_return_sequences", "seed", "eos_token_id", "stop_strings", "check_every")
#: What seq2seq's `predict` takes: the draws and the early stop.
SAMPLING_OPTIONS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "seed",
                    "check_every")


class GenerationError(ValueError):
    """A generation option or prompt that cannot work (raised before any fork)."""


@dataclass(frozen=True)
class GenerationOptions:
    """One decoding's settings, plain data (forked into the worker with the plan).

    Attributes:
        max_new_tokens: at most this many tokens per row (fewer when every row ended).
        do_sample: False: the most likely token (greedy); True: a draw from the processed
            distribution.
        temperature, top_k, top_p, min_p: the sampling warpers, as transformers' (None: off).
        repetition_penalty: transformers' `RepetitionPenaltyLogitsProcessor` (None: off).
        num_return_sequences: answers per prompt (sampling only).
        seed: the draws' seed: the same seed gives the same tokens on the same hardware.
        eos_token_ids: the tokens that end a row.
        stop_strings: texts that end a row too (cut there), checked on the host.
        check_every: decoding steps between two checks of whether every row has ended.
    """

    max_new_tokens: int = DEFAULT_NEW_TOKENS
    do_sample: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    num_return_sequences: int = 1
    seed: int = 0
    eos_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    check_every: int = DEFAULT_CHECK_EVERY


def model_generation_config(model: Any) -> Any:
    """The model's own `GenerationConfig` (its folder's `generation_config.json`), or None."""
    from transformers import GenerationConfig

    if isinstance(model, (str, os.PathLike)) and (Path(model) / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(os.fspath(model))
    config = getattr(model, "generation_config", None)
    return config if isinstance(config, GenerationConfig) else None


def resolve_options(tokenizer: Any, generation_config: Any = None,
                    max_new_tokens: int | None = None, **overrides: Any) -> GenerationOptions:
    """The options of one call: `overrides` over `generation_config` over the defaults.

    Args:
        tokenizer: the model's tokenizer (its end-of-text token when the config names none).
        generation_config: a `transformers.GenerationConfig` (or None).
        max_new_tokens: tokens per row (default: the config's, else 32).
        overrides: any of `OPTION_NAMES`.

    Returns:
        The checked `GenerationOptions`.

    Raises:
        GenerationError: an unknown option or a value that cannot work, saying what to change.
    """
    unknown = sorted(set(overrides) - set(OPTION_NAMES))
    if unknown:
        raise GenerationError(f"generate() does not take {', '.join(unknown)}; it takes "
                              f"max_new_tokens, generation_config, {', '.join(OPTION_NAMES)}.")
    config = generation_config

    def pick(name: str, default: Any = None) -> Any:
        if overrides.get(name) is not None:
            return overrides[name]
        value = getattr(config, name, None) if config is not None else None
        return default if value is None else value

    new = max_new_tokens if max_new_tokens is not None else pick("max_new_tokens",
                                                                 DEFAULT_NEW_TOKENS)
    eos = pick("eos_token_id", tokenizer.eos_token_id)
    eos = () if eos is None else tuple(int(i) for i in ([eos] if isinstance(eos, int) else eos))
    stops = pick("stop_strings", ())
    seed = pick("seed")
    options = GenerationOptions(
        max_new_tokens=new, do_sample=bool(pick("do_sample", False)),
        temperature=pick("temperature"), top_k=pick("top_k"), top_p=pick("top_p"),
        min_p=pick("min_p"), repetition_penalty=pick("repetition_penalty"),
        num_return_sequences=pick("num_return_sequences", 1),
        seed=random.randrange(2**31) if seed is None else seed, eos_token_ids=eos,
        stop_strings=(stops,) if isinstance(stops, str) else tuple(stops),
        check_every=pick("check_every", DEFAULT_CHECK_EVERY))
    check_options(options)
    return options


def check_options(options: GenerationOptions) -> None:
    """Refuse options that cannot work, saying what to change.

    Raises:
        GenerationError: the first option that is wrong.
    """
    def whole(name: str, value: Any, least: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            what = "a positive integer" if least == 1 else f"an integer >= {least}"
            raise GenerationError(f"{name} must be {what}, got {value!r}.")

    whole("max_new_tokens", options.max_new_tokens, 1)
    whole("num_return_sequences", options.num_return_sequences, 1)
    whole("check_every", options.check_every, 1)
    whole("seed", options.seed, 0)
    if options.top_k is not None:
        whole("top_k", options.top_k, 0)
    if options.top_p is not None and not 0 < options.top_p <= 1:
        raise GenerationError(f"top_p must be in (0, 1], got {options.top_p!r}: pass "
                              "top_p=0.9 (the smallest set of tokens with 90% of the "
                              "probability), or top_p=1.0 to keep every token.")
    if options.min_p is not None and not 0 <= options.min_p <= 1:
        raise GenerationError(f"min_p must be in [0, 1], got {options.min_p!r}.")
    if options.do_sample and options.temperature is not None and options.temperature <= 0:
        raise GenerationError(f"temperature={options.temperature!r} with do_sample=True "
                              "cannot sample: pass a temperature > 0 (1.0 leaves the "
                              "distribution as it is), or do_sample=False for greedy decoding.")
    if options.repetition_penalty is not None and options.repetition_penalty <= 0:
        raise GenerationError("repetition_penalty must be > 0 (1.0: no penalty), got "
                              f"{options.repetition_penalty!r}.")
    if options.num_return_sequences > 1 and not options.do_sample:
        raise GenerationError(
            f"num_return_sequences={options.num_return_sequences} with greedy decoding gives "
            "the same answer every time: pass do_sample=True to draw different answers, or "
            "num_return_sequences=1.")
    if not all(isinstance(text, str) and text for text in options.stop_strings):
        raise GenerationError("stop_strings must be non-empty strings.")


def prompt_rows(tokenizer: Any, prompts: Any = None, messages: Any = None) -> list[list[int]]:
    """Each prompt's token ids: texts after the beginning-of-text token, conversations
    through the tokenizer's chat template with the assistant's turn opened.

    Raises:
        GenerationError: neither or both given, or messages without a chat template.
    """
    if (prompts is None) == (messages is None):
        raise GenerationError("pass prompts (texts) or messages (chat turns), one of them.")
    if messages is None and not isinstance(prompts, str) and (
            is_conversation(prompts) or any(map(is_conversation, prompts))):
        messages, prompts = prompts, None  # chats given as prompts: as predict takes them
    if messages is not None:
        return [list(tokenizer(text, add_special_tokens=False)["input_ids"])
                for text in chat_texts(tokenizer, messages)]
    texts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not texts or not all(isinstance(text, str) for text in texts):
        raise GenerationError("prompts must be a text or a non-empty list of texts.")
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return [bos + list(tokenizer(text, add_special_tokens=False)["input_ids"])
            for text in texts]


def is_conversation(value: Any) -> bool:
    """Whether `value` is one chat: a non-empty list of `{"role", "content"}` dicts."""
    return (isinstance(value, (list, tuple)) and bool(value)
            and all(isinstance(turn, dict) and "role" in turn and "content" in turn
                    for turn in value))


def chat_texts(tokenizer: Any, messages: Any) -> list[str]:
    """Each conversation rendered by the chat template, ending where the assistant speaks.

    Raises:
        GenerationError: not role/content dicts, or a tokenizer without a chat template.
    """
    chats = [messages] if is_conversation(messages) else list(messages or [])
    if not chats or not all(is_conversation(chat) for chat in chats):
        raise GenerationError('messages must be a list of {"role": ..., "content": ...} '
                              "dicts (one conversation), or a list of such lists.")
    if not getattr(tokenizer, "chat_template", None):
        raise GenerationError(
            "messages need a chat template, and this tokenizer has none: set "
            "tokenizer.chat_template to a Jinja template (and pass tokenizer=), save it with "
            "the model, or pass prompts as plain texts.")
    return [tokenizer.apply_chat_template(list(chat), add_generation_prompt=True,
                                          tokenize=False) for chat in chats]


def check_room(rows: list[list[int]], length: int, options: GenerationOptions,
               limit: int | None) -> None:
    """Refuse prompts that, padded to `length`, leave no room for the new tokens.

    Raises:
        GenerationError: naming the longest prompt and the model's positions.
    """
    if limit is not None and length + options.max_new_tokens > limit:
        raise GenerationError(
            f"the prompts ({max(map(len, rows))} tokens, {length} padded) and max_new_tokens="
            f"{options.max_new_tokens} need {length + options.max_new_tokens} positions; the "
            f"model has {limit}. Pass a smaller max_new_tokens, or shorter prompts.")


def finished_text(tokenizer: Any, row: list[int], options: GenerationOptions) -> str:
    """A row's new tokens as text: cut at its first end-of-text token, then at the first stop
    string (the stop string left out)."""
    ends = [row.index(token) for token in options.eos_token_ids if token in row]
    row = row[:min(ends)] if ends else row
    text = tokenizer.decode(row, skip_special_tokens=True)
    return cut_at_stop(text, options.stop_strings)[0]


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """`text` up to its first stop string, and whether one was found."""
    cuts = [text.index(stop) for stop in stops if stop in text]
    return (text[:min(cuts)], True) if cuts else (text, False)
