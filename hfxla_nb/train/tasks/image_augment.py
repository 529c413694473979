"""Light augmentation of training images on the host (`fine_tune(..., augment=True)`): a random
resized crop and a horizontal flip of each image, as the image-classification notebook's
torchvision `RandomResizedCrop` and `RandomHorizontalFlip` do, in NumPy.

It runs on the processed `pixel_values` (`[rows, channels, height, width]`, float32) of each
training batch, after the rows are picked and before the upload: the values change, the shapes
do not, so the step compiles the graph it compiles without augmentation. The draws are a pure
function of the generator the loop passes (seeded by the run's seed, the step and the rank), so
a rerun, and a resumed run, see the same images.
"""

from __future__ import annotations

import numpy as np

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
