"""`make compat`'s fixed subset in CI (`compat/run.py`): an encoder, a decoder, a mixture of
experts, an encoder-decoder and a vision model, each as its checkpoint ships (sizes shrunk),
fine-tuned with its steps replayed and traced (equal losses), then predicting; and the table's
families and rows as docs/compatibility.md promises them."""

from __future__ import annotations

import re

import pytest

from compat.families import FAMILIES
from compat.run import Row, run_family, table

SUBSET = {("BERT", "classification"), ("Llama 3.2", "causal-lm"), ("Mixtral", "causal-lm"),
          ("BART", "seq2seq"), ("ResNet", "image-classification")}


def test_the_table_covers_forty_families_and_every_task():
    assert len({family.name for family in FAMILIES}) >= 40
    assert {family.task for family in FAMILIES} >= {
        "classification", "token-classification", "question-answering", "causal-lm",
        "seq2seq", "speech-recognition", "audio-classification", "image-classification"}
    assert sum(family.lora for family in FAMILIES) >= 3
    assert any(family.lora and {"num_local_experts", "num_experts"} & set(family.shipped)
               for family in FAMILIES)  # LoRA on a mixture of experts


@pytest.mark.launch
@pytest.mark.parametrize("name,task", sorted(SUBSET))
def test_a_family_as_it_ships_fine_tunes_replays_as_traced_and_predicts(name, task):
    family = next(f for f in FAMILIES if (f.name, f.task) == (name, task) and not f.lora)
    row = run_family(family)
    assert row.works == "yes", row.works
    assert row.predict == "yes", row.predict
    assert row.equal == "yes"  # the losses of the replayed steps are the traced ones
    assert re.fullmatch(r"\d+\.\d / \d+\.\d", row.host), row.host  # host ms per step, both runs
    # ResNet's batch norm moves its statistics in place: its steps are traced, said so. BART's
    # `shared` embedding (the encoder and decoder hold their own) gets no gradient: it is read
    # as it is, and the steps are replayed.
    expected = {"ResNet": "traced: the step changes a weight in place"}.get(name, "replayed")
    assert row.steps.startswith(expected), row.steps
    text = table([row], 0.1)
    assert f"| {family.row} | `{family.checkpoint}` | {task} | yes |" in text


@pytest.mark.launch
def test_a_model_whose_second_trace_differs_traces_every_shape_and_trains_as_traced():
    """wav2vec2 with SpecAugment and LayerDrop off: its two audio lengths are two shapes, and
    each shape's second step traces another graph than its first. Once one shape says so, no
    other shape's step runs by its graph either (a step traced after one run by its graph
    read a buffer that run had given away, and the worker died)."""
    import dataclasses

    family = next(f for f in FAMILIES if f.name == "wav2vec2")
    family = dataclasses.replace(family, shipped={**family.shipped, "mask_time_prob": 0.0,
                                                  "layerdrop": 0.0})
    row = run_family(family)
    assert row.works == "yes", row.works
    assert row.equal == "yes" and row.predict == "yes"
    assert "another shape's steps: its second step traced another graph" in row.steps, row.steps


@pytest.mark.launch
def test_evaluations_that_decode_during_training_leave_the_traced_loop_s_losses(tmp_path):
    """BART as it ships (dropout 0.1) evaluated every 4 steps: the evaluation decodes, its
    tokens run by their compiled graph, each moving the device's seed as a traced token's sync
    does, so the training's dropout after it, and its losses, are the traced loop's."""
    import hfxla_nb as hx
    from compat.run import BATCH, build

    family = next(f for f in FAMILIES if (f.name, f.task) == ("BART", "seq2seq"))
    data, options, _ = build(family, tmp_path / "model")
    runs = [hx.fine_tune(str(tmp_path / "model"), data, task="seq2seq", max_steps=10,
                         batch_size=BATCH, log_every=1, learning_rate=1e-3, progress=False,
                         keep_warm=False, output_dir=None, eval_strategy="steps",
                         eval_steps=4, compiled_steps=compiled, **options)
            for compiled in (True, False)]
    assert runs[0].compiled_steps and set(runs[0].compiled_steps.values()) == {"replayed"}
    assert runs[0].loss_history == runs[1].loss_history


def test_a_row_that_fails_shows_the_first_line_of_its_error():
    row = Row(FAMILIES[0], works="ValueError: no such thing")
    assert "| ValueError: no such thing |" in table([row], 0.1)
