"""`fine_tune(task="speech-recognition")`: transcripts of clips with CTC models (wav2vec2,
HuBERT, WavLM, Data2VecAudio `...ForCTC`) or Whisper (`WhisperForConditionalGeneration`) and
their processor; word error rate.

```python
result = hx.fine_tune(folder, common_voice, task="speech-recognition")
result.metrics["eval_wer"]
result.predict([{"array": samples, "sampling_rate": 16000}])   # [{"text": "..."}]
```

Kernel side (`speech_data.py`): clips bucketed by duration as audio classification buckets
them, transcripts checked and tokenized into labels padded to one length. Worker side: the
CTC loss on the device, one training and one evaluation graph per bucket; evaluation keeps
each frame's most probable token on the device, and the host decodes them greedily (repeats
merged, blanks dropped) with the tokenizer, as `pipeline("automatic-speech-recognition")`
does, and scores them with jiwer's word error rate. Whisper's sides are `whisper.py`.

The CTC loss is spelled out in tensor operations, so that it traces into the step's graph at
fixed shapes. torch_xla has no lowering of `torch.nn.functional.ctc_loss`: it would run on the
CPU every step, cutting the graph in two, and `...ForCTC`'s own loss packs the labels with
`masked_select` (a shape known only from the data). Here the labels stay padded and the
forward (alpha) recursion of Graves et al. (2006) runs over the frames in log space; autograd
gives its gradient. The values are `ctc_loss(..., reduction="none")`'s. The recursion is
unrolled, one step per frame: a bucket of F frames traces about 10 F operations, compiled once
per bucket.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import FineTuneError
from . import register_task, speech_data, whisper
from . import whisper as whisper_data
from .audio_classification import weight_norm_traced
from .base import Task

if TYPE_CHECKING:
    import torch

    from ..batching import EncodedData
    from ..config import FineTuneConfig
    from ..predict import PredictContext
    from ..preparation import Prepared, Splits, TaskContext
    from ..worker.context import Batch, WorkerContext


# -- the CTC loss in tensor operations --

#: Log-probability of what cannot happen: finite, so that no gradient is NaN.
IMPOSSIBLE = -1e30
#: A row's loss above this is an impossible alignment (more labels than frames allow).
INFINITE = 1e29


def extended_labels(labels: Any, blank: int) -> tuple[Any, Any, Any]:
    """The labels with a blank before, between and after them (`[rows, 2 S + 1]`), where a
    path may skip a blank (between two different labels), and each row's label count."""
    import torch

    real = labels >= 0
    counts = real.sum(-1)
    targets = torch.where(real, labels, torch.full_like(labels, blank))
    rows, width = targets.shape
    blanks = torch.full_like(targets, blank)
    extended = torch.cat([torch.stack([blanks, targets], -1).reshape(rows, 2 * width),
                          blanks[:, :1]], dim=1)
    skip = torch.zeros_like(extended, dtype=torch.bool)
    skip[:, 2:] = (extended[:, 2:] != blank) & (extended[:, 2:] != extended[:, :-2])
    return extended, skip, counts


def ctc_losses(log_probs: Any, labels: Any, blank: int, input_lengths: Any = None,
               zero_infinity: bool = False) -> Any:
    """Each row's CTC loss (the negative log-likelihood of its labels), as
    `torch.nn.functional.ctc_loss(..., reduction="none")` computes it.

    Args:
        log_probs: `[rows, frames, vocabulary]` float log-probabilities (log_softmax).
        labels: `[rows, S]` int label ids, -100 (any negative) on the padding after them.
        blank: the blank's id (wav2vec2: the padding token's).
        input_lengths: `[rows]` frames that count per row; None: every frame.
        zero_infinity: an impossible alignment (more labels than frames) costs 0, not a
            huge loss (`...ForCTC`'s `ctc_zero_infinity`).

    Returns:
        `[rows]` float32 losses.
    """
    import torch

    log_probs = log_probs.float()
    rows, frames, _ = log_probs.shape
    extended, skip, counts = extended_labels(labels.long(), blank)
    states = extended.shape[1]
    emissions = log_probs.gather(2, extended[:, None, :].expand(rows, frames, states))
    impossible = torch.full((rows, states), IMPOSSIBLE, dtype=log_probs.dtype,
                            device=log_probs.device)
    positions = torch.arange(states, device=log_probs.device)[None, :]
    alpha = torch.where(positions < 2, emissions[:, 0], impossible)
    pad = impossible[:, :2]
    for frame in range(1, frames):
        shifted = torch.cat([pad, alpha], dim=1)
        one_back, two_back = shifted[:, 1:states + 1], shifted[:, :states]
        two_back = torch.where(skip, two_back, impossible)
        step = torch.logsumexp(torch.stack([alpha, one_back, two_back]), dim=0)
        step = step + emissions[:, frame]
        if input_lengths is not None:
            step = torch.where((input_lengths > frame)[:, None], step, alpha)
        alpha = step
    last = alpha.gather(1, (2 * counts)[:, None])[:, 0]
    before = alpha.gather(1, (2 * counts - 1).clamp(min=0)[:, None])[:, 0]
    before = torch.where(counts > 0, before, torch.full_like(before, IMPOSSIBLE))
    losses = -torch.logsumexp(torch.stack([last, before]), dim=0)
    if zero_infinity:
        losses = torch.where(losses > INFINITE, torch.zeros_like(losses), losses)
    return losses


def reduced(losses: Any, labels: Any, reduction: str) -> Any:
    """The batch's loss as `...ForCTC` reduces it (`ctc_loss_reduction`): "mean" divides
    each row's loss by its label count (at least 1) and averages the rows; "sum" adds them."""
    if reduction == "sum":
        return losses.sum()
    counts = (labels >= 0).sum(-1).clamp(min=1)
    return (losses / counts).mean()


# -- SpeechRecognition: the task's hooks --

#: The metrics the task reports (word and character error rate, jiwer's, as `evaluate`'s).
SPEECH_METRICS = ("wer", "cer")
DEFAULT_METRICS = ("accuracy",)  # FineTuneConfig's default: "pick for the task" here
INSTALL = 'pip install jiwer (or pip install "hfxla_nb[audio]")'


def metric_names(config: Any) -> tuple[str, ...]:
    """The metrics to report: those asked for, else word error rate; refused without jiwer."""
    asked = tuple(config.metrics)
    names = ("wer",) if asked == DEFAULT_METRICS else asked
    wrong = [m for m in names if callable(m) or m not in SPEECH_METRICS]
    if wrong:
        raise FineTuneError(
            f"task='speech-recognition' reports {' and '.join(map(repr, SPEECH_METRICS))} "
            f"(and the loss); metrics={asked!r} has {', '.join(map(repr, wrong))}. Pass "
            "metrics=('wer',), ('cer',) or both.")
    if importlib.util.find_spec("jiwer") is None:
        raise FineTuneError(f"the word error rate needs jiwer: {INSTALL}.")
    return names


def error_rates(names: Sequence[str], references: list[str],
                predictions: list[str]) -> dict[str, float]:
    """`eval_wer` (word error rate: substitutions, deletions and insertions over the
    reference words, summed over rows, as `evaluate.load("wer")`) and `eval_cer` as asked."""
    import jiwer

    measures = {"wer": jiwer.wer, "cer": jiwer.cer}
    return {f"eval_{name}": float(measures[name](references, predictions)) for name in names}


class SpeechRecognition(Task):
    """Speech recognition with CTC or Whisper: a transcript per clip; word error rate."""

    name = "speech-recognition"
    pipeline_tag = "automatic-speech-recognition"
    auto_class = "AutoModelForCTC"
    processor = "processor"  # a tokenizer and a feature extractor, saved together
    head_suffixes = ("ForCTC", "WhisperForConditionalGeneration")
    outputs_per_batch = 2
    eval_ahead = True  # one graph per bucket that syncs nothing itself
    title = "speech recognition"
    predict_example = '[{"array": samples, "sampling_rate": 16000}]'

    # -- kernel side (speech_data.py) --------------------------------------------------------

    def auto_class_for(self, model_config: Any) -> str:
        """`AutoModelForSpeechSeq2Seq` for Whisper, else `AutoModelForCTC`."""
        if whisper_data.is_whisper(model_config):
            return "AutoModelForSpeechSeq2Seq"
        return self.auto_class

    def claims_model(self, model_config: Any) -> bool:
        """Whisper's `...ForConditionalGeneration` is speech recognition, not seq2seq."""
        return whisper_data.is_whisper(model_config)

    def check_model(self, model_config: Any, names: list[str]) -> None:
        """Refuse a model that is neither Whisper nor one with a convolutional waveform front
        end (CTC's frames)."""
        if whisper_data.is_whisper(model_config):
            return
        if speech_data.output_frames(model_config, 16_000) is None or getattr(
                model_config, "is_encoder_decoder", False):
            what = names[0] if names else getattr(model_config, "model_type", "this model")
            raise FineTuneError(
                f"task='speech-recognition' trains CTC models that take the waveform "
                f"(wav2vec2, HuBERT, WavLM, Data2VecAudio ...ForCTC) and Whisper "
                f"(WhisperForConditionalGeneration), and {what} is not one (other "
                "encoder-decoder speech models are not supported). Pass such a model (or a "
                "pretrained CTC encoder's folder or name: the CTC head is added) with its "
                "processor.")

    def load_processor(self, given: Any, model: Any, source: Any) -> Any:
        """The model's processor: its CTC tokenizer and feature extractor."""
        return speech_data.load_processor(given, model, source)

    def prepare(self, splits: Splits, config: FineTuneConfig,
                context: TaskContext) -> Prepared:
        """Clips bucketed by duration, transcripts checked and padded (`speech_data.py`)."""
        names = metric_names(config)
        if whisper_data.is_whisper(context.model_config):
            return whisper_data.prepare(splits, config, context, names)
        prepared = speech_data.prepare(splits, config, context)
        prepared.data.text_metrics = names
        return prepared

    def prepare_predict(self, inputs: list[Any], context: PredictContext,
                        max_length: int | None) -> EncodedData:
        """Clips, bucketed by duration like evaluation rows (Whisper: one window)."""
        if whisper_data.is_whisper(context.model_config):
            return whisper_data.prepare_predict(inputs, context)
        return speech_data.prepare_predict(inputs, context, max_length)

    # -- worker side -------------------------------------------------------------------------

    def _losses(self, ctx: WorkerContext, batch: Batch) -> tuple[Any, Any, Any]:
        """Each row's CTC loss, its labels, and the logits."""
        import torch

        data, config = ctx.plan.data, ctx.model.config
        inputs = batch.inputs()
        with weight_norm_traced(), ctx.autocast():
            logits = ctx.model(**inputs).logits
        # Labels after the token inputs (an attention mask when the extractor makes one).
        start = batch.length * sum(1 for name in inputs if name not in batch)
        labels = batch.tokens[:, start:start + data.label_length].long()
        mask = inputs.get("attention_mask")
        lengths = None if mask is None else speech_data.output_frames(config,
                                                                      mask.sum(-1).long())
        losses = ctc_losses(torch.log_softmax(logits.float(), dim=-1), labels,
                            int(config.pad_token_id), lengths,
                            bool(getattr(config, "ctc_zero_infinity", False)))
        return losses, labels, logits

    def train_loss(self, ctx: WorkerContext, batch: Batch) -> torch.Tensor:
        if isinstance(ctx.plan.data, whisper_data.WhisperData):
            return whisper.train_loss(ctx, batch)
        losses, labels, _ = self._losses(ctx, batch)
        return reduced(losses, labels, getattr(ctx.model.config, "ctc_loss_reduction", "mean"))

    def eval_outputs(self, ctx: WorkerContext, batch: Batch) -> list[torch.Tensor]:
        if isinstance(ctx.plan.data, whisper_data.WhisperData):
            return whisper.eval_outputs(ctx, batch)
        losses, labels, logits = self._losses(ctx, batch)
        per_label = losses / (labels >= 0).sum(-1).clamp(min=1)
        return [per_label, logits.argmax(-1).int()]

    def eval_metrics(self, ctx: WorkerContext, batches: list, fetched: list) -> dict[str, float]:
        """Loss (each row's CTC loss per label, averaged over rows), word error rate (and
        character error rate when asked) of the greedy transcripts."""
        data = ctx.plan.data
        predictions = [item["text"] for item in self.decode(data, batches, fetched)]
        if isinstance(data, whisper_data.WhisperData):  # per label token, as Whisper's loss
            values = {"eval_loss": whisper.eval_loss(self.per_batch(batches, fetched))}
            expected = whisper.references(data)
        else:
            total = 0.0
            for (_, _, real), (losses, _) in self.per_batch(batches, fetched):
                total += float(losses.double().numpy()[:real].sum())
            values = {"eval_loss": total / max(data.eval.num_rows, 1)}
            expected = references(data)
        values.update(error_rates(data.text_metrics, expected, predictions))
        values["eval_rows"] = float(data.eval.num_rows)
        return values

    def decode(self, data: Any, batches: list, fetched: list) -> list[dict[str, str]]:
        """`{"text": ...}` for every clip of `data.eval`, in its order: the most probable
        token of each of its frames, repeats merged and blanks dropped by the tokenizer
        (`decode`, special tokens kept: as the ASR pipeline decodes CTC); Whisper's: its
        generated tokens (`whisper.decode`)."""
        if isinstance(data, whisper_data.WhisperData):
            return whisper.decode(data, self.per_batch(batches, fetched))
        split, tokenizer = data.eval, data.host
        texts = [""] * split.num_rows
        for (bucket_index, positions, real), (_, ids) in self.per_batch(batches, fetched):
            rows = split.buckets[bucket_index].rows[positions[:real]]
            for row, row_ids in zip(rows, ids[:real].numpy(), strict=True):
                # Frames of padding after a clip are not part of what it says.
                frames = (len(row_ids) if data.eval_frames is None
                          else int(data.eval_frames[row]))
                texts[row] = tokenizer.decode(row_ids[:frames].tolist(),
                                              skip_special_tokens=False)
        return [{"text": text} for text in texts]


def references(data: Any) -> list[str]:
    """The transcript of every row of `data.eval`, decoded from its labels without merging
    repeats (as Hugging Face's CTC fine-tuning decodes its references)."""
    tokenizer, split = data.host, data.eval
    texts = [""] * split.num_rows
    for bucket in split.buckets:
        labels = np.where(bucket.labels < 0, tokenizer.pad_token_id, bucket.labels)
        for row, text in zip(bucket.rows, tokenizer.batch_decode(labels.tolist(),
                                                                 group_tokens=False),
                             strict=True):
            texts[row] = text
    return texts


register_task(SpeechRecognition())
