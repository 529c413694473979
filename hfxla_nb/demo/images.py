"""The embedded default for image classification, offline: drawn images and a tiny ViT.

```python
from hfxla_nb.demo.images import demo_image_dataset, demo_vit_model_dir
result = hx.fine_tune(demo_vit_model_dir(), demo_image_dataset(), task="image-classification")
```

The images are 32x32 RGB pictures drawn with NumPy from a seed: horizontal stripes, vertical
stripes, or a filled square, each in random colours with noise, so that the class is in the
shapes and not in the colours. The model is a 2-layer `ViTForImageClassification` built from a
config (8x8 patches), saved with its `ViTImageProcessor` (32x32, no crop), so demos and tests
go through the real `from_pretrained(folder)` and `AutoImageProcessor` loading paths.
Needs Pillow (`pip install "hfxla_nb[vision]"`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import RECIPE_VERSION, build_atomically, cache_dir, save_seeded_model

if TYPE_CHECKING:
    import datasets

#: The demo's classes, in `ClassLabel` order.
IMAGE_LABELS = ("horizontal stripes", "vertical stripes", "square")
#: The side of the demo images and of the tiny ViT's input.
IMAGE_SIZE = 32


def demo_images(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`n` drawn images `[n, 32, 32, 3]` uint8 and their class ids `[n]` (classes in turn,
    then shuffled), a pure function of `seed`."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % len(IMAGE_LABELS))
    images = np.empty((n, IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)
    for i, label in enumerate(labels):
        images[i] = _draw(int(label), rng)
    return images, labels.astype(np.int64)


def _draw(label: int, rng: np.random.Generator) -> np.ndarray:
    size = IMAGE_SIZE
    # Two colours far enough apart in brightness that the shape survives the noise.
    dark = rng.integers(0, 90, 3)
    light = rng.integers(165, 256, 3)
    low, high = (dark, light) if rng.random() < 0.5 else (light, dark)
    if label == 2:  # a filled square on a plain background
        side = int(rng.integers(10, 20))
        top, left = rng.integers(0, size - side, 2)
        mask = np.zeros((size, size), bool)
        mask[top:top + side, left:left + side] = True
    else:  # stripes 2 or 3 pixels wide, any phase
        width = int(rng.integers(2, 4))
        bands = (np.arange(size) + int(rng.integers(0, 2 * width))) // width % 2 == 1
        mask = np.repeat(bands[:, None], size, 1) if label == 0 else np.repeat(
            bands[None, :], size, 0)
    image = np.where(mask[..., None], high, low).astype(np.int64)
    image += rng.integers(-25, 26, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def demo_image_dataset(n: int = 480, seed: int = 0,
                       validation: float = 0.2) -> datasets.DatasetDict:
    """A labeled image-classification dataset, drawn deterministically, no download.

    Args:
        n: total rows over both splits.
        seed: the images are a pure function of it.
        validation: the fraction of rows in the validation split.

    Returns:
        `datasets.DatasetDict` with "train" and "validation" splits and the columns `image`
        (a `datasets.Image`: PIL images when read) and `label` (`ClassLabel` of
        `IMAGE_LABELS`).

    Example:

    ```python
    >>> demo_image_dataset(30)["train"].features["label"].names
    ['horizontal stripes', 'vertical stripes', 'square']
    ```
    """
    import datasets

    if n < 10:
        raise ValueError(f"n must be at least 10 so that both splits have rows, got {n}.")
    images, labels = demo_images(n, seed)
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=list(IMAGE_LABELS))})
    cut = n - max(1, int(n * validation))
    pictures = [_pil_image(image) for image in images]
    return datasets.DatasetDict({
        name: datasets.Dataset.from_dict(
            {"image": pictures[start:stop], "label": labels[start:stop].tolist()},
            features=features)
        for name, (start, stop) in {"train": (0, cut), "validation": (cut, n)}.items()
    })


def _pil_image(array: np.ndarray):
    try:
        from PIL import Image
    except ImportError:
        raise ImportError('the image demo needs Pillow: pip install "hfxla_nb[vision]"') from None
    return Image.fromarray(array, "RGB")


def demo_vit_model_dir(cache: str | os.PathLike | None = None, seed: int = 0) -> str:
    """A tiny `ViTForImageClassification` (32x32 inputs, 8x8 patches, 2 layers, a head for
    `IMAGE_LABELS`) and its `ViTImageProcessor`, written to a versioned cache folder.

    Args:
        cache: cache folder (see `hfxla_nb.demo.cache_dir`).
        seed: the initial weights are a pure function of it.

    Returns:
        The folder, as a string: `AutoModelForImageClassification.from_pretrained(folder)`
        and `AutoImageProcessor.from_pretrained(folder)` load it offline.
    """
    target = cache_dir(cache) / f"demo-vit-v{RECIPE_VERSION}-{IMAGE_SIZE}px-seed{seed}"
    if (target / "config.json").is_file() and (target / "preprocessor_config.json").is_file():
        return str(target)

    def build(tmp: Path) -> None:
        from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

        config = ViTConfig(image_size=IMAGE_SIZE, patch_size=8, num_channels=3, hidden_size=32,
                           num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           num_labels=len(IMAGE_LABELS))
        processor = ViTImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
        save_seeded_model(ViTForImageClassification, config, seed, processor, tmp)

    return str(build_atomically(target, build))
