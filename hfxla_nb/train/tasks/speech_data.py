"""The kernel side of `fine_tune(task="speech-recognition")` for CTC models (wav2vec2, HuBERT,
WavLM `...ForCTC`): the processor (a CTC tokenizer and a feature extractor) loaded; the clips
read as audio classification reads them (`audio_classification`: mono, resampled, cut or padded to a
few durations, one bucket each); the transcripts read, checked against the tokenizer's
vocabulary and the frames each clip gives, and tokenized into labels padded with -100 to one
label length. Also `predict`'s clips, bucketed like evaluation rows.

A bucket holds the waveform as the float32 field `input_values`, an attention mask (when the
feature extractor makes one) as the int32 token input, and the label ids as its label
columns. Nothing is forked or written here; every refusal is a `FineTuneError` that says
what to do.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._words import plural
from .. import batching, data
from ..config import FineTuneConfig, FineTuneError
from ..preparation import Prepared, Splits, TaskContext
from . import audio_classification as audio_task

if TYPE_CHECKING:
    from ..predict import PredictContext

#: Transcript columns tried in order when `text_column=` names none (Common Voice: "sentence";
#: LibriSpeech: "text"; MINDS-14 and others: "transcription").
TRANSCRIPT_COLUMNS = ("text", "sentence", "transcription")
IGNORE = -100


@dataclass
class SpeechData(batching.EncodedData):
    """`EncodedData` with the label length of every bucket, the frames of each evaluation
    clip (its transcript is decoded from those frames only; None: every frame), and the
    metrics to report."""

    label_length: int = 1
    eval_frames: np.ndarray | None = None
    text_metrics: tuple[str, ...] = ("wer",)


def load_processor(given: Any, model: Any, source: Any) -> Any:
    """The processor: `given` (`tokenizer=`: a processor, a name or a folder), else the one
    saved with the model (`AutoProcessor`); refused without a tokenizer and a waveform
    feature extractor."""
    if given is not None and not isinstance(given, (str, os.PathLike)):
        processor = given
    else:
        where = given if given is not None else (
            source if isinstance(source, str) else getattr(model.config, "_name_or_path", None))
        if not where:
            raise FineTuneError(
                "the model instance does not say where its processor is: pass "
                "tokenizer=AutoProcessor.from_pretrained(...) (or its name or folder).")
        from transformers import AutoProcessor

        try:
            processor = AutoProcessor.from_pretrained(os.fspath(where))
        except Exception as error:  # noqa: BLE001 - say what to do, whatever failed
            processor = error
        if not hasattr(processor, "tokenizer") or not hasattr(processor, "feature_extractor"):
            found = (f"only a {type(processor).__name__}"
                     if not isinstance(processor, Exception)
                     else str(processor).splitlines()[0][:200])
            raise FineTuneError(
                f"could not load a processor (a tokenizer and a feature extractor) from "
                f"{os.fspath(where)!r} ({found}). Save one next to the model: "
                "Wav2Vec2Processor(feature_extractor=..., tokenizer=...).save_pretrained("
                "folder), or pass tokenizer=Wav2Vec2Processor.from_pretrained(...).") from None
    names = list(getattr(processor.feature_extractor, "model_input_names", None) or [])
    # Whisper's log-mel features: `whisper.check_processor` checks them against the model.
    if not names or names[0] not in (audio_task.WAVEFORM_INPUT, "input_features"):
        raise FineTuneError(
            f"the feature extractor ({type(processor.feature_extractor).__name__}) makes "
            f"{names or 'no inputs'}; task='speech-recognition' trains CTC models that take "
            f"the waveform ({audio_task.WAVEFORM_INPUT!r}: wav2vec2, HuBERT, WavLM "
            "...ForCTC) and Whisper (log-mel 'input_features'). Pass such a model and its "
            "processor.")
    return processor


def output_frames(model_config: Any, samples: Any) -> Any:
    """The frames the model's convolutional front end makes of `samples` (an int, an array
    or a tensor), as `...ForCTC` counts them; None when the config does not say."""
    kernels, strides = (getattr(model_config, name, None) for name in ("conv_kernel",
                                                                       "conv_stride"))
    if not kernels or not strides:
        return None
    for kernel, stride in zip(kernels, strides, strict=True):
        samples = (samples - kernel) // stride + 1
    if getattr(model_config, "add_adapter", False):
        for _ in range(int(model_config.num_adapter_layers)):
            samples = (samples - 1) // int(model_config.adapter_stride) + 1
    return samples


def transcript_column(ds: Any, config: FineTuneConfig) -> str:
    """`text_column=` when it names one, else the first of `TRANSCRIPT_COLUMNS` the data has;
    refused when it has none."""
    present = list(ds.column_names)
    if config.text_column != "text":
        return config.text_column
    found = next((name for name in TRANSCRIPT_COLUMNS if name in present), None)
    if found is None:
        raise FineTuneError(
            f"task='speech-recognition' needs a transcript column ("
            f"{', '.join(map(repr, TRANSCRIPT_COLUMNS))}), and the train data has "
            f"{', '.join(map(repr, present)) or 'no columns'}. Pass text_column=... with the "
            "name of yours.")
    return found


def read_transcripts(ds: Any, split: str, column: str, tokenizer: Any) -> list[list[int]]:
    """A split's transcripts as label ids: refused when one is empty or has characters the
    tokenizer's vocabulary lacks (named, with the first row of each)."""
    texts = data.check_texts(data.column_values(ds, column), column, split)
    empty = next((row for row, text in enumerate(texts) if not text.strip()), None)
    if empty is not None:
        raise FineTuneError(
            f"row {empty} of column {column!r} ({split}) is an empty transcript; word error "
            "rate needs words. Drop such rows first: dataset.filter(lambda row: "
            f"row[{column!r}].strip()).")
    vocab = tokenizer.get_vocab()
    unknown: Counter = Counter()
    first: dict[str, int] = {}
    for row, text in enumerate(texts):
        for token in tokenizer.tokenize(text):
            if token not in vocab:
                unknown[token] += 1
                first.setdefault(token, row)
    if unknown:
        named = ", ".join(f"{token!r} ({plural(count, 'time')}, first in row {first[token]})"
                          for token, count in unknown.most_common(10))
        raise FineTuneError(
            f"the {split} transcripts ({column!r}) have characters the tokenizer's vocabulary "
            f"lacks: {named}. Normalize the transcripts first (e.g. lowercase them and drop "
            "punctuation with dataset.map), or add those characters to the vocabulary "
            "(vocab.json) and pass that tokenizer.")
    return [list(ids) for ids in tokenizer(texts)["input_ids"]]


def needed_frames(ids: list[int]) -> int:
    """The fewest frames a CTC path of `ids` takes: a frame per label, and a blank between
    two equal labels."""
    return len(ids) + sum(1 for a, b in zip(ids, ids[1:], strict=False) if a == b)


def check_frames(split: str, labels: list[list[int]], frames: np.ndarray | None) -> None:
    """Refuse transcripts that need more frames than their clip gives (CTC cannot emit
    them: the loss would be infinite)."""
    if frames is None:
        return
    short = [row for row, ids in enumerate(labels) if needed_frames(ids) > frames[row]]
    if short:
        row = short[0]
        raise FineTuneError(
            f"the {split} data has {plural(len(short), 'transcript')} needing more frames "
            f"than its clip gives (row {row}: {needed_frames(labels[row])} labels and blanks, "
            f"{int(frames[row])} frames): CTC cannot emit them. Drop those rows, or split "
            "long transcripts with their audio.")


def label_length(labels: dict[str, list[list[int]]], requested: int | None) -> int:
    """The one length every row's labels are padded to: `max_target_length`, or the longest
    transcript's rounded up to a multiple of 8; refused when a transcript is longer."""
    longest = max(len(ids) for rows in labels.values() for ids in rows)
    if requested is None:
        return batching.round_up(longest)
    for split, rows in labels.items():
        cut = [row for row, ids in enumerate(rows) if len(ids) > requested]
        if cut:
            raise FineTuneError(
                f"the {split} data has {plural(len(cut), 'transcript')} longer than "
                f"max_target_length={requested} labels (row {cut[0]}: {len(rows[cut[0]])}; "
                f"the longest: {longest}). Pass max_target_length={batching.round_up(longest)}"
                ", or drop or shorten those rows first.")
    return int(requested)


def padded(labels: list[list[int]], length: int) -> np.ndarray:
    """`[rows, length]` int64 label ids, -100 after each row's labels."""
    block = np.full((len(labels), length), IGNORE, np.int64)
    for row, ids in enumerate(labels):
        block[row, :len(ids)] = ids
    return block


def check_columns(ds: Any, split: str, audio: str, column: str) -> None:
    """Refuse a split without the audio column or the transcript column."""
    missing = [name for name in (audio, column) if name not in ds.column_names]
    if missing:
        raise FineTuneError(
            f"the {split} data has no column {' and no column '.join(map(repr, missing))}"
            f" (it has {', '.join(map(repr, ds.column_names)) or 'none'}): "
            f"task='speech-recognition' reads the clips from {audio!r} (source_column= "
            f"names another) and the transcripts from {column!r} (text_column=).")


def clip_frames(model_config: Any, clips: list[np.ndarray], buckets: list[int]) -> Any:
    """The frames of each clip as the model sees it (cut to the longest bucket)."""
    lengths = np.minimum([len(clip) for clip in clips], max(buckets))
    return output_frames(model_config, np.asarray(lengths, np.int64))


def prepare(splits: Splits, config: FineTuneConfig, context: TaskContext) -> Prepared:
    """Clips and transcripts read and checked, the clips bucketed by duration
    (`audio_classification`), the labels padded to one length; `layerdrop` and SpecAugment off."""
    processor, notes = context.tokenizer, []
    extractor, tokenizer = processor.feature_extractor, processor.tokenizer
    if list(extractor.model_input_names)[0] != audio_task.WAVEFORM_INPUT:
        raise FineTuneError(
            f"a CTC model takes the waveform, and the processor's feature extractor "
            f"({type(extractor).__name__}) makes {list(extractor.model_input_names)}. Pass "
            "the model's own processor (e.g. Wav2Vec2Processor.from_pretrained(...)).")
    rate = int(extractor.sampling_rate)
    audio = config.source_column or audio_task.AUDIO_COLUMN
    column = transcript_column(splits.train, config)
    labels, clips = {}, {}
    for split, ds in splits.named.items():
        check_columns(ds, split, audio, column)
        labels[split] = read_transcripts(ds, split, column, tokenizer)
    for split, ds in splits.named.items():
        clips[split] = audio_task.read_clips(ds, split, audio, rate, notes)
    lengths = {split: [len(clip) for clip in values] for split, values in clips.items()}
    buckets = audio_task.choose_buckets(lengths["train"], max(max(v) for v in lengths.values()),
                                        rate, config.max_length, 4 * config.rows_per_step)
    frames = {split: clip_frames(context.model_config, values, buckets)
              for split, values in clips.items()}
    for split in clips:
        check_frames(split, labels[split], frames[split])
    width = label_length(labels, config.max_target_length)
    encoded = {split: audio_task.encode_split(split, clips[split], padded(labels[split], width),
                                              buckets, extractor) for split in clips}
    eval_name = splits.eval_name
    notes.append(f"speech recognition: transcripts from {column!r}, labels padded to {width}; "
                 "evaluation decodes greedily (CTC) and reports word error rate")
    encoded_data = SpeechData(
        train=encoded["train"], eval=encoded[eval_name] if eval_name is not None else None,
        input_names=audio_task.input_names(extractor), bucket_lengths=buckets, label_names=[],
        notes=notes, host=tokenizer, label_length=width,
        eval_frames=frames[eval_name] if eval_name is not None else None)
    return Prepared(encoded_data, model_kwargs(context, tokenizer, notes))


def model_kwargs(context: TaskContext, tokenizer: Any, notes: list[str]) -> dict[str, Any]:
    """`from_pretrained` arguments: the CTC head sized for the tokenizer's vocabulary, its
    blank the padding token (as Hugging Face's CTC fine-tuning sets them), and the random
    draws per step off (`audio_classification.graph_kwargs`)."""
    model_config = context.model_config
    size, blank = len(tokenizer), tokenizer.pad_token_id
    if context.instance is not None:
        if getattr(model_config, "vocab_size", size) < size:
            raise FineTuneError(
                f"the model's CTC head has {model_config.vocab_size} outputs and the "
                f"tokenizer {size} tokens: pass a model whose vocab_size is {size}, or its "
                "name or folder (the head is then resized).")
        return {}
    kwargs = audio_task.graph_kwargs(model_config, notes)
    if getattr(model_config, "vocab_size", None) != size:
        kwargs.update(vocab_size=size, ignore_mismatched_sizes=True)
        notes.append(f"the CTC head sized for the tokenizer's {size} tokens (newly initialized)")
    if getattr(model_config, "pad_token_id", None) != blank:
        kwargs["pad_token_id"] = blank
    return kwargs


def prepare_predict(inputs: list[Any], context: PredictContext,
                    max_length: int | None) -> SpeechData:
    """Clips (`{"array", "sampling_rate"}` dicts, or 1-D arrays at the extractor's rate, as
    the ASR pipeline takes them) bucketed like evaluation rows."""
    processor, notes, mixed = context.tokenizer, [], []
    extractor = processor.feature_extractor
    rate = int(extractor.sampling_rate)
    clips = [audio_task.clip_of(value, rate, f"input {row}", rate, mixed)
             for row, value in enumerate(inputs)]
    if mixed:
        notes.append(f"{len(mixed)} clips mixed down to one channel")
    lengths = [len(clip) for clip in clips]
    buckets = audio_task.choose_buckets(lengths, max(lengths), rate, max_length, 1)
    labels = np.full((len(clips), 1), IGNORE, np.int64)
    split = audio_task.encode_split("predict", clips, labels, buckets, extractor)
    return SpeechData(train=None, eval=split, input_names=audio_task.input_names(extractor),
                      bucket_lengths=buckets, label_names=[], notes=notes,
                      host=processor.tokenizer, label_length=1,
                      eval_frames=clip_frames(context.model_config, clips, buckets))
