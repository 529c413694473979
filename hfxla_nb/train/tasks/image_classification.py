"""Image classification: a class per image (any `...ForImageClassification` with its image
processor); accuracy, and top-5 accuracy for more than 5 classes; predictions as
`pipeline("image-classification")` gives them. The kernel side (images read, checked,
preprocessed) is `image_data.py`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import FineTuneError
from ..worker.evaluate import chance_accuracy, compute_metrics, row_losses
from . import image_augment, image_data
from .base import Task
from .registry import register_task

if TYPE_CHECKING:
    import torch

    from ..batching import EncodedData, EncodedSplit
    from ..config import FineTuneConfig
    from ..kernel.preparation import Prepared, Splits, TaskContext
    from ..predict import PredictContext
    from ..worker.batch import Batch
    from ..worker.context import WorkerContext

#: Labels per prediction, and the k of top-k accuracy (fewer when the model has fewer), as
#: the image-classification pipeline's default top_k.
TOP_K = 5


def by_row(split: EncodedSplit, per_batch: list, index: int) -> np.ndarray:
    """One of the eval outputs (`index`) of every row of `split`, in the split's order;
    `per_batch` is `Task.per_batch`'s pairs."""
    values = None
    for (bucket_index, positions, real), outputs in per_batch:
        array = outputs[index].float().numpy()
        if values is None:
            values = np.empty((split.num_rows, *array.shape[1:]), dtype=array.dtype)
        values[split.buckets[bucket_index].rows[positions[:real]]] = array[:real]
    return values


def top_k_metrics(probabilities: np.ndarray, labels: np.ndarray,
                  num_labels: int) -> dict[str, float]:
    """`eval_top5_accuracy` when the model has more than `TOP_K` labels; else nothing: with
    `TOP_K` labels or fewer every label is in the top k, and the figure would be 1.0 always."""
    if num_labels <= TOP_K:
        return {}
    return {f"eval_top{TOP_K}_accuracy": top_k_accuracy(probabilities, labels, TOP_K)}


def top_k_accuracy(probabilities: np.ndarray, labels: np.ndarray, k: int) -> float:
    """The fraction of rows whose label is among their `k` most probable classes."""
    top = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    return float((top == labels[:, None]).any(axis=1).mean())


class ImageClassification(Task):
    """Image classification: a class per image; accuracy, and top-5 accuracy for more than 5
    classes."""

    name = "image-classification"
    pipeline_tag = "image-classification"
    eval_ahead = True
    auto_class = "AutoModelForImageClassification"
    head_suffixes = ("ForImageClassification",)
    title = "image classification"
    shows_labels = True
    predict_example = "[PIL.Image.open('cat.jpg')]"
    outputs_per_batch = 2
    augments = True
    processor = "image processor"
    reads_sequences = False  # pixels in patches: no attention mask, no packed rows

    def check_model(self, model_config: Any, names: list[str]) -> None:
        """Refuse a model that does not take RGB images: the images are made RGB."""
        channels = getattr(model_config, "num_channels", 3)
        if channels != 3:
            raise FineTuneError(
                f"the model takes images of {channels} channels; task='image-classification' "
                "feeds it RGB images (3 channels). Pass a model with num_channels=3.")

    def load_processor(self, given: Any, model: Any, source: Any) -> Any:
        """The model's image processor (`image_data.load_processor`)."""
        return image_data.load_processor(given, model, source)

    # -- worker side -------------------------------------------------------------------------

    def augment(self, fields: dict[str, np.ndarray],
                rng: np.random.Generator) -> dict[str, np.ndarray]:
        """A random resized crop and flip of each image (`image_augment.augment_pixels`)."""
        return {**fields, "pixel_values": image_augment.augment_pixels(fields["pixel_values"],
                                                                       rng)}

    def train_loss(self, ctx: WorkerContext, batch: Batch) -> torch.Tensor:
        import torch

        logits = ctx.logits(batch)
        return torch.nn.functional.cross_entropy(logits, batch.tokens[:, -1].long())

    def eval_outputs(self, ctx: WorkerContext, batch: Batch) -> list[torch.Tensor]:
        import torch

        logits = ctx.logits(batch)
        # The probabilities hold the prediction and the top-k: argmax and top-k on the host.
        return [row_losses(logits, batch), torch.softmax(logits, dim=-1)]

    def chance_accuracy(self, split: EncodedSplit | None) -> float | None:
        """Always predicting `split`'s most frequent label (`evaluate.chance_accuracy`)."""
        return chance_accuracy(split)

    def eval_metrics(self, ctx: WorkerContext, batches: list, fetched: list) -> dict[str, float]:
        """Loss, the config's metrics (accuracy by default) and, for a model of more than 5
        labels, top-5 accuracy (`top_k_metrics`)."""
        split, plan = ctx.plan.data.eval, ctx.plan
        pairs = self.per_batch(batches, fetched)
        row_losses = by_row(split, pairs, 0).astype(np.float64)
        probabilities = by_row(split, pairs, 1)
        labels = np.empty(split.num_rows, dtype=np.int64)
        for bucket in split.buckets:
            labels[bucket.rows] = bucket.labels
        num_labels = len(plan.data.label_names)
        values = {"eval_loss": float(row_losses.mean())}
        values.update(compute_metrics(plan.metrics, probabilities.argmax(-1).astype(np.int64),
                                      labels, num_labels))
        values.update(top_k_metrics(probabilities, labels, num_labels))
        values["eval_rows"] = float(split.num_rows)
        return values

    def decode(self, data: Any, batches: list, fetched: list) -> list[dict[str, Any]]:
        """Each image's label and score, and its top 5 labels as the image-classification
        pipeline gives them (`top`: `[{"label", "score"}, ...]`, most probable first)."""
        probabilities = by_row(data.eval, self.per_batch(batches, fetched), 1)
        names = data.label_names
        k = min(TOP_K, len(names))
        out = []
        for p in probabilities:
            order = np.argsort(-p, kind="stable")[:k]
            top = [{"label": names[int(i)], "score": float(p[i])} for i in order]
            out.append({"label": top[0]["label"], "score": top[0]["score"], "top": top})
        return out

    def prediction_table(self, predictions: list[dict[str, Any]]
                         ) -> tuple[list[dict[str, Any]], list[str] | None]:
        """One row per image and candidate label, most probable first."""
        rows = [{"input": i, "rank": rank, **candidate}
                for i, item in enumerate(predictions)
                for rank, candidate in enumerate(item["top"], start=1)]
        return rows, ["input", "rank", "label", "score"]

    # -- kernel side (image_data.py) ---------------------------------------------------------

    def prepare(self, splits: Splits, config: FineTuneConfig,
                context: TaskContext) -> Prepared:
        """Images and labels checked, preprocessed to one resolution (one bucket), the head
        sized for the labels."""
        return image_data.prepare(splits, config, context)

    def prepare_predict(self, inputs: list[Any], context: PredictContext,
                        max_length: int | None) -> EncodedData:
        """Images (PIL images, HWC uint8 arrays, file paths) preprocessed as evaluation's."""
        return image_data.prepare_predict(inputs, context, max_length)


register_task(ImageClassification())
