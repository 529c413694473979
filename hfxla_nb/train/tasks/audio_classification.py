"""Audio classification: a label per clip (`...ForAudioClassification` heads, and wav2vec2's
`...ForSequenceClassification`); accuracy.

Kernel side: clips and labels read from each split and checked, mixed down to mono, resampled
to the feature extractor's rate, cut or padded to a few fixed durations (buckets), normalized
by the feature extractor, and the head sized for the labels. Also `predict`'s clips, bucketed
like evaluation rows. A clip is a decoded `datasets` audio value (`{"array": ...,
"sampling_rate": ...}`, or a torchcodec `AudioDecoder`), or a plain array with the rate in a
`sampling_rate` column. Resampling is linear interpolation with NumPy: no resampler library is
needed, and for speech and most sounds at 16 kHz it is close to a band-limited resampler
(resample first with torchaudio or librosa where aliasing matters). Nothing is forked or
written; every refusal is a `FineTuneError` that says what to do.

The waveform goes to the model as a float32 field (`input_values`, `[rows, samples]`); an
attention mask, when the extractor makes one, is the int32 token input. The worker hooks are
sequence classification's, the class id the batch's one label column.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import batching, data
from ..config import FineTuneConfig, FineTuneError
from ..preparation import Prepared, Splits, TaskContext
from . import register_task
from .classification import Classification, check_classes, head_kwargs

if TYPE_CHECKING:
    import torch

    from ..batching import EncodedData
    from ..config import FineTuneConfig
    from ..predict import PredictContext
    from ..preparation import Prepared, Splits, TaskContext
    from ..worker.context import Batch, WorkerContext


# -- the kernel side: clips read, resampled, bucketed --

AUDIO_COLUMN = "audio"
RATE_COLUMN = "sampling_rate"
#: Bucket durations in seconds: a clip is padded to the shortest that holds it (cut to the
#: longest): one training and one evaluation graph each.
DURATIONS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
#: A 2-D clip with at most this many rows (or columns) is that many channels, mixed down.
MAX_CHANNELS = 8
WAVEFORM_INPUT = "input_values"


def load_feature_extractor(given: Any, model: Any, source: Any) -> Any:
    """The feature extractor: `given` (`tokenizer=`: an extractor, a name or a folder), else
    the one saved with the model; refused when there is none or it does not take waveforms."""
    if given is not None and not isinstance(given, (str, os.PathLike)):
        extractor = given
    else:
        where = given if given is not None else (
            source if isinstance(source, str) else getattr(model.config, "_name_or_path", None))
        if not where:
            raise FineTuneError(
                "the model instance does not say where its feature extractor is: pass "
                "tokenizer=AutoFeatureExtractor.from_pretrained(...) (or its name or folder).")
        from transformers import AutoFeatureExtractor

        try:
            extractor = AutoFeatureExtractor.from_pretrained(os.fspath(where))
        except Exception as error:  # noqa: BLE001 - say what to do, whatever failed
            raise FineTuneError(
                f"could not load a feature extractor from {os.fspath(where)!r} "
                f"({str(error).splitlines()[0][:200]}). Save one next to the model "
                "(feature_extractor.save_pretrained(folder), e.g. a Wav2Vec2FeatureExtractor) "
                "or pass tokenizer=AutoFeatureExtractor.from_pretrained(...).") from None
    names = list(getattr(extractor, "model_input_names", None) or [])
    if not names or names[0] != WAVEFORM_INPUT or not getattr(extractor, "sampling_rate", None):
        raise FineTuneError(
            f"the feature extractor ({type(extractor).__name__}) makes {names or 'no inputs'}; "
            "task='audio-classification' trains models that take the waveform "
            f"({WAVEFORM_INPUT!r}: wav2vec2, HuBERT, WavLM, Data2VecAudio). Pass such a "
            "model and its feature extractor.")
    return extractor


def to_mono(array: np.ndarray, where: str, mixed: list[int]) -> np.ndarray:
    """A 1-D clip; a 2-D one of at most `MAX_CHANNELS` channels (either axis) averaged."""
    if array.ndim == 1:
        return array
    if array.ndim == 2 and min(array.shape) <= MAX_CHANNELS:
        mixed.append(int(min(array.shape)))
        return array.mean(axis=int(np.argmin(array.shape)))
    raise FineTuneError(
        f"{where} has shape {tuple(array.shape)}: a clip is one channel of samples (or a few "
        f"channels, at most {MAX_CHANNELS}, mixed down here). Pass 1-D arrays, e.g. "
        "array.mean(axis=0) for [channels, samples].")


def resample(array: np.ndarray, rate: float, target: int) -> np.ndarray:
    """`array` at `rate` Hz as `target` Hz, by linear interpolation (NumPy only)."""
    if rate == target or len(array) == 0:
        return array
    count = max(1, int(round(len(array) * target / rate)))
    times = np.arange(count, dtype=np.float64) * (rate / target)
    return np.interp(times, np.arange(len(array), dtype=np.float64), array)


def clip_of(value: Any, rate: Any, where: str, target: int, mixed: list[int]) -> np.ndarray:
    """One clip as float32 mono samples at `target` Hz. `rate`: the row's `sampling_rate`
    (None: the value must carry it)."""
    if hasattr(value, "get_all_samples"):  # a torchcodec AudioDecoder (datasets.Audio)
        samples = value.get_all_samples()
        value = {"array": samples.data.numpy(), "sampling_rate": samples.sample_rate}
    if isinstance(value, dict):
        array = value.get("array", value.get("raw"))
        rate = value.get("sampling_rate", rate)
    else:
        array = value
    if isinstance(array, (str, os.PathLike)):
        raise FineTuneError(
            f"{where} is a file path ({data.short(array)}); pass decoded audio instead: "
            "{'array': samples, 'sampling_rate': rate}, e.g. from soundfile.read(path).")
    try:
        array = np.asarray(array, dtype=np.float64)
    except (TypeError, ValueError):
        raise FineTuneError(f"{where} holds a {type(array).__name__}, not audio samples; pass "
                            "{'array': samples, 'sampling_rate': rate} dicts.") from None
    if isinstance(rate, np.ndarray) and rate.ndim == 0:  # a NumPy-formatted row's scalar
        rate = rate.item()
    if rate is None:
        raise FineTuneError(
            f"{where} has no sampling rate. Pass each clip as {{'array': samples, "
            f"'sampling_rate': rate}} (as datasets' Audio column decodes it), or add a "
            f"{RATE_COLUMN!r} column.")
    if not isinstance(rate, (int, float, np.number)) or not np.isfinite(rate) or rate <= 0:
        raise FineTuneError(f"{where} has sampling rate {data.short(rate)}; pass a positive "
                            "number of samples per second (e.g. 16000).")
    array = to_mono(array, where, mixed)
    if array.size == 0:
        raise FineTuneError(f"{where} is empty; drop such rows first.")
    return resample(array, float(rate), target).astype(np.float32)


def read_clips(ds: Any, split: str, column: str, target: int,
               notes: list[str]) -> list[np.ndarray]:
    """Every clip of a split's `column` (rates from its `sampling_rate` column when there is
    one), mono, at `target` Hz."""
    values = data.column_values(ds.with_format("numpy"), column)
    rates = (data.column_values(ds, RATE_COLUMN) if RATE_COLUMN in ds.column_names
             else [None] * len(values))
    mixed: list[int] = []
    clips = [clip_of(value, rate, f"row {row} of column {column!r} ({split})", target, mixed)
             for row, (value, rate) in enumerate(zip(values, rates, strict=True))]
    if mixed:
        notes.append(f"{len(mixed)} {split} clips mixed down to one channel (from "
                     f"{max(mixed)} at most)")
    return clips


def choose_buckets(train: list[int], longest: int, rate: int, max_length: int | None,
                   min_rows: int) -> list[int]:
    """Bucket lengths in samples: `[max_length]` when given; else the `DURATIONS` that hold
    the training clips, a bucket with fewer than `min_rows` training clips merged into the
    next, the last widened to hold `longest` (evaluation clips), at most 30 s."""
    if max_length is not None:
        return [int(max_length)]
    ladder = [batching.round_up(seconds * rate) for seconds in DURATIONS]
    top = next((i for i, size in enumerate(ladder) if size >= longest), len(ladder) - 1)
    edges = np.asarray(ladder[:top + 1])
    counts = np.bincount(np.searchsorted(edges, np.minimum(train, edges[-1])),
                         minlength=len(edges))
    buckets, held = [], 0
    for size, count in zip(edges, counts, strict=True):
        held += int(count)
        if held >= min_rows:
            buckets.append(int(size))
            held = 0
    if not buckets:
        return [int(edges[-1])]
    # The clips left over (too few for a bucket of their own) and evaluation's longest go
    # into the longest bucket.
    buckets[-1] = int(edges[-1])
    return buckets


def encode_split(name: str, clips: list[np.ndarray], labels: np.ndarray, buckets: list[int],
                 extractor: Any) -> batching.EncodedSplit:
    """Clips cut to the longest bucket, normalized by the extractor (each over its own
    samples, as `pipeline("audio-classification")` does), padded to the shortest bucket
    that holds them; `input_values` a float32 field, an attention mask the token input."""
    edges = np.asarray(sorted(buckets))
    lengths = np.fromiter((len(clip) for clip in clips), np.int64, len(clips))
    slots = np.searchsorted(edges, np.minimum(lengths, edges[-1]), side="left")
    masked = bool(getattr(extractor, "return_attention_mask", False))
    pad = float(getattr(extractor, "padding_value", 0.0) or 0.0)
    result = []
    for slot, length in enumerate(int(size) for size in edges):
        rows = np.flatnonzero(slots == slot)
        if len(rows) == 0:
            continue
        cut = [clips[row][:length] for row in rows]
        normalized = extractor(cut, sampling_rate=extractor.sampling_rate)[WAVEFORM_INPUT]
        values = np.full((len(rows), length), pad, np.float32)
        mask = np.zeros((len(rows), length if masked else 0), np.int32)
        for i, row_values in enumerate(normalized):
            values[i, :len(row_values)] = np.asarray(row_values, np.float32)
            mask[i, :len(row_values)] = 1
        bucket = batching.Bucket(length, mask, labels[rows], rows)
        bucket.fields[WAVEFORM_INPUT] = values
        result.append(bucket)
    return batching.EncodedSplit(name, result, len(clips), int((lengths > edges[-1]).sum()))


def input_names(extractor: Any) -> list[str]:
    masked = bool(getattr(extractor, "return_attention_mask", False))
    return [WAVEFORM_INPUT, "attention_mask"] if masked else [WAVEFORM_INPUT]


def label_column(ds: Any, config: FineTuneConfig) -> str:
    """`label_column`, or "labels" when the data has that and not the default "label"."""
    present = list(ds.column_names)
    if config.label_column == "label" and "label" not in present and "labels" in present:
        return "labels"
    return config.label_column


def prepare(splits: Splits, config: FineTuneConfig, context: TaskContext) -> Prepared:
    """Clips and labels read and checked, resampled, cut or padded into duration buckets,
    the head sized for the labels (`layerdrop` and SpecAugment off: see `graph_kwargs`)."""
    extractor, notes = context.tokenizer, []
    rate = int(extractor.sampling_rate)
    column = config.text_column if config.text_column != "text" else AUDIO_COLUMN
    labels_at = label_column(splits.train, config)
    raw, names, clips = {}, {}, {}
    try:
        for split, ds in splits.named.items():
            data.check_columns(ds, split, [column, labels_at])
            raw[split] = data.column_values(ds, labels_at)
            names[split] = data.class_label_names(ds, labels_at)
        label_names, label_ids = data.map_labels(
            raw, column=labels_at, dataset_names=names,
            model_names=data.meaningful_label_names(getattr(context.model_config, "id2label",
                                                            None)),
            model_num_labels=context.fixed_labels)
    except data.DataError as error:
        message = str(error).replace("Pass text_column=...", f"Pass text_column=... (the "
                                     f"audio column, default {AUDIO_COLUMN!r})")
        raise FineTuneError(message) from None
    check_classes(label_ids["train"], raw["train"], list(label_names), labels_at)
    for split, ds in splits.named.items():
        clips[split] = read_clips(ds, split, column, rate, notes)
    lengths = {split: [len(clip) for clip in values] for split, values in clips.items()}
    buckets = choose_buckets(lengths["train"], max(max(v) for v in lengths.values()), rate,
                             config.max_length, 4 * config.rows_per_step)
    encoded = {split: encode_split(split, clips[split], label_ids[split], buckets, extractor)
               for split in clips}
    eval_name = splits.eval_name
    encoded_data = batching.EncodedData(
        train=encoded["train"], eval=encoded[eval_name] if eval_name is not None else None,
        input_names=input_names(extractor), bucket_lengths=buckets,
        label_names=list(label_names), notes=notes)
    kwargs = head_kwargs(context.model_config, context.fixed_labels, list(label_names), None)
    if context.instance is None:
        kwargs.update(graph_kwargs(context.model_config, notes))
    return Prepared(encoded_data, kwargs)


def graph_kwargs(model_config: Any, notes: list[str]) -> dict[str, Any]:
    """Config changes that keep one training graph per bucket: wav2vec2-style models skip
    layers at random (`layerdrop`, a host-side draw per layer and step) and mask time steps
    drawn on the host (SpecAugment), each a new graph or upload per step on XLA."""
    kwargs: dict[str, Any] = {}
    if float(getattr(model_config, "layerdrop", 0.0) or 0.0) > 0:
        kwargs["layerdrop"] = 0.0
    if getattr(model_config, "apply_spec_augment", False):
        kwargs["apply_spec_augment"] = False
    if kwargs:
        notes.append(f"{' and '.join(sorted(kwargs))} turned off: a random draw per step "
                     "would compile a new graph per step on XLA")
    return kwargs


def prepare_predict(inputs: list[Any], context: PredictContext,
                    max_length: int | None) -> batching.EncodedData:
    """Clips (`{"array", "sampling_rate"}` dicts, or 1-D arrays at the extractor's rate, as
    `pipeline("audio-classification")` takes them) bucketed like evaluation rows."""
    extractor, notes, mixed = context.tokenizer, [], []
    rate = int(extractor.sampling_rate)
    clips = [clip_of(value, rate, f"input {row}", rate, mixed)
             for row, value in enumerate(inputs)]
    if mixed:
        notes.append(f"{len(mixed)} clips mixed down to one channel")
    lengths = [len(clip) for clip in clips]
    buckets = choose_buckets(lengths, max(lengths), rate, max_length, 1)
    split = encode_split("predict", clips, np.zeros(len(clips), np.int64), buckets, extractor)
    config = context.model_config
    names = [str(config.id2label[i]) for i in sorted(config.id2label, key=int)]
    return batching.EncodedData(train=None, eval=split, input_names=input_names(extractor),
                                bucket_lengths=buckets, label_names=names, notes=notes)


# -- AudioClassification: the task's hooks, and weight norm for XLA tensors --

_lock = threading.Lock()
_users = [0, None]  # open `weight_norm_traced` blocks (one per rank thread), the original


def _weight_norm(original: Any) -> Any:
    """`torch._weight_norm`, spelled out for XLA tensors (what aten computes when it does not
    fuse it: `v * (g / norm_except_dim(v, 2, dim))`)."""

    def weight_norm(v: Any, g: Any, dim: int = 0) -> Any:
        import torch

        if getattr(v.device, "type", None) != "xla":
            return original(v, g, dim)
        return v * (g / torch.norm_except_dim(v, 2, dim))

    return weight_norm


@contextmanager
def weight_norm_traced() -> Iterator[None]:
    """Within the block, weight normalization (wav2vec2's positional convolution) traces
    into the graph on XLA: torch_xla has no kernel for the fused `_weight_norm_interface`,
    so it would run on the CPU, fetching the weights and cutting the step's graph in two,
    every step. Same values; undone when the last block (of any rank thread) ends."""
    import torch

    with _lock:
        if _users[0] == 0:
            _users[1] = torch._weight_norm
            torch._weight_norm = _weight_norm(_users[1])
        _users[0] += 1
    try:
        yield
    finally:
        with _lock:
            _users[0] -= 1
            if _users[0] == 0:
                torch._weight_norm = _users[1]


#: Labels per clip that `decode` gives, best first (as `pipeline("audio-classification")`).
TOP_K = 5


class AudioClassification(Classification):
    """Audio classification: a label per clip; accuracy (and the metrics asked for)."""

    name = "audio-classification"
    pipeline_tag = "audio-classification"
    auto_class = "AutoModelForAudioClassification"
    # wav2vec2, HuBERT, WavLM name their audio head ...ForSequenceClassification, as text
    # models do: `claims_model` tells them apart by the config's model type.
    head_suffixes = ("ForAudioClassification", "ForSequenceClassification")
    columns = (AUDIO_COLUMN,)
    processor = "feature extractor"
    peft_task_type = None
    title = "audio classification"
    predict_example = '[{"array": samples, "sampling_rate": 16000}]'

    def claims_model(self, model_config: Any) -> bool:
        """An audio model (its model type one of transformers' audio classifiers): task="auto"
        picks audio classification for its `...ForSequenceClassification` head."""
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES,
        )

        return getattr(model_config, "model_type", None) in (
            MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES)

    def load_processor(self, given: Any, model: Any, source: Any) -> Any:
        """The model's feature extractor (`tokenizer=` passes another), not a tokenizer."""
        return load_feature_extractor(given, model, source)

    def train_loss(self, ctx: WorkerContext, batch: Batch) -> torch.Tensor:
        with weight_norm_traced():
            return super().train_loss(ctx, batch)

    def eval_outputs(self, ctx: WorkerContext, batch: Batch) -> list[torch.Tensor]:
        with weight_norm_traced():
            return super().eval_outputs(ctx, batch)

    def decode(self, data: Any, batches: list, fetched: list) -> list[dict[str, Any]]:
        """Each clip's label and score, its `top` labels as `pipeline("audio-classification")`
        lists them (`[{"label", "score"}]`, best first, at most `TOP_K`), and every label's
        probability."""
        decoded = super().decode(data, batches, fetched)
        for item in decoded:
            ranked = sorted(item["probabilities"].items(), key=lambda pair: -pair[1])
            item["top"] = [{"label": label, "score": score}
                           for label, score in ranked[:TOP_K]]
        return decoded

    def prediction_table(self, predictions: list[dict[str, Any]]
                         ) -> tuple[list[dict[str, Any]], list[str] | None]:
        """One row per clip: its label and score."""
        return [{"label": item["label"], "score": item["score"]} for item in predictions], [
            "label", "score"]

    def prepare(self, splits: Splits, config: FineTuneConfig,
                context: TaskContext) -> Prepared:
        """Clips and labels checked, resampled and bucketed by duration (`audio_data.py`)."""
        return prepare(splits, config, context)

    def prepare_predict(self, inputs: list[Any], context: PredictContext,
                        max_length: int | None) -> EncodedData:
        """Clips, bucketed by duration like evaluation rows."""
        return prepare_predict(inputs, context, max_length)


register_task(AudioClassification())
