"""Audio classification: a label per clip (`...ForAudioClassification` heads, and wav2vec2's
`...ForSequenceClassification`); accuracy. The clips are the float32 waveform field of each
bucket (`audio_data.py`); the worker hooks are sequence classification's, the class id the
batch's one label column."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from . import audio_data
from .classification import Classification
from .registry import register_task

if TYPE_CHECKING:
    import torch

    from ..batching import EncodedData
    from ..config import FineTuneConfig
    from ..kernel.preparation import Prepared, Splits, TaskContext
    from ..predict import PredictContext
    from ..worker.batch import Batch
    from ..worker.context import WorkerContext

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
    columns = (audio_data.AUDIO_COLUMN,)
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
        return audio_data.load_feature_extractor(given, model, source)

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
        return audio_data.prepare(splits, config, context)

    def prepare_predict(self, inputs: list[Any], context: PredictContext,
                        max_length: int | None) -> EncodedData:
        """Clips, bucketed by duration like evaluation rows."""
        return audio_data.prepare_predict(inputs, context, max_length)


register_task(AudioClassification())
