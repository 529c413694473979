"""The worker side of `fine_tune(task="speech-recognition")` for Whisper: what
`speech_recognition.SpeechRecognition` does when its data is `whisper_data.WhisperData`.

Training is teacher-forced in one graph: the features and the labels (prompt, transcript,
end token, -100 after) go in, and the model shifts the labels right into its decoder
inputs. Evaluation computes each row's loss in the graph of the encoder, then generates
greedily at fixed shapes (`seq2seq_generation.py`, as seq2seq evaluation does: the decoder
prompt written first, then one graph per token, the same graph every token), so a run's
evaluation compiles two graphs however many tokens and batches. The host decodes the tokens
(special tokens dropped, as `pipeline("automatic-speech-recognition")` decodes Whisper's)
and scores them with jiwer's word error rate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .seq2seq import generate_synced
from .seq2seq_generation import generated_texts
from .speech_data import IGNORE
from .whisper_data import FEATURES_INPUT, WhisperData

if TYPE_CHECKING:
    import torch

    from ..worker.batch import Batch
    from ..worker.context import WorkerContext


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
