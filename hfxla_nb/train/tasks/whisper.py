"""`fine_tune(task="speech-recognition")` for Whisper (`WhisperForConditionalGeneration` and its
`WhisperProcessor`): what `speech_recognition.SpeechRecognition` does when its data is
`WhisperData`.

Kernel side: every clip read as for CTC models (mono, resampled), made into log-mel features
by the feature extractor, which pads or cuts it to its window (30 s for real Whisper), so every
row has one shape and the run one bucket. The transcripts are tokenized with the processor's
prompt (`<|startoftranscript|><|en|><|transcribe|><|notimestamps|>`), their first token
dropped (the model puts the decoder start token back when it shifts the labels right), the end
token kept, padded with -100 to one `max_target_length`. A row holds the features as the
float32 field `input_features`, no token input, and the label ids as its label columns. Also
`predict`'s clips. Every refusal is a `FineTuneError` that says what to do.

Worker side: teacher-forced training in one graph. Evaluation computes each row's loss, then
generates greedily at fixed shapes as seq2seq evaluation does (the decoder prompt written
first, then the same graph every token), so a run's evaluation compiles two graphs however
many tokens and batches. The host decodes the tokens (special tokens dropped, as
`pipeline("automatic-speech-recognition")` decodes Whisper's) and scores them with jiwer's
word error rate.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import batching
from ..config import FineTuneConfig, FineTuneError
from ..preparation import Prepared, Splits, TaskContext
from . import audio_classification as audio_task
from . import speech_data
from .seq2seq import generate_synced, generated_texts
from .speech_data import IGNORE

if TYPE_CHECKING:
    import torch

    from ..predict import PredictContext
    from ..worker.context import Batch, WorkerContext


# -- the kernel side: log-mel features and prompted transcripts --

FEATURES_INPUT = "input_features"
#: The config attribute (saved with the model) that keeps the target length for `predict`.
SETTINGS_KEY = "hfxla_nb_speech"


@dataclass
class WhisperData(batching.EncodedData):
    """`EncodedData` of a Whisper run: the length every row's labels (and the decoder
    inputs, and what evaluation generates) are padded to, the decoder prompt, the metrics
    to report."""

    target_length: int = 0
    prompt: list[int] = field(default_factory=list)
    text_metrics: tuple[str, ...] = ("wer",)
    #: Evaluation generates a token per graph and syncs after each: not compiled ahead.
    eval_ahead: bool = False


def is_whisper(model_config: Any) -> bool:
    """Whether the model is a Whisper encoder-decoder (log-mel features in, tokens out)."""
    return getattr(model_config, "model_type", None) == "whisper"


def check_processor(processor: Any, model_config: Any) -> None:
    """Refuse a processor that is not Whisper's, or whose feature extractor's window is not
    the one the encoder embeds (`max_source_positions`, two frames each)."""
    extractor = processor.feature_extractor
    names = list(getattr(extractor, "model_input_names", None) or [])
    frames = getattr(extractor, "nb_max_frames", None)
    if not names or names[0] != FEATURES_INPUT or frames is None:
        raise FineTuneError(
            f"a Whisper model takes log-mel features, and the processor's feature extractor "
            f"({type(extractor).__name__}) makes {names or 'no inputs'}. Pass the model's "
            "WhisperProcessor: tokenizer=WhisperProcessor.from_pretrained(...).")
    positions = int(model_config.max_source_positions)
    if int(frames) != 2 * positions:
        raise FineTuneError(
            f"the feature extractor makes {frames} frames a clip (chunk_length="
            f"{extractor.chunk_length} s) and the Whisper encoder embeds {2 * positions} "
            f"(max_source_positions={positions}, two frames each). Pass the feature extractor "
            "saved with the model, or one whose chunk_length gives "
            f"{2 * positions} frames.")


def target_length(labels: dict[str, list[list[int]]], config: FineTuneConfig,
                  model_config: Any, prompt: list[int]) -> int:
    """The labels' one length (`speech_data.label_length`: `max_target_length`, refused when
    a transcript is longer), refused beyond the decoder's `max_target_positions`."""
    try:
        width = speech_data.label_length(labels, config.max_target_length)
    except FineTuneError as error:
        raise FineTuneError(
            f"{error} A Whisper label counts the prompt after its start token "
            f"({len(prompt) - 1} tokens), the transcript's tokens and the end token.") from None
    limit = int(model_config.max_target_positions)
    if width > limit:
        longest = max(len(ids) for rows in labels.values() for ids in rows)
        raise FineTuneError(
            f"the labels would be {width} tokens (the prompt, the transcript and its end "
            f"token; the longest is {longest}), and the Whisper decoder embeds "
            f"{limit} (max_target_positions). Drop or split the longer transcripts, or pass "
            f"max_target_length={limit} or less.")
    return width


def encode_split(name: str, clips: list[np.ndarray], labels: np.ndarray,
                 extractor: Any) -> batching.EncodedSplit:
    """One bucket: every clip as log-mel features padded or cut to the extractor's window
    (as the ASR pipeline makes them), the labels as label columns."""
    features = extractor(clips, sampling_rate=extractor.sampling_rate,
                         return_tensors="np")[FEATURES_INPUT].astype(np.float32)
    window = int(extractor.n_samples)
    cut = int(sum(len(clip) > window for clip in clips))
    bucket = batching.Bucket(window, np.zeros((len(clips), 0), np.int32), labels,
                             np.arange(len(clips)))
    bucket.fields[FEATURES_INPUT] = features
    return batching.EncodedSplit(name, [bucket], len(clips), cut)


def prepare(splits: Splits, config: FineTuneConfig, context: TaskContext,
            metrics: tuple[str, ...]) -> Prepared:
    """Clips and transcripts read and checked, features made, labels padded to one length;
    the target length kept in the saved model's config (for `predict`)."""
    processor, notes = context.tokenizer, []
    check_processor(processor, context.model_config)
    extractor, tokenizer = processor.feature_extractor, processor.tokenizer
    audio = config.source_column or audio_task.AUDIO_COLUMN
    column = speech_data.transcript_column(splits.train, config)
    labels, clips = {}, {}
    for split, ds in splits.named.items():
        speech_data.check_columns(ds, split, audio, column)
        # The prompt's first token is the decoder's start: the model adds it back.
        labels[split] = [ids[1:] for ids in speech_data.read_transcripts(ds, split, column,
                                                                         tokenizer)]
        clips[split] = audio_task.read_clips(ds, split, audio, int(extractor.sampling_rate),
                                             notes)
    prompt = [int(i) for i in tokenizer.prefix_tokens]
    width = target_length(labels, config, context.model_config, prompt)
    encoded = {split: encode_split(split, clips[split], speech_data.padded(labels[split], width),
                                   extractor) for split in clips}
    notes.append(f"speech recognition (Whisper): clips as {extractor.chunk_length} s of "
                 f"log-mel features, transcripts from {column!r} after the prompt "
                 f"{''.join(tokenizer.convert_ids_to_tokens(prompt))}, labels padded to "
                 f"{width}; evaluation generates greedily and reports word error rate")
    eval_name = splits.eval_name
    data = WhisperData(
        train=encoded["train"], eval=encoded[eval_name] if eval_name is not None else None,
        input_names=[FEATURES_INPUT], bucket_lengths=[int(extractor.n_samples)],
        label_names=[], notes=notes, host=tokenizer, target_length=width, prompt=prompt,
        text_metrics=metrics)
    return Prepared(data, model_kwargs(context, tokenizer, width, notes))


def model_kwargs(context: TaskContext, tokenizer: Any, width: int,
                 notes: list[str]) -> dict[str, Any]:
    """`from_pretrained` arguments: the target length kept in the config, layer drop and
    SpecAugment off (a random draw per step: a new graph per step on XLA); a vocabulary
    smaller than the tokenizer's refused."""
    model_config = context.model_config
    if int(model_config.vocab_size) < len(tokenizer):
        raise FineTuneError(
            f"the Whisper model embeds {model_config.vocab_size} tokens and the tokenizer has "
            f"{len(tokenizer)}: pass the tokenizer saved with the model, or resize the "
            "model's embeddings first (model.resize_token_embeddings(len(tokenizer))).")
    if context.instance is not None:
        return {}
    config = copy.deepcopy(model_config)
    changed = [name for name in ("encoder_layerdrop", "decoder_layerdrop", "apply_spec_augment")
               if getattr(config, name, 0)]
    for name in changed:
        setattr(config, name, False if name == "apply_spec_augment" else 0.0)
    if changed:
        notes.append(f"{' and '.join(changed)} turned off: a random draw per step would "
                     "compile a new graph per step on XLA")
    setattr(config, SETTINGS_KEY, {"max_target_length": width})
    return {"config": config}


def prepare_predict(inputs: list[Any], context: PredictContext) -> WhisperData:
    """Clips (`{"array", "sampling_rate"}` dicts, or 1-D arrays at the extractor's rate, as
    the ASR pipeline takes them) as features; the target length the model was fine-tuned
    with (kept in its config), else its decoder's `max_target_positions`."""
    processor, notes, mixed = context.tokenizer, [], []
    check_processor(processor, context.model_config)
    extractor, tokenizer = processor.feature_extractor, processor.tokenizer
    rate = int(extractor.sampling_rate)
    clips = [audio_task.clip_of(value, rate, f"input {row}", rate, mixed)
             for row, value in enumerate(inputs)]
    if mixed:
        notes.append(f"{len(mixed)} clips mixed down to one channel")
    settings = getattr(context.model_config, SETTINGS_KEY, None) or {}
    width = int(settings.get("max_target_length")
                or context.model_config.max_target_positions)
    labels = np.full((len(clips), width), speech_data.IGNORE, np.int64)
    return WhisperData(train=None, eval=encode_split("predict", clips, labels, extractor),
                       input_names=[FEATURES_INPUT], bucket_lengths=[int(extractor.n_samples)],
                       label_names=[], notes=notes, host=tokenizer, target_length=width,
                       prompt=[int(i) for i in tokenizer.prefix_tokens])


# -- the worker side: teacher-forced training, greedy evaluation --

def _forward(ctx: WorkerContext, batch: Batch) -> tuple[Any, Any, Any]:
    """The teacher-forced forward pass: the model's output, the features, the labels."""
    data = ctx.plan.data
    features = batch[FEATURES_INPUT]
    labels = batch.tokens[:, :data.target_length].long()  # no token input: labels first
    with ctx.autocast():
        output = ctx.model(input_features=features, labels=labels, use_cache=False)
    return output, features, labels


def train_loss(ctx: WorkerContext, batch: Batch) -> torch.Tensor:
    """The mean cross-entropy over the label tokens (-100 not counted), as Whisper's own."""
    return _forward(ctx, batch)[0].loss.float()


def eval_outputs(ctx: WorkerContext, batch: Batch) -> list[torch.Tensor]:
    """`[rows, 2]` each row's summed token loss and token count (weighted: filler rows
    count 0), and `[rows, target_length]` the generated tokens."""
    import torch

    data = ctx.plan.data
    output, features, labels = _forward(ctx, batch)
    logits = output.logits.float()
    losses = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE,
        reduction="none").view(labels.shape)
    weights = (labels != IGNORE).float() * batch.weights.float()[:, None]
    sums = torch.stack([(losses * weights).sum(-1), weights.sum(-1)], dim=-1)
    tokens = generate_synced(ctx, [sums], features, None, data.target_length,
                             output.encoder_last_hidden_state, prompt=data.prompt)
    return [sums, tokens]


def eval_loss(per_batch: list) -> float:
    """The evaluation loss per label token, over every real row. `per_batch`: the task's
    `(batch, outputs)` pairs."""
    total = tokens = 0.0
    for (_, _, real), (sums, _) in per_batch:
        values = sums.double().numpy()[:real]
        total, tokens = total + float(values[:, 0].sum()), tokens + float(values[:, 1].sum())
    return total / max(tokens, 1.0)


def decode(data: WhisperData, per_batch: list) -> list[dict[str, str]]:
    """`{"text": ...}` for every clip of `data.eval`, in its order: the generated tokens up
    to the end token, special tokens (the prompt) dropped, spaces kept (as the ASR
    pipeline's Whisper decoding)."""
    split = data.eval
    texts = [""] * split.num_rows
    for (bucket_index, positions, real), (_, tokens) in per_batch:
        rows = split.buckets[bucket_index].rows[positions[:real]]
        for row, text in zip(rows, generated_texts(data.host, tokens[:real], strip=False),
                             strict=True):
            texts[row] = text
    return [{"text": text} for text in texts]


def references(data: WhisperData) -> list[str]:
    """The transcript of every row of `data.eval`, decoded from its labels by the same rules
    as the generated tokens."""
    import torch

    tokenizer, split = data.host, data.eval
    texts = [""] * split.num_rows
    for bucket in split.buckets:
        labels = np.where(bucket.labels == IGNORE, tokenizer.pad_token_id, bucket.labels)
        for row, text in zip(bucket.rows, generated_texts(tokenizer, torch.from_numpy(labels),
                                                          strip=False), strict=True):
            texts[row] = text
    return texts
