"""The kernel side of `fine_tune(task="image-classification")`: the model's image processor
loaded, images (PIL images, `datasets.Image` values, HWC uint8 arrays, file paths) read from
each split, checked and made RGB, labels mapped to the model's class ids, and every image
preprocessed by the image processor to one resolution: float32 `pixel_values` in one bucket
per split. Also `predict`'s images, preprocessed alike.

Nothing is forked or written here; every refusal is a `FineTuneError` that says what to do.
Pillow is imported here only, lazily (`pip install "hfxla_nb[vision]"`).
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import batching
from ..config import FineTuneConfig, FineTuneError
from ..kernel import data, steps
from ..kernel.preparation import Prepared, Splits, TaskContext
from .classification_data import check_classes, head_kwargs

if TYPE_CHECKING:
    from PIL.Image import Image

    from ..predict import PredictContext

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
    steps.check_batch_fits(config, len(images["train"]))
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
