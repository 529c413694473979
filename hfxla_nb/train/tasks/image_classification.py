"""Image classification: a class per image (any `...ForImageClassification` with its image
processor); accuracy, and top-5 accuracy for more than 5 classes; predictions as
`pipeline("image-classification")` gives them.

Kernel side: the model's image processor loaded; images (PIL images, `datasets.Image` values,
HWC uint8 arrays, file paths) read from each split, checked and made RGB; labels mapped to the
model's class ids; every image preprocessed to one resolution: float32 `pixel_values` in one
bucket per split. Also `predict`'s images, preprocessed alike. Nothing is forked or written
there; every refusal is a `FineTuneError` that says what to do. Pillow is imported lazily
(`pip install "hfxla_nb[vision]"`).

Light augmentation on the host (`fine_tune(..., augment=True)`): a random resized crop and a
horizontal flip of each training image, as torchvision's `RandomResizedCrop` and
`RandomHorizontalFlip` do, in NumPy. It runs on each training batch's processed
`pixel_values` before the upload: the values change, the shapes do not, so the step compiles
the same graph. The draws are a pure function of the generator the loop passes (seeded by the
run's seed, the step and the rank), so a rerun, and a resumed run, see the same images.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import batching, data, preparation
from ..config import FineTuneConfig, FineTuneError
from ..preparation import Prepared, Splits, TaskContext
from ..worker.evaluate import chance_accuracy, compute_metrics, row_losses
from . import register_task
from .base import Task, classifier_metric_names
from .classification import check_classes, head_kwargs

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image

    from ..batching import EncodedData, EncodedSplit
    from ..config import FineTuneConfig
    from ..predict import PredictContext
    from ..preparation import Prepared, Splits, TaskContext
    from ..worker.context import Batch, WorkerContext


# -- the kernel side: images read and preprocessed --

#: The image columns looked for, in order (`image` in most datasets, `img` in CIFAR-10).
IMAGE_COLUMNS = ("image", "img")
#: Images preprocessed per call of the image processor (bounds the host's peak memory).
CHUNK = 256
INSTALL = 'pip install "hfxla_nb[vision]"'


def pil() -> Any:
    """The `PIL.Image` module, or a `FineTuneError` naming the install line."""
    try:
        from PIL import Image
    except ImportError:
        raise FineTuneError(f"image classification needs Pillow, which is not installed: "
                            f"{INSTALL} (or pip install Pillow), then restart the "
                            "kernel.") from None
    return Image


def load_processor(given: Any, model: Any, source: Any) -> Any:
    """The image processor that preprocesses the images (carried in the plan as
    `plan.tokenizer` and saved with the model): `given` when it is one, else the one saved in
    the model's folder (or Hub id)."""
    pil()
    if given is not None and not isinstance(given, (str, os.PathLike)):
        return given
    where = given
    if where is None:
        where = source if isinstance(source, str) else getattr(model.config, "_name_or_path",
                                                                None)
    if not where:
        raise FineTuneError("the model instance does not say where its image processor is: "
                            "pass tokenizer=AutoImageProcessor.from_pretrained(...) (or its "
                            "folder).")
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(os.fspath(where))
    except Exception as error:  # noqa: BLE001 - say what to do, whatever failed
        reason = str(error).strip().splitlines()[0].rstrip(". ") if str(error) else "error"
        raise FineTuneError(
            f"could not load an image processor from {os.fspath(where)!r} ({reason}). Save "
            "the one the model was pretrained with next to it: AutoImageProcessor."
            "from_pretrained(<base model>).save_pretrained(folder), or pass "
            "tokenizer=<an image processor>."
        ) from None


def image_column(dataset: Any, config: FineTuneConfig, split: str) -> str:
    """`text_column` when it was set and names a column, else "image" or "img"."""
    present = list(dataset.column_names)
    wanted = [config.text_column] if config.text_column != "text" else list(IMAGE_COLUMNS)
    for column in wanted:
        if column in present:
            return column
    raise FineTuneError(
        f"the {split} data has no image column ({' or '.join(map(repr, wanted))}); its "
        f"columns are: {', '.join(map(repr, present)) or '(none)'}. Rename yours to 'image' "
        "or pass text_column=... with its name.")


def label_column(dataset: Any, config: FineTuneConfig, split: str) -> str:
    """`label_column` ("label" by default, else "labels" when the data has that)."""
    present = list(dataset.column_names)
    if config.label_column in present:
        return config.label_column
    if config.label_column == "label" and "labels" in present:
        return "labels"
    raise FineTuneError(
        f"the {split} data has no label column {config.label_column!r}; its columns are: "
        f"{', '.join(map(repr, present)) or '(none)'}. Image classification trains on a "
        "class per image: pass label_column=... with the name of yours.")


def to_rgb(value: Any, row: int, column: str | None, split: str) -> Image:
    """One image as an RGB PIL image; refused, naming the row (the input of `predict`: no
    column), when it cannot be one."""
    image = pil()
    where = f"row {row} of column {column!r} ({split})" if column else f"input {row}"
    if isinstance(value, image.Image):
        return value if value.mode == "RGB" else value.convert("RGB")
    if isinstance(value, dict) and (value.get("bytes") or value.get("path")):
        value = io.BytesIO(value["bytes"]) if value.get("bytes") else value["path"]
    if isinstance(value, (str, os.PathLike, io.BytesIO)):
        try:
            with image.open(value) as opened:
                return opened.convert("RGB")
        except (OSError, ValueError) as error:
            raise FineTuneError(f"{where} could not be read as an image ({error}). Pass "
                                "image files Pillow can open, PIL images or arrays.") from None
    if value is None:
        raise FineTuneError(f"{where} is empty (None): drop such rows first (dataset.filter("
                            f"lambda row: row[{column!r}] is not None)).")
    return _array_to_rgb(image, value, where)


def _array_to_rgb(image: Any, value: Any, where: str) -> Image:
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        array = np.asarray(None)
    if array.dtype == object or array.ndim not in (2, 3):
        raise FineTuneError(f"{where} holds a {type(value).__name__}, not an image: pass PIL "
                            "images, file paths, or height x width (x channels) arrays.")
    if array.ndim == 3 and array.shape[-1] not in (1, 3, 4):
        raise FineTuneError(
            f"{where} is an array of shape {array.shape}: {array.shape[-1]} channels, which "
            "cannot be made RGB. Pass height x width x 3 (RGB), x 4 (RGBA) or x 1 / height x "
            "width (grey) arrays (channels last: array.transpose(1, 2, 0) for channels "
            "first).")
    if not np.issubdtype(array.dtype, np.integer) or array.min() < 0 or array.max() > 255:
        raise FineTuneError(
            f"{where} is a {array.dtype} array, not 0..255 integers: convert it, e.g. "
            "(array * 255).round().astype('uint8') for floats in 0..1.")
    array = array.astype(np.uint8)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    return image.fromarray(array).convert("RGB")


def read_images(values: list, column: str | None, split: str) -> list[Image]:
    """Every value of an image column as an RGB PIL image."""
    return [to_rgb(value, row, column, split) for row, value in enumerate(values)]


def pixel_values(processor: Any, images: list[Image], split: str) -> np.ndarray:
    """`[rows, 3, H, W]` float32: the images preprocessed by the processor, at one
    resolution (refused when it leaves them at several: one shape is one graph)."""
    chunks = []
    for start in range(0, len(images), CHUNK):
        out = processor(images=images[start:start + CHUNK], return_tensors="np")
        chunks.append(np.asarray(out["pixel_values"], dtype=np.float32))
    shapes = sorted({chunk.shape[1:] for chunk in chunks})
    if len(shapes) > 1 or len(shapes[0]) != 3:
        raise FineTuneError(
            f"the image processor made {split} images of shapes {shapes}: one resolution is "
            "needed (one compiled graph). Use a processor that resizes to a fixed size, e.g. "
            "size={'height': 224, 'width': 224}.")
    return np.concatenate(chunks)


def one_split(name: str, pixels: np.ndarray, labels: np.ndarray) -> batching.EncodedSplit:
    """One bucket of every row: no token inputs (an empty int32 block), the class ids as the
    label column, the pixel values as the model's input field."""
    rows = len(labels)
    bucket = batching.Bucket(int(pixels.shape[-1]), np.zeros((rows, 0), np.int32),
                             labels.astype(np.int64), np.arange(rows),
                             {"pixel_values": pixels})
    return batching.EncodedSplit(name, [bucket], rows)


def prepare(splits: Splits, config: FineTuneConfig, context: TaskContext) -> Prepared:
    """Images and labels read and checked, preprocessed to one resolution, the head sized
    for the labels."""
    images, raw_labels, class_names = {}, {}, {}
    for split, ds in splits.named.items():
        column, label = image_column(ds, config, split), label_column(ds, config, split)
        raw_labels[split] = data.column_values(ds, label)
        class_names[split] = data.class_label_names(ds, label)
        images[split] = read_images(data.column_values(ds, column), column, split)
    try:
        model_names = data.meaningful_label_names(getattr(context.model_config, "id2label",
                                                          None))
        label_names, label_ids = data.map_labels(
            raw_labels, column=label, dataset_names=class_names, model_names=model_names,
            model_num_labels=context.fixed_labels)
    except data.DataError as error:
        raise FineTuneError(str(error)) from None
    check_classes(label_ids["train"], raw_labels["train"], label_names, label)
    preparation.check_batch_fits(config, len(images["train"]))
    pixels = {split: pixel_values(context.tokenizer, images[split], split) for split in images}
    if len({values.shape[1:] for values in pixels.values()}) > 1:
        raise FineTuneError("the image processor made images of different shapes in the "
                            "splits; use one that resizes to a fixed size.")
    encoded = {split: one_split(split, pixels[split], label_ids[split]) for split in pixels}
    side = int(pixels["train"].shape[-1])
    encoded_data = batching.EncodedData(
        train=encoded["train"], eval=encoded.get(splits.eval_name) if splits.eval_name else None,
        input_names=["pixel_values"], bucket_lengths=[side], label_names=list(label_names))
    kwargs = head_kwargs(context.model_config, context.fixed_labels, list(label_names), None)
    return Prepared(encoded_data, kwargs)


def prepare_predict(inputs: list[Any], context: PredictContext,
                    max_length: int | None) -> batching.EncodedData:
    """`predict`'s images, read and preprocessed as evaluation's (labels unknown: zeros)."""
    images = read_images(list(inputs), None, "predict")
    pixels = pixel_values(context.tokenizer, images, "predict")
    split = one_split("predict", pixels, np.zeros(len(images), np.int64))
    config = context.model_config
    names = [str(config.id2label[i]) for i in sorted(config.id2label, key=int)]
    return batching.EncodedData(train=None, eval=split, input_names=["pixel_values"],
                                bucket_lengths=[int(pixels.shape[-1])], label_names=names)


# -- light augmentation on the host --

#: The crop's share of the image's area, and its aspect ratio (width / height): torchvision's
#: defaults are (0.08, 1.0) and (3/4, 4/3); a lighter crop here, since small images lose their
#: class when cut to a twelfth.
SCALE = (0.6, 1.0)
RATIO = (3 / 4, 4 / 3)
#: The chance that an image is mirrored.
FLIP = 0.5


def crop_box(height: int, width: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """A random box `(top, left, box height, box width)` inside the image, of `SCALE` of its
    area and `RATIO` of aspect ratio (the whole image when ten draws find none that fits)."""
    area = height * width
    for _ in range(10):
        share = rng.uniform(*SCALE)
        ratio = np.exp(rng.uniform(np.log(RATIO[0]), np.log(RATIO[1])))
        box_w = int(round(np.sqrt(area * share * ratio)))
        box_h = int(round(np.sqrt(area * share / ratio)))
        if 0 < box_w <= width and 0 < box_h <= height:
            top = int(rng.integers(0, height - box_h + 1))
            left = int(rng.integers(0, width - box_w + 1))
            return top, left, box_h, box_w
    return 0, 0, height, width


def resized_crop(image: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    """`image` (`[channels, height, width]`) cut to `box` and resized back to its own size,
    bilinearly (pixel centres aligned, as torchvision's `antialias=False` resize)."""
    top, left, box_h, box_w = box
    channels, height, width = image.shape
    rows = top + (np.arange(height) + 0.5) * box_h / height - 0.5
    cols = left + (np.arange(width) + 0.5) * box_w / width - 0.5
    rows = np.clip(rows, top, top + box_h - 1)
    cols = np.clip(cols, left, left + box_w - 1)
    r0, c0 = np.floor(rows).astype(int), np.floor(cols).astype(int)
    r1, c1 = np.minimum(r0 + 1, top + box_h - 1), np.minimum(c0 + 1, left + box_w - 1)
    dr = (rows - r0).astype(image.dtype)[:, None]
    dc = (cols - c0).astype(image.dtype)
    # One axis at a time (rows, then columns): two gathers of whole rows or columns each.
    stretched = image[:, r0, :] * (1 - dr) + image[:, r1, :] * dr
    return stretched[:, :, c0] * (1 - dc) + stretched[:, :, c1] * dc


def augment_pixels(pixels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each image of `pixels` (`[rows, channels, height, width]`) randomly cropped, resized back
    and flipped left to right with probability `FLIP`; a new array, same shape and dtype.

    Args:
        pixels: a batch of processed images.
        rng: the draws' generator (the same generator state gives the same images).

    Returns:
        The augmented batch.
    """
    out = np.empty_like(pixels)
    _, _, height, width = pixels.shape
    for i, image in enumerate(pixels):
        image = resized_crop(image, crop_box(height, width, rng))
        out[i] = image[:, :, ::-1] if rng.random() < FLIP else image
    return out


# -- ImageClassification: the task's hooks --

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

    def eval_metric_names(self, config: FineTuneConfig) -> tuple[str, ...] | None:
        """Its loss and the metrics asked for by name (`base.classifier_metric_names`)."""
        return classifier_metric_names(config)

    pipeline_tag = "image-classification"
    eval_ahead = True
    takes_compute_metrics = True
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
        """The model's image processor (`load_processor`)."""
        return load_processor(given, model, source)

    # -- worker side -------------------------------------------------------------------------

    def augment(self, fields: dict[str, np.ndarray],
                rng: np.random.Generator) -> dict[str, np.ndarray]:
        """A random resized crop and flip of each image (`augment_pixels`)."""
        return {**fields, "pixel_values": augment_pixels(fields["pixel_values"],
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
                                      labels, num_labels, probabilities))
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

    # -- kernel side ---------------------------------------------------------------------------

    def prepare(self, splits: Splits, config: FineTuneConfig,
                context: TaskContext) -> Prepared:
        """Images and labels checked, preprocessed to one resolution (one bucket), the head
        sized for the labels."""
        return prepare(splits, config, context)

    def prepare_predict(self, inputs: list[Any], context: PredictContext,
                        max_length: int | None) -> EncodedData:
        """Images (PIL images, HWC uint8 arrays, file paths) preprocessed as evaluation's."""
        return prepare_predict(inputs, context, max_length)


register_task(ImageClassification())
