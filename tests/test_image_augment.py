"""`fine_tune(..., augment=True)`'s image augmentation, on the host: a random resized crop and a
flip of each image, the shapes and dtype kept, a pure function of the generator's seed."""

from __future__ import annotations

import numpy as np
import pytest

from hfxla_nb.train.tasks import image_classification


def _pixels(rows: int = 8, side: int = 32) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((rows, 3, side, side)).astype(np.float32)


def test_the_same_seed_gives_the_same_images_and_another_seed_others():
    pixels = _pixels()
    first = image_classification.augment_pixels(pixels, np.random.default_rng([0, 5, 1]))
    again = image_classification.augment_pixels(pixels, np.random.default_rng([0, 5, 1]))
    other = image_classification.augment_pixels(pixels, np.random.default_rng([0, 6, 1]))
    assert first.shape == pixels.shape and first.dtype == np.float32
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)
    assert not np.array_equal(first, pixels)


def test_a_box_of_the_whole_image_gives_the_image_back():
    image = _pixels(1)[0]
    assert np.allclose(image_classification.resized_crop(image, (0, 0, 32, 32)), image, atol=1e-6)


def test_a_crop_is_the_box_stretched_to_the_whole_image():
    # A ramp along the width: the left half's box, stretched, runs over the left half's values.
    image = np.broadcast_to(np.arange(32, dtype=np.float32), (3, 32, 32)).copy()
    stretched = image_classification.resized_crop(image, (0, 0, 32, 16))
    assert stretched[0, 0, 0] == 0 and stretched[0, 0, -1] == 15
    assert np.all(np.diff(stretched[0, 0]) >= 0) and stretched.shape == (3, 32, 32)


def test_boxes_stay_inside_and_keep_the_area_and_ratio_asked():
    rng = np.random.default_rng(1)
    for _ in range(200):
        top, left, height, width = image_classification.crop_box(32, 40, rng)
        assert 0 <= top and top + height <= 32 and 0 <= left and left + width <= 40
        share = height * width / (32 * 40)
        if (height, width) != (32, 40):
            low, high = image_classification.SCALE
            assert low - 0.05 <= share <= high + 0.05
            assert 0.7 <= width / height <= 1.4


def test_about_half_the_images_are_mirrored(monkeypatch):
    monkeypatch.setattr(image_classification, "crop_box", lambda h, w, rng: (0, 0, h, w))
    pixels = _pixels(200, side=8)
    out = image_classification.augment_pixels(pixels, np.random.default_rng(3))
    mirrored = [bool(np.allclose(o, p[:, :, ::-1])) for o, p in zip(out, pixels, strict=True)]
    kept = [bool(np.allclose(o, p)) for o, p in zip(out, pixels, strict=True)]
    assert all(m != k for m, k in zip(mirrored, kept, strict=True))
    assert sum(mirrored) == pytest.approx(100, abs=25)
