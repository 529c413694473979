"""fine_tune(task="image-classification") and predict on real XLA:CPU over 4 virtual devices:
a tiny ViT learns drawn images (stripes one way or the other, a square), in exactly one
training and one evaluation graph; predict on the saved model gives what
`pipeline("image-classification")` gives on the CPU; PIL images, arrays and files predict
alike; bad input is refused before anything is forked or written."""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest

import hfxla_nb as hx
from hfxla_nb import _xla
from hfxla_nb.demo.images import IMAGE_LABELS, demo_image_dataset, demo_vit_model_dir
from hfxla_nb.train import FineTuneError, prepare_fine_tune
from hfxla_nb.train.tasks.base import TASKS
from hfxla_nb.train.tasks.image_classification import top_k_accuracy, top_k_metrics
from tests.helpers import refuse_launches

ROWS = 480  # 384 train, 96 validation


@pytest.fixture(scope="module")
def vit(cache, tmp_path_factory):
    """One fine-tune and one predict launch for every test of this file."""
    data = demo_image_dataset(ROWS)
    folder = tmp_path_factory.mktemp("vit")
    result = hx.fine_tune(demo_vit_model_dir(cache=cache), data, batch_size=32, max_steps=100,
                          learning_rate=3e-3, num_processes=4, output_dir=folder / "out",
                          progress=False, compute_metrics=argmax_accuracy)
    images = list(data["validation"]["image"])
    # The other forms predict takes: a HWC uint8 array and a file path, of the first image.
    images[0].save(folder / "first.png")
    inputs = [*images, np.asarray(images[0]), str(folder / "first.png")]
    predicted = result.predict(inputs, progress=False)
    return result, data, predicted


def argmax_accuracy(prediction):
    """A Trainer-style `compute_metrics`."""
    return {"argmax_accuracy": float((prediction.predictions.argmax(-1)
                                      == prediction.label_ids).mean())}


@pytest.mark.launch
def test_it_learns_the_drawn_images(vit):
    result, _, _ = vit
    assert result.task == "image-classification"  # task="auto", from the ViT's head
    assert result.metrics["eval_accuracy"] >= 0.9  # chance: 1/3
    assert result.metrics["eval_argmax_accuracy"] == result.metrics["eval_accuracy"]
    assert "eval_top5_accuracy" not in result.metrics  # 3 labels: every one is in a top 5
    assert result.metrics["eval_rows"] == ROWS // 5
    assert result.loss_history[-1][1] < 0.5 * result.loss_history[0][1]


@pytest.mark.launch
def test_the_result_offers_the_image_processor_and_notes_no_text_model_patch(vit):
    from hfxla_nb.ui.panels import next_step

    result, _, _ = vit
    hint = next_step(result)
    assert "result.load_processor()" in hint and "image processor" in hint
    assert "load_tokenizer" not in hint and "tokenizer" not in hint
    assert type(result.load_processor()).__name__.startswith("ViTImageProcessor")
    patched = [note for note in result.notes if note.startswith("patched for XLA")]
    for text_patch in ("bidirectional_mask", "causal_mask", "packed_sequences"):
        assert not any(text_patch in note for note in patched), patched


@pytest.mark.launch
def test_compile_contract(vit):
    result, _, predicted = vit
    # One resolution, one bucket: one training and one evaluation graph; predict one.
    assert result.compiles == 1 and result.eval_compiles == 1
    assert result.bucket_lengths == [32]
    assert predicted.compiles == 1


@pytest.mark.launch
def test_predict_equals_the_pipeline_on_the_cpu(vit):
    from transformers import AutoImageProcessor, pipeline

    result, data, predicted = vit
    validation = data["validation"]
    classify = pipeline("image-classification", model=result.output_dir, device="cpu",
                        image_processor=AutoImageProcessor.from_pretrained(result.output_dir))
    expected = classify(list(validation["image"]), top_k=len(IMAGE_LABELS))
    for item, reference in zip(predicted, expected, strict=False):
        assert item["label"] == reference[0]["label"]
        assert [c["label"] for c in item["top"]] == [c["label"] for c in reference]
        assert [c["score"] for c in item["top"]] == pytest.approx(
            [c["score"] for c in reference], abs=1e-4)
    # Evaluation's accuracy is that of the predictions on the same images.
    names = validation.features["label"].names
    hits = [item["label"] == names[label] for item, label in zip(predicted, validation["label"],
                                                                  strict=False)]
    assert result.metrics["eval_accuracy"] == pytest.approx(float(np.mean(hits)), abs=1e-12)
    frame = predicted.to_dataframe()
    assert list(frame.columns) == ["input", "rank", "label", "score"]
    assert len(frame) == len(predicted) * len(IMAGE_LABELS)


@pytest.mark.launch
def test_an_array_and_a_file_predict_as_their_image(vit):
    _, _, predicted = vit
    first, array, path = predicted[0], predicted[-2], predicted[-1]
    for other in (array, path):
        assert other["label"] == first["label"]
        assert other["score"] == pytest.approx(first["score"], abs=1e-6)


def test_top_5_accuracy_is_reported_only_for_more_than_5_labels():
    rng = np.random.default_rng(0)
    labels = np.arange(8) % 3
    assert top_k_metrics(rng.random((8, 3)), labels, 3) == {}
    assert top_k_metrics(rng.random((8, 5)), labels, 5) == {}
    probabilities = rng.random((8, 7))
    assert top_k_metrics(probabilities, labels, 7) == {
        "eval_top5_accuracy": top_k_accuracy(probabilities, labels, 5)}


def test_top_k_accuracy_counts_a_label_among_the_k_most_probable():
    probabilities = np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.3, 0.2]])
    labels = np.array([0, 0, 3])
    assert top_k_accuracy(probabilities, labels, 1) == pytest.approx(1 / 3)
    assert top_k_accuracy(probabilities, labels, 3) == pytest.approx(1 / 3)
    assert top_k_accuracy(probabilities, labels, 4) == 1.0


def test_images_are_one_float32_field_at_the_processors_resolution(cache):
    data = demo_image_dataset(40)
    plan = prepare_fine_tune(demo_vit_model_dir(cache=cache), data, batch_size=8,
                             output_dir=None)
    bucket = plan.data.train.buckets[0]
    assert plan.task == "image-classification" and len(plan.data.train.buckets) == 1
    assert plan.data.input_names == ["pixel_values"]
    pixels = bucket.fields["pixel_values"]
    assert pixels.dtype == np.float32 and pixels.shape == (32, 3, 32, 32)
    assert bucket.inputs.shape == (32, 0)  # no token inputs: the class id is the one column
    assert bucket.labels.tolist() == data["train"]["label"]
    assert plan.data.label_names == list(IMAGE_LABELS)
    expected = plan.tokenizer(images=data["train"][0]["image"], return_tensors="np")
    assert np.array_equal(pixels[0], expected["pixel_values"][0])


def _rows(n: int = 16, image=None) -> list[dict]:
    data = demo_image_dataset(n + n // 4 + 1)["train"]
    return [{"image": np.asarray(row["image"]) if image is None else image, "label": row["label"]}
            for row in data.select(range(n))]


def _model_without_processor(cache, tmp_path):
    folder = tmp_path / "no-processor"
    shutil.copytree(demo_vit_model_dir(cache=cache), folder)
    (folder / "preprocessor_config.json").unlink()
    return folder


BAD = {
    "two channels": (lambda c, t: demo_vit_model_dir(cache=c),
                     lambda: _rows(image=np.zeros((32, 32, 2), np.uint8)),
                     "2 channels, which cannot be made RGB"),
    "no label column": (lambda c, t: demo_vit_model_dir(cache=c),
                        lambda: [{"image": row["image"]} for row in _rows()],
                        "has no label column 'label'; its columns are: 'image'"),
    "no image column": (lambda c, t: demo_vit_model_dir(cache=c),
                        lambda: [{"picture": row["image"], "label": row["label"]}
                                 for row in _rows()],
                        "has no image column ('image' or 'img')"),
    "no image processor": (_model_without_processor, _rows,
                           "could not load an image processor from"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_refused_before_anything_happens(case, cache, tmp_path, monkeypatch):
    refuse_launches(monkeypatch)
    model, rows, message = BAD[case]
    model = model(cache, tmp_path / "models")
    with pytest.raises(FineTuneError) as raised:
        hx.fine_tune(model, rows(), task="image-classification", batch_size=4,
                     output_dir=tmp_path / "out", progress=False)
    assert message in str(raised.value)
    assert not (tmp_path / "out").exists()
    assert not _xla.runtime_is_initialized()


def test_without_pillow_the_error_names_the_install_line(cache, monkeypatch):
    model = demo_vit_model_dir(cache=cache)
    monkeypatch.setitem(sys.modules, "PIL", None)  # `from PIL import Image` fails
    # The task's first kernel step (datasets itself reads no images without Pillow).
    with pytest.raises(FineTuneError, match=r'pip install "hfxla_nb\[vision\]"'):
        TASKS["image-classification"].load_processor(None, model, model)


@pytest.mark.launch
def test_augmentation_keeps_the_graphs_and_still_learns(vit, cache):
    """augment=True: every training image cropped and flipped on the host, each step; the
    values change (another loss history), the shapes do not (the same two graphs)."""
    plain, data, _ = vit
    result = hx.fine_tune(demo_vit_model_dir(cache=cache), data, batch_size=32, max_steps=100,
                          learning_rate=3e-3, num_processes=4, output_dir=None,
                          progress=False, augment=True)
    assert result.compiles == 1 and result.eval_compiles == 1
    assert result.metrics["eval_accuracy"] >= 0.9  # chance: 1/3
    assert [step for step, _ in result.loss_history] == [s for s, _ in plain.loss_history]
    assert result.loss_history != plain.loss_history


def test_augment_is_refused_for_a_task_without_it(cache, tmp_path):
    from hfxla_nb.demo import demo_dataset
    from hfxla_nb.demo.tasks import classifier_model_dir

    with pytest.raises(FineTuneError, match="augment=True is for image classification"):
        prepare_fine_tune(classifier_model_dir(cache=cache), demo_dataset(n=40), batch_size=8,
                          augment=True, output_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(FineTuneError, match="augment must be True or False"):
        hx.FineTuneConfig(augment="yes")


def test_an_imagefolder_dataset_is_read_as_load_dataset_gives_it(cache, tmp_path):
    """`load_dataset("imagefolder", data_dir=...)`, the layout of the image notebook's own data
    (a folder per split, a folder per class): its ClassLabel names become the labels."""
    import datasets

    images = demo_image_dataset(40)
    for split in ("train", "validation"):
        for k, row in enumerate(images[split]):
            folder = tmp_path / "pictures" / split / IMAGE_LABELS[row["label"]].replace(" ", "_")
            folder.mkdir(parents=True, exist_ok=True)
            row["image"].save(folder / f"{k}.png")
    loaded = datasets.load_dataset("imagefolder", data_dir=str(tmp_path / "pictures"),
                                   cache_dir=str(tmp_path / "hf-cache"))
    assert set(loaded) == {"train", "validation"}
    plan = prepare_fine_tune(demo_vit_model_dir(cache=cache), loaded, batch_size=8,
                             output_dir=None)
    assert plan.task == "image-classification"
    assert plan.data.label_names == sorted(name.replace(" ", "_") for name in IMAGE_LABELS)
    assert plan.data.train.num_rows == len(images["train"])
    assert plan.data.train.buckets[0].fields["pixel_values"].shape[1:] == (3, 32, 32)
