"""`fine_tune(task="seq2seq")`: summarization and translation with encoder-decoder models
(T5, BART, Marian, Pegasus, ...).

```python
result = hx.fine_tune("t5-small", xsum, task="seq2seq", source_prefix="summarize: ")
result = hx.fine_tune(folder, wmt16, task="seq2seq", source_lang="en", target_lang="ro")
result.metrics   # eval_loss, eval_rouge1.. (summaries) or eval_bleu (translations)
```

Kernel side: source and target texts read (XSum-style columns or WMT's `translation` dicts),
checked, and tokenized into int32 rows `[input_ids (L) | attention_mask (L) | labels (T)]`:
the source padded to its length bucket L, the target to one length T for the whole run, -100
on the target's padding. Every refusal is a `DataError` saying what to change.

Worker side: teacher-forced training (the model shifts the labels right into its decoder
inputs). Evaluation computes the loss and generates greedily at fixed shapes.
`model.generate()` on XLA would grow the decoder input by one token per step: a new graph
every token. Here the encoder runs once, then each step runs the decoder over the whole target
length, reads the logits at the current position through a device index and writes the chosen
token with a mask. The position is a device tensor, so a whole generation compiles the
encoder's graph and one step graph per source length, however many tokens. A decoder prompt
(Whisper's) is written before the first step. `predict` may pass `GenerationOptions`: a step
then draws its token on the device as a causal LM's does, and every `check_every` steps one
small transfer asks whether every row has ended.

The texts are scored on the host: ROUGE with Google's `rouge-score` package (rouge1, rouge2,
rougeL, rougeLsum F-measures with Porter stemming, the mean over rows times 100), and BLEU
with `sacrebleu.corpus_bleu`'s defaults, as Hugging Face's notebooks report them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import _xla
from ..._words import plural
from .. import batching, data, preparation
from ..batching import Bucket, EncodedData, EncodedSplit
from ..config import (
    SAMPLING_OPTIONS,
    FineTuneConfig,
    FineTuneError,
    GenerationError,
    GenerationOptions,
    resolve_options,
)
from ..data import DataError
from ..preparation import Prepared
from . import register_task
from .base import MaxLength, Task

if TYPE_CHECKING:
    import torch

    from ..batching import EncodedData
    from ..predict import PredictContext
    from ..preparation import Splits, TaskContext
    from ..worker.context import Batch, WorkerContext
    from ..worker.generation import StepGraph


# -- the kernel side: source and target texts, at fixed shapes --

IGNORE = -100
#: Source/target column pairs of well-known datasets, tried in order when none is named.
KNOWN_COLUMNS = (
    ("document", "summary"),      # xsum
    ("article", "highlights"),    # cnn_dailymail
    ("dialogue", "summary"),      # samsum
    ("source", "target"),
    ("input", "output"),
    ("text", "summary"),
    ("text", "target"),
)
TRANSLATION_COLUMN = "translation"


@dataclass
class Seq2SeqColumns:
    """Where the texts are: `source_column`/`target_column`, or a language pair of the
    `translation` column; `prefix` goes in front of every source ("summarize: ")."""

    source_column: str | None = None
    target_column: str | None = None
    source_lang: str | None = None
    target_lang: str | None = None
    prefix: str | None = None

    @property
    def translation(self) -> bool:
        return self.source_lang is not None or self.target_lang is not None


@dataclass
class Seq2SeqData(EncodedData):
    """`EncodedData` with the target length every row is padded to."""

    target_length: int = 0
    text_metrics: tuple[str, ...] = ()
    described: str = ""
    options: GenerationOptions | None = None  # predict's sampling and early stop, if asked


@dataclass
class Pairs:
    """One split's source and target texts (the prefix already in front of each source)."""

    sources: list[str]
    targets: list[str]
    notes: list[str] = field(default_factory=list)


def read_pairs(named: Mapping[str, Any],
               columns: Seq2SeqColumns) -> tuple[dict[str, Pairs], str]:
    """The texts of the training split and the evaluation split (if any), checked.

    Args:
        named: split name -> `datasets.Dataset`, training first (`Splits.named`).
        columns: where the texts are.

    Returns:
        `({split: Pairs}, what)`: train first, and a short description of the columns used
        ("document -> summary", "translation en -> fr").
    """
    if columns.translation and (columns.source_lang is None or columns.target_lang is None):
        raise DataError(
            "source_lang and target_lang go together: pass both, e.g. source_lang='en', "
            "target_lang='fr', for a 'translation' column of {'en': ..., 'fr': ...} dicts."
        )
    if columns.translation and (columns.source_column or columns.target_column):
        raise DataError(
            "pass either source_lang/target_lang (a 'translation' column of dicts, as WMT's "
            "datasets have) or source_column/target_column (two text columns), not both."
        )
    source, target = _column_names(named["train"], columns)
    result = {}
    for split, ds in named.items():
        if columns.translation:
            sources, targets = _translation(ds, split, columns.source_lang, columns.target_lang)
        else:
            _require_columns(ds, split, [source, target])
            sources = data.check_texts(data.column_values(ds, source), source, split)
            targets = data.check_texts(data.column_values(ds, target), target, split)
        prefix = columns.prefix or ""
        result[split] = Pairs([prefix + text for text in sources], list(targets))
    what = (f"{TRANSLATION_COLUMN} {columns.source_lang} -> {columns.target_lang}"
            if columns.translation else f"{source} -> {target}")
    return result, what


def _column_names(ds: Any, columns: Seq2SeqColumns) -> tuple[str | None, str | None]:
    if columns.translation:
        return None, None
    present = list(ds.column_names)
    if (columns.source_column is None) != (columns.target_column is None):
        given = "source_column" if columns.source_column else "target_column"
        other = "target_column" if columns.source_column else "source_column"
        raise DataError(f"{given}= needs {other}= too (the data has the columns "
                        f"{', '.join(map(repr, present))}).")
    if columns.source_column is not None:
        return columns.source_column, columns.target_column
    for source, target in KNOWN_COLUMNS:
        if source in present and target in present:
            return source, target
    if TRANSLATION_COLUMN in present:
        languages = _languages(ds)
        raise DataError(
            f"the data has a {TRANSLATION_COLUMN!r} column (languages: "
            f"{', '.join(map(repr, languages)) or 'unknown'}): pass source_lang= and "
            "target_lang= to say which way to translate."
        )
    raise DataError(
        f"task='seq2seq' needs a source and a target text column, and the train data has "
        f"{', '.join(map(repr, present)) or 'no columns'}. Pass source_column=... and "
        "target_column=... (XSum: 'document' and 'summary'), or source_lang=... and "
        f"target_lang=... for a {TRANSLATION_COLUMN!r} column of dicts (WMT)."
    )


def _require_columns(ds: Any, split: str, needed: list[str | None]) -> None:
    present = list(ds.column_names)
    missing = [name for name in needed if name not in present]
    if missing:
        raise DataError(
            f"the {split} data has no column {' and no column '.join(map(repr, missing))}: "
            f"task='seq2seq' needs the columns {', '.join(map(repr, needed))}, and it has "
            f"{', '.join(map(repr, present)) or 'none'}. Pass source_column=... and "
            "target_column=... with the names of yours."
        )


def _languages(ds: Any) -> list[str]:
    """The languages of a `translation` column: its feature's, else those of the first rows."""
    feature = ds.features.get(TRANSLATION_COLUMN) if hasattr(ds, "features") else None
    languages = getattr(feature, "languages", None)
    if languages:
        return list(languages)
    seen: dict[str, None] = {}
    for value in ds.select(range(min(len(ds), 100)))[TRANSLATION_COLUMN]:
        if isinstance(value, Mapping):
            seen.update(dict.fromkeys(k for k, v in value.items() if v is not None))
    return sorted(seen)


def _translation(ds: Any, split: str, source_lang: str, target_lang: str):
    _require_columns(ds, split, [TRANSLATION_COLUMN])
    values = data.column_values(ds, TRANSLATION_COLUMN)
    languages = _languages(ds)
    sources, targets, missing = [], [], []
    for row, value in enumerate(values):
        if not isinstance(value, Mapping):
            raise DataError(
                f"row {row} of column {TRANSLATION_COLUMN!r} ({split}) holds a "
                f"{type(value).__name__}, not a dict of texts by language such as "
                f"{{{source_lang!r}: '...', {target_lang!r}: '...'}}."
            )
        pair = (value.get(source_lang), value.get(target_lang))
        if pair[0] is None or pair[1] is None:
            missing.append(row)
            continue
        sources.append(pair[0])
        targets.append(pair[1])
    if missing:
        absent = [lang for lang in (source_lang, target_lang) if lang not in languages]
        which = (f"has no {' and no '.join(map(repr, absent))}" if absent
                 else f"lacks {source_lang!r} or {target_lang!r} in {plural(len(missing), 'row')}"
                      f" (the first: row {missing[0]})")
        raise DataError(
            f"the {TRANSLATION_COLUMN!r} column ({split}) {which}: its languages are "
            f"{', '.join(map(repr, languages)) or 'none'}. Pass source_lang= and target_lang= "
            "from those."
        )
    data.check_texts(sources, f"{TRANSLATION_COLUMN}.{source_lang}", split)
    data.check_texts(targets, f"{TRANSLATION_COLUMN}.{target_lang}", split)
    return sources, targets


# ---------------------------------------------------------------------------------------------
# Tokens
# ---------------------------------------------------------------------------------------------


def tokenize_targets(tokenizer: Any, targets: list[str]) -> list[list[int]]:
    """Target token ids with the tokenizer's end-of-text token (its target side when it has
    one, as Marian's tokenizers do)."""
    return [list(ids) for ids in tokenizer(text_target=targets)["input_ids"]]


def target_length(splits: Mapping[str, list[list[int]]], requested: int | None,
                  limit: int | None) -> int:
    """The one length every target is padded to: `requested`, or the longest target rounded
    up to a multiple of 8. Refused when targets would be cut."""
    longest = max(len(ids) for rows in splits.values() for ids in rows)
    if requested is None:
        if limit is not None and longest > limit:
            raise DataError(
                f"the longest target has {longest} tokens, beyond the {limit} positions the "
                "model's decoder has; shorten the targets (or use a model with more positions)."
            )
        length = batching.round_up(longest)
        return min(length, limit) if limit is not None else length
    if limit is not None and requested > limit:
        raise DataError(f"max_target_length={requested} is beyond the {limit} positions the "
                        f"model's decoder has; pass max_target_length<={limit}.")
    for split, rows in splits.items():
        cut = sum(len(ids) > requested for ids in rows)
        if cut:
            raise DataError(
                f"{cut} of {plural(len(rows), f'{split} target')} are longer than "
                f"max_target_length={requested} tokens and would be cut (the longest has "
                f"{longest}, end-of-text token included). Pass max_target_length="
                f"{batching.round_up(longest)}, or shorten or drop those rows first."
            )
    return int(requested)


def encode_split(name: str, sources: dict, targets: list[list[int]], buckets: list[int],
                 length: int, pad_id: int, truncated: int) -> EncodedSplit:
    """Rows `[input_ids | attention_mask | labels]`, each source in the smallest bucket that
    holds it (longer ones cut and counted), the labels padded to `length` with -100."""
    ids = sources["input_ids"]
    lengths = np.fromiter((len(row) for row in ids), np.int64, len(ids))
    edges = np.asarray(sorted(buckets))
    truncated = int(truncated) + int((lengths > edges[-1]).sum())
    slots = np.searchsorted(edges, np.minimum(lengths, edges[-1]), side="left")
    result = []
    for slot, width in enumerate(edges):
        rows = np.flatnonzero(slots == slot)
        if len(rows) == 0:
            continue
        width = int(width)
        inputs = np.zeros((len(rows), 2 * width + length), dtype=np.int32)
        inputs[:, :width] = pad_id
        inputs[:, 2 * width:] = IGNORE
        for i, row in enumerate(rows):
            source = ids[row][:width]
            inputs[i, :len(source)] = source
            inputs[i, width:width + len(source)] = 1
            target = targets[row]
            inputs[i, 2 * width:2 * width + len(target)] = target
        result.append(Bucket(width, inputs, np.zeros(len(rows), dtype=np.int64), rows))
    return EncodedSplit(name, result, len(ids), truncated)


def label_block(bucket: Bucket, target_length: int) -> np.ndarray:
    """A bucket's labels `[rows, target_length]` (-100 on padding)."""
    return bucket.inputs[:, 2 * bucket.length:2 * bucket.length + target_length]


# -- greedy generation at fixed shapes --

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
        from ..worker.generation import next_tokens

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
                    fetch: Callable[[list], list] | None = None,
                    capture: Callable[[dict, dict, dict], StepGraph | None] | None = None
                    ) -> Any:
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
        capture: called with the state, the first step traced (not run) and
            `_xla.fallback_counts()` from before its trace: returns the step's compiled graph
            (`StepGraph`: it runs the later steps, unless its first run resharded the state
            or its constants made on the host are not proven the same at a second trace:
            `StepProof`), or None (every step traced and synced).

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
        graph: StepGraph | None = None
        if capture is not None:
            from ..worker.generation import StepProof

            proof = StepProof()
        for index in range(target_length - max(len(prompt or ()), 1) + 1):
            if (options is not None and fetch is not None and index
                    and index % options.check_every == 0 and bool(fetch([state["done"]])[0].all())):
                break  # every row has ended: the rest would be padding
            if graph is not None:
                state = graph.run(state)
                continue
            fallbacks = _xla.fallback_counts() if capture is not None else {}
            step = greedy_step(model, encoder_hidden, attention_mask, state, options,
                               {"seed": state["seed"], "keys": state["keys"]} if draw else None)
            if capture is not None:
                graph = capture(state, step, fallbacks)
                if graph is not None:
                    graph, decided = proof.check(graph)
                    if decided is not None:  # else the next step is captured again
                        capture = None
                    del step  # never run: the compiled graph runs instead
                    state = graph.run(state)
                    if not graph.kept_shardings or not decided:  # later steps are traced
                        graph = None
                    continue
                capture = None
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


# -- ROUGE and BLEU, on the host --

#: The text metrics a seq2seq run can report.
TEXT_METRICS = ("rouge", "bleu")
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def rouge(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """`{"rouge1": ..., "rouge2": ..., "rougeL": ..., "rougeLsum": ...}`: mean F-measures x 100."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for prediction, reference in zip(predictions, references, strict=True):
        scores = scorer.score(reference, prediction)
        for name in ROUGE_TYPES:
            totals[name] += scores[name].fmeasure
    count = max(len(predictions), 1)
    return {name: 100.0 * total / count for name, total in totals.items()}


def bleu(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU (0-100) with one reference per row."""
    import sacrebleu

    return float(sacrebleu.corpus_bleu(list(predictions), [list(references)]).score)


def text_metrics(names: Sequence[str], predictions: Sequence[str],
                 references: Sequence[str]) -> dict[str, float]:
    """`eval_<name>` for each of `names` ("rouge" gives its four F-measures, "bleu" one)."""
    values: dict[str, float] = {}
    for name in names:
        if name == "rouge":
            values.update({f"eval_{key}": value
                           for key, value in rouge(predictions, references).items()})
        elif name == "bleu":
            values["eval_bleu"] = bleu(predictions, references)
        else:
            raise ValueError(f"unknown text metric {name!r}: use one of {TEXT_METRICS}.")
    return values


def metrics_missing(names: Sequence[str]) -> str | None:
    """What to install when a package of `names` is missing (checked in the kernel, before
    anything is forked), or None."""
    import importlib.util

    packages = {"rouge": ("rouge_score", "rouge-score"), "bleu": ("sacrebleu", "sacrebleu")}
    missing = [pip for name, (module, pip) in packages.items()
               if name in names and importlib.util.find_spec(module) is None]
    if not missing:
        return None
    return (f"the {' and '.join(names)} metric needs {', '.join(missing)}: pip install "
            f"{' '.join(missing)} (or pip install 'hfxla_nb[tasks]').")


# -- Seq2Seq: the task's hooks --

#: The config attribute (saved with the model) that keeps the prefix and target length.
SETTINGS_KEY = "hfxla_nb_seq2seq"
#: Tokens generated by `predict` for a model that does not say its target length.
DEFAULT_PREDICT_LENGTH = 32
#: Model class name endings of encoder-decoder language models.
HEAD_SUFFIXES = ("ForConditionalGeneration", "MTModel")
DEFAULT_METRICS = ("accuracy",)  # FineTuneConfig's default: "pick for the task" here


def check_model(model_config: Any, names: list[str]) -> None:
    """Refuse a decoder-only (or encoder-only) model for task="seq2seq"."""
    if getattr(model_config, "is_encoder_decoder", False):
        return
    what = names[0] if names else getattr(model_config, "model_type", "this model")
    raise FineTuneError(
        f"task='seq2seq' needs an encoder-decoder model (T5, BART, Marian, Pegasus, ...), and "
        f"{what} is not one (its config has no is_encoder_decoder). For a decoder-only "
        "model use task='causal-lm' with prompt_column= and response_column=; for "
        "summarization or translation pass e.g. a T5 or BART model."
    )


def columns_of(config: FineTuneConfig) -> Seq2SeqColumns:
    """The source/target columns, language pair and prefix a `FineTuneConfig` asks for."""
    return Seq2SeqColumns(
        source_column=config.source_column, target_column=config.target_column,
        source_lang=config.source_lang, target_lang=config.target_lang,
        prefix=config.source_prefix,
    )


def metric_names(config: Any, translation: bool) -> tuple[str, ...]:
    """The text metrics to report: those asked for, else BLEU for translation, ROUGE else."""
    asked = tuple(config.metrics)
    if asked == DEFAULT_METRICS:
        return ("bleu",) if translation else ("rouge",)
    wrong = [m for m in asked if callable(m) or m not in TEXT_METRICS]
    if wrong:
        raise FineTuneError(
            f"task='seq2seq' reports {' and '.join(map(repr, TEXT_METRICS))} (and the loss); "
            f"metrics={asked!r} has {', '.join(map(repr, wrong))}. Pass metrics=('rouge',), "
            "('bleu',) or both."
        )
    return asked


class Seq2Seq(Task):
    """Sequence to sequence: teacher-forced cross-entropy; evaluation by loss and by greedy
    generation on the device, scored with ROUGE or BLEU on the host."""

    name = "seq2seq"

    def eval_metric_names(self, config: FineTuneConfig) -> tuple[str, ...] | None:
        """The loss, the generated words, and ROUGE's four scores and BLEU as asked for."""
        asked = [m for m in config.metrics if m in TEXT_METRICS] or list(TEXT_METRICS)
        names = ["loss", "gen_words"]
        for metric in asked:
            names += ["rouge1", "rouge2", "rougeL", "rougeLsum"] if metric == "rouge" else [metric]
        return tuple(names)
    auto_class = "AutoModelForSeq2SeqLM"
    head_suffixes = HEAD_SUFFIXES
    outputs_per_batch = 3
    predict_rows_per_device = 8  # a key/value cache per row grows with the new tokens
    title = "sequence to sequence"
    generation_options = SAMPLING_OPTIONS

    # -- kernel side ---------------------------------------------------------------------------

    def check_model(self, model_config: Any, names: list[str]) -> None:
        """Refuse a decoder-only (or encoder-only) model."""
        check_model(model_config, names)

    def prepare(self, splits: Splits, config: FineTuneConfig,
                context: TaskContext) -> Prepared:
        """Sources and targets read and encoded (`encode`); the prefix
        and target length kept in the saved model's config."""
        columns = columns_of(config)
        metrics = metric_names(config, columns.translation)
        missing = metrics_missing(metrics)
        if missing:
            raise FineTuneError(missing)
        encoded = encode(splits, config, context, columns, metrics)
        return Prepared(encoded, _saved_settings(context, columns, encoded))

    def prepare_predict(self, inputs: list[Any], context: PredictContext,
                        max_length: int | None) -> EncodedData:
        """Source texts, with the prefix and target length the model was fine-tuned with
        (kept in its config by `fine_tune`), tokenized and bucketed like evaluation rows."""
        wrong = next((i for i, value in enumerate(inputs) if not isinstance(value, str)), None)
        if wrong is not None:
            raise FineTuneError(f"input {wrong} is a {type(inputs[wrong]).__name__}; seq2seq "
                                "predicts on source texts (str).")
        settings = getattr(context.model_config, SETTINGS_KEY, None) or {}
        tokenizer = context.tokenizer
        prefix = settings.get("prefix") or ""
        length = int(settings.get("max_target_length") or DEFAULT_PREDICT_LENGTH)
        cap = preparation.length_cap(MaxLength(max_length), context.model_config, tokenizer)
        sources, cut = batching.tokenize(tokenizer, [prefix + text for text in inputs], None,
                                         cap)
        lengths = [len(ids) for ids in sources["input_ids"]]
        buckets = [max_length] if max_length else batching.choose_buckets(lengths, cap)
        split = encode_split("predict", sources, [[]] * len(inputs), buckets,
                                          length, int(tokenizer.pad_token_id), cut)
        return Seq2SeqData(train=None, eval=split, input_names=["input_ids", "attention_mask"],
                           bucket_lengths=list(map(int, buckets)), label_names=[], notes=[],
                           host=tokenizer, target_length=length,
                           options=_predict_options(context, tokenizer, length))

    # -- worker side ---------------------------------------------------------------------------

    def _parts(self, ctx: WorkerContext, batch: Batch):
        width = ctx.plan.data.target_length
        x, length = batch.tokens, batch.length  # [input_ids | attention_mask | labels]
        labels = x[:, 2 * length:2 * length + width].long()
        return x[:, :length], x[:, length:2 * length], labels

    def _forward(self, ctx: WorkerContext, batch: Batch, labels: bool = True):
        input_ids, mask, targets = self._parts(ctx, batch)
        with ctx.autocast():
            # The model makes the decoder inputs from the labels (shifted right, -100 turned
            # into padding, its decoder start token first), as in Hugging Face's notebooks.
            output = ctx.model(input_ids=input_ids, attention_mask=mask, labels=targets,
                               use_cache=False)
        return output, input_ids, mask, targets

    def train_loss(self, ctx: WorkerContext, batch: Batch) -> torch.Tensor:
        return self._forward(ctx, batch)[0].loss.float()

    def eval_outputs(self, ctx: WorkerContext, batch: Batch) -> list[torch.Tensor]:
        import torch

        output, input_ids, mask, targets = self._forward(ctx, batch)
        logits = output.logits.float()
        losses = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
            reduction="none").view(targets.shape)
        weights = (targets != -100).float() * batch.weights.float()[:, None]
        sums, counts = (losses * weights).sum(-1), weights.sum(-1)

        tokens = generate_synced(ctx, [sums, counts], input_ids, mask,
                                 ctx.plan.data.target_length, output.encoder_last_hidden_state,
                                 options=ctx.plan.data.options)
        return [sums, counts, tokens]

    def eval_metrics(self, ctx: WorkerContext, batches: list, fetched: list) -> dict[str, float]:
        data = ctx.plan.data
        predictions = [item["generated_text"] for item in self.decode(data, batches, fetched)]
        total = tokens = 0.0
        for (_, _, real), (sums, counts, _) in self.per_batch(batches, fetched):
            total += float(sums.double().numpy()[:real].sum())
            tokens += float(counts.double().numpy()[:real].sum())
        values = {"eval_loss": total / max(tokens, 1.0)}
        values.update(text_metrics(data.text_metrics, predictions, references(data)))
        lengths = [len(text.split()) for text in predictions]
        values["eval_gen_words"] = float(np.mean(lengths)) if lengths else 0.0
        values["eval_rows"] = float(data.eval.num_rows)
        return values

    def decode(self, data: Seq2SeqData, batches: list,
               fetched: list) -> list[dict[str, str]]:
        """`{"generated_text": ...}` for every row of `data.eval`, in its order."""
        split = data.eval
        texts = [""] * split.num_rows
        for (bucket_index, positions, real), (_, _, tokens) in self.per_batch(batches, fetched):
            rows = split.buckets[bucket_index].rows[positions[:real]]
            for row, text in zip(rows, generated_texts(data.host, tokens[:real]), strict=True):
                texts[row] = text
        return [{"generated_text": text} for text in texts]


def generate_synced(ctx: WorkerContext, first: list[Any], input_ids: Any, mask: Any,
                    target_length: int, encoder_hidden: Any,
                    prompt: list[int] | None = None,
                    options: GenerationOptions | None = None) -> Any:
    """`greedy_generate` in evaluation's worker: the encoder and the batch's outputs
    (`first`) one graph, then each step one graph, traced once and run by its compiled graph
    (`generation.StepGraph`), or where it cannot be, traced and synced; the state and `first`
    replicated over the mesh under SPMD."""

    def sync(state: dict[str, Any]) -> None:
        # Replicated inside each graph: fetching sharded results would compile a gather per
        # tensor, and the first step then sees the same input shardings as every later one
        # (one step graph, not two).
        ctx.replicate([*first, *state.values()])
        first.clear()
        _xla.sync()

    def capture(state: dict[str, Any], step: dict[str, Any],
                fallbacks: dict[str, int]) -> StepGraph | None:
        from ..worker.generation import StepGraph

        ctx.replicate(list(step.values()))  # as `sync` replicates them
        return StepGraph.capture(ctx.model, state, step, [], [], fallbacks)

    with ctx.autocast():
        return greedy_generate(ctx.model, input_ids, mask, target_length, sync=sync,
                               encoder_hidden=encoder_hidden, prompt=prompt, options=options,
                               fetch=_xla.to_cpu,
                               capture=capture if ctx.plan.capture_steps else None)


def references(data: Seq2SeqData) -> list[str]:
    """The target of every row of `data.eval`: its label tokens decoded by the same rules as
    the generated tokens (as Hugging Face's notebooks decode their labels)."""
    import torch

    tokenizer, split = data.host, data.eval
    pad = tokenizer.pad_token_id
    texts = [""] * split.num_rows
    for bucket in split.buckets:
        labels = label_block(bucket, data.target_length)
        ids = torch.from_numpy(np.where(labels == IGNORE, pad, labels))
        for row, text in zip(bucket.rows, generated_texts(tokenizer, ids), strict=True):
            texts[row] = text
    return texts


def encode(splits: Splits, config: FineTuneConfig, context: TaskContext,
           columns: Seq2SeqColumns, metrics: tuple[str, ...]) -> Seq2SeqData:
    """Read, check and tokenize every split into fixed-shape rows."""
    tokenizer, model_config = context.tokenizer, context.model_config
    try:
        pairs, described = read_pairs(splits.named, columns)
        targets = {split: tokenize_targets(tokenizer, p.targets)
                   for split, p in pairs.items()}
        length = target_length(
            targets, getattr(config, "max_target_length", None), _decoder_positions(model_config))
    except data.DataError as error:
        raise FineTuneError(str(error)) from None
    cap = preparation.length_cap(config, model_config, tokenizer)
    sources, truncated = {}, {}
    for split, p in pairs.items():
        sources[split], truncated[split] = batching.tokenize(tokenizer, p.sources, None, cap)
    buckets = batching.split_buckets(sources, cap, config.max_length, config.rows_per_step)
    pad = tokenizer.pad_token_id
    if pad is None:
        raise FineTuneError("the tokenizer has no padding token; set one (tokenizer.pad_token "
                            "= ...) or pass another tokenizer.")
    eval_name = splits.eval_name
    encoded = {split: encode_split(split, sources[split], targets[split], buckets,
                                                length, int(pad), truncated[split])
               for split in pairs}
    notes = [f"seq2seq: {described}; sources padded to {', '.join(map(str, buckets))} tokens, "
             f"targets to {length}; evaluation generates {length} tokens greedily and reports "
             f"{' and '.join(metrics)}"]
    return Seq2SeqData(
        train=encoded["train"], eval=encoded[eval_name] if eval_name is not None else None,
        input_names=["input_ids", "attention_mask"], bucket_lengths=list(map(int, buckets)),
        label_names=[], notes=notes, host=tokenizer, target_length=length,
        text_metrics=tuple(metrics), described=described)


def _saved_settings(context: TaskContext, columns: Seq2SeqColumns,
                    encoded: Seq2SeqData) -> dict[str, Any]:
    """`from_pretrained` arguments that keep the prefix and target length in the saved
    model's config, so that `predict` generates as evaluation did (a model instance keeps
    its own config)."""
    if not isinstance(context.source, str):
        return {}
    config = copy.deepcopy(context.model_config)
    setattr(config, SETTINGS_KEY, {"prefix": columns.prefix or "",
                                   "max_target_length": encoded.target_length,
                                   "columns": encoded.described})
    return {"config": config}


def _decoder_positions(model_config: Any) -> int | None:
    """How many target positions the decoder embeds (None for relative positions, as T5)."""
    for name in ("max_target_positions", "max_position_embeddings"):
        value = getattr(model_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None



def _predict_options(context: Any, tokenizer: Any, length: int) -> GenerationOptions | None:
    """`predict`'s options (sampling, `check_every`), checked; None when none was given:
    greedy over the whole target length, as evaluation."""
    given = getattr(context, "generation", None) or {}
    config = getattr(context, "generation_config", None)
    if not given and config is None:
        return None
    try:
        return resolve_options(tokenizer, config, length, **given)
    except GenerationError as error:
        raise FineTuneError(str(error)) from None


register_task(Seq2Seq())
