"""Results as tables a person reads: `predict`'s answers one row per input with rounded
scores (exact in the data), the loss chart's step labels apart, counts whole, and
token classification's per-entity metrics as one grid.

Plain data in, strings out: `Predictions` and `FineTuneResult` are built directly, nothing is
trained or launched.
"""

from __future__ import annotations

from hfxla_nb.train.predict import Predictions
from hfxla_nb.train.result import FineTuneResult
from hfxla_nb.ui.panels import (
    MAX_ROWS,
    is_count,
    metric_value,
    predictions_html,
    predictions_text,
    result_html,
    result_text,
    split_entity_metrics,
    step_axis_html,
)
from tests.helpers import Elements, formatted_by_a_shell

SCORES = [0.987654321, 0.123456789, 0.5]


def predictions(task: str, items: list[dict]) -> Predictions:
    out = Predictions(items)
    out.task, out.compiles, out.seconds = task, 1, 0.52
    return out


def classified(count: int = 3) -> Predictions:
    return predictions("classification", [
        {"label": "positive" if i % 2 else "negative", "score": SCORES[i % 3],
         "probabilities": {"negative": 1 - SCORES[i % 3], "positive": SCORES[i % 3]}}
        for i in range(count)])


def result(metrics: dict[str, float], **changes) -> FineTuneResult:
    values = dict(
        output_dir="/runs/ner", loss_history=[(10, 2.5), (35, 1.0), (60, 0.5)],
        metrics=metrics, steps=60, epochs=1.0, samples_per_second=100.0, train_seconds=3.0,
        compiles=1, eval_compiles=1, executions_per_step=1.0, transfers_per_step=0.1,
        label_names=["O", "B-PER", "I-PER"], strategy="spmd", devices=4, precision="fp32",
        bucket_lengths=[64], launch_seconds=5.0, task="token-classification")
    values.update(changes)
    return FineTuneResult(**values)


def ner_metrics() -> dict[str, float]:
    metrics = {"eval_loss": 0.123456, "eval_precision": 0.9, "eval_recall": 0.8,
               "eval_f1": 0.85, "eval_accuracy": 0.97}
    for kind, count in (("LOC", 53.0), ("MISC", 20.0), ("ORG", 41.0), ("PER", 37.0)):
        metrics.update({f"eval_{kind}_precision": 0.912345, f"eval_{kind}_recall": 0.8,
                        f"eval_{kind}_f1": 0.851234, f"eval_{kind}_entities": count})
    metrics["eval_rows"] = 300.0
    return metrics


def test_scores_are_rounded_by_one_rule_in_the_predictions_and_the_metrics():
    # One formatter (ui.state.score) for both tables: a score of 0.5 reads the same in each.
    from hfxla_nb.ui.state import score

    predicted = predictions("classification", [{"label": "a", "score": 0.5},
                                               {"label": "b", "score": 1.2345678e-5}])
    shown = Elements(predictions_html(predicted)).texts("td")
    metrics = Elements(result_html(result({"eval_accuracy": 0.5, "eval_loss": 1.2345678e-5})))
    assert shown[2] == metric_value("eval_accuracy", 0.5) == score(0.5) == "0.5000"
    assert shown[5] == metric_value("eval_loss", 1.2345678e-5) == "0.0000"
    assert "0.5000" in metrics.texts("td") and "0.5" not in shown
    assert predictions_text(predicted).splitlines()[2].endswith("  0.5000")


def test_predictions_are_a_table_of_one_row_per_input_with_rounded_scores():
    predicted = classified()
    lines = predictions_text(predicted).splitlines()
    assert lines[0] == ("Predictions: 3 inputs (classification), 1 graph compiled, 520 ms in "
                        "the worker")
    assert lines[1:5] == ["  input  label      score",
                          "      0  negative  0.9877",
                          "      1  positive  0.1235",
                          "      2  negative  0.5000"]
    assert "0.987654321" not in "\n".join(lines) and "probabilities" not in lines[1]
    html = Elements(predictions_html(predicted))
    assert html.texts("th") == ["input", "label", "score"]
    assert html.texts("td") == ["0", "negative", "0.9877", "1", "positive", "0.1235",
                                "2", "negative", "0.5000"]
    # The data keeps every value exact: the dicts, and the table pandas makes of them.
    frame = predicted.to_dataframe()
    assert list(frame["score"]) == SCORES and list(frame.columns) == ["label", "score"]
    assert predicted[0]["probabilities"]["positive"] == SCORES[0]
    assert repr(predicted) == ("<Predictions: 3 from classification, 1 graph compiled; "
                               "to_dataframe() for the table>")
    # A list made by hand, with no task, is still one row per input.
    assert predictions_text(Predictions([{"label": "a", "score": 0.25}])).splitlines()[:3] == [
        "Predictions: 1 input (no task), 0 graphs compiled",
        "  input  label   score",
        "      0  a      0.2500"]


def test_each_tasks_predictions_show_the_tasks_own_columns():
    ner = predictions("token-classification", [
        {"words": ["alice", "smith", "lives", "in", "paris"], "tags": ["B-PER", "I-PER", "O",
                                                                       "O", "B-LOC"],
         "scores": [0.91, 0.82, 0.99, 0.99, 0.7777777],
         "entities": [{"entity": "PER", "text": "alice smith", "start": 0, "end": 11,
                       "score": 0.865432}, {"entity": "LOC", "text": "paris", "start": 21,
                                            "end": 26, "score": 0.7777777}]},
        {"words": ["hello"], "tags": ["O"], "scores": [0.99], "entities": []}])
    assert predictions_text(ner).splitlines()[:4] == [
        "Predictions: 2 inputs, 2 rows (token-classification), 1 graph compiled, 520 ms in "
        "the worker",
        "  input  entity  text         start  end   score",
        "      0  PER     alice smith      0   11  0.8654",
        "      0  LOC     paris           21   26  0.7778"]
    answers = predictions("question-answering", [
        {"answer": "oslo", "start": 19, "end": 23, "score": 12.3456789},
        {"answer": "", "start": None, "end": None, "score": -1.0}])
    assert Elements(predictions_html(answers)).texts("td") == [
        "0", "oslo", "19", "23", "12.3457", "1", '""', "", "", "-1.0000"]
    text = "the model wrote this\nover two lines and then went on for quite a while longer"
    generated = predictions("seq2seq", [{"generated_text": text}])
    (row,) = [line for line in predictions_text(generated).splitlines()
              if line.startswith("      0")]
    assert row == "      0  the model wrote this over two lines and then we…"  # 48 characters
    assert Elements(predictions_html(generated)).texts("td")[1] == " ".join(text.split())
    assert generated.to_dataframe().loc[0, "generated_text"] == text


def test_long_predictions_show_the_first_20_rows_and_say_how_many_more():
    predicted = classified(25)
    lines = predictions_text(predicted).splitlines()
    assert len(lines) == 1 + 1 + MAX_ROWS + 1
    assert lines[-2].startswith("     19  ")
    assert lines[-1] == ("  ... 5 more rows; values rounded here; to_dataframe() has every "
                         "row, exact")
    html = Elements(predictions_html(predicted))
    assert len(html.texts("tr")) == 1 + MAX_ROWS
    assert "5 more rows" in html.text
    assert len(predicted.to_dataframe()) == 25


def test_a_shell_draws_predictions_as_their_table():
    # Registered by type name, as FineTuneResult is: train imports nothing from ui.
    predicted = classified()
    bundle = formatted_by_a_shell(predicted)
    assert bundle["text/plain"] == predictions_text(predicted)
    assert bundle["text/html"] == predictions_html(predicted)


def test_the_loss_charts_step_labels_are_separate_elements_at_its_ends():
    html = Elements(result_html(result({"eval_loss": 0.5})))
    (axis,) = [attrs for tag, attrs, text in html.elements
               if tag == "div" and text.strip().startswith("step 10")]
    assert "display:flex" in axis["style"] and "justify-content:space-between" in axis["style"]
    assert "gap:" in axis["style"]
    assert [text for text in html.texts("span") if text.startswith("step")] == ["step 10",
                                                                              "step 60"]
    # Read without styles (a sanitizer, a copy as text), they stay apart too.
    assert "step 10 step 60" in html.text and "step 10step" not in html.text
    assert Elements(step_axis_html(1, 2)).texts("span") == ["step 1", "step 2"]
    chart = [line for line in result_text(result({"eval_loss": 0.5})).splitlines()
             if "at step" in line]
    assert chart == ["              █▃▁  (█ 2.5000 at step 10, ▁ 0.5000 at step 60)"]


def test_counts_are_whole_numbers_by_one_rule():
    for name in ("eval_rows", "eval_tokens", "eval_masked_tokens", "eval_LOC_entities",
                 "eval_B-PER_count", "eval_PER_support", "eval_samples"):
        assert is_count(name, 53.0), name
        assert metric_value(name, 53.0) == "53"
    assert metric_value("eval_LOC_entities", 12480.0) == "12,480"
    assert not is_count("eval_LOC_entities", 7.5)  # not whole: a mean, not a count
    assert not is_count("eval_f1", 1.0) and metric_value("eval_f1", 1.0) == "1.0000"
    assert not is_count("eval_gen_words", 12.0)  # a mean length, whole by chance
    assert not is_count("eval_rows", float("nan"))
    text = result_text(result(ner_metrics()))
    assert ".0000" not in "".join(line for line in text.splitlines() if "entities" in line)
    assert "eval_rows       300" in text
    html = Elements(result_html(result(ner_metrics())))
    assert "53" in html.texts("td") and "53.0000" not in html.text


def test_per_entity_metrics_are_one_grid_of_entity_by_statistic():
    metrics = ner_metrics()
    rows, grid = split_entity_metrics(metrics)
    assert [name for name, _ in rows] == ["eval_loss", "eval_precision", "eval_recall",
                                          "eval_f1", "eval_accuracy", "eval_rows"]
    assert grid == [["entity", "precision", "recall", "f1", "entities"],
                    ["LOC", "0.9123", "0.8000", "0.8512", "53"],
                    ["MISC", "0.9123", "0.8000", "0.8512", "20"],
                    ["ORG", "0.9123", "0.8000", "0.8512", "41"],
                    ["PER", "0.9123", "0.8000", "0.8512", "37"]]
    lines = result_text(result(metrics)).splitlines()
    start = next(i for i, line in enumerate(lines) if "entity  precision" in line)
    assert lines[start:start + 5] == [
        "              entity  precision  recall      f1  entities",
        "              LOC        0.9123  0.8000  0.8512        53",
        "              MISC       0.9123  0.8000  0.8512        20",
        "              ORG        0.9123  0.8000  0.8512        41",
        "              PER        0.9123  0.8000  0.8512        37"]
    assert not any("eval_LOC" in line for line in lines)  # no long column of 16 rows
    html = Elements(result_html(result(metrics)))
    headers = html.texts("th")
    start = headers.index("entity")
    assert headers[start:start + 5] == ["entity", "precision", "recall", "f1", "entities"]
    assert len([row for row in html.texts("tr") if row.startswith(("LOC", "MISC"))]) == 2
    assert "eval_LOC_f1" not in html.text
    # Question answering's `eval_has_answer_f1` is no entity: it stays a row of its own.
    rows, grid = split_entity_metrics({"eval_f1": 80.0, "eval_has_answer_f1": 75.0})
    assert grid == [] and [name for name, _ in rows] == ["eval_f1", "eval_has_answer_f1"]


def test_each_row_shows_its_input_text_or_an_images_thumbnail():
    # predict keeps its inputs: the table names each row by its text, not by 0, 1, ...
    texts = ["the coffee was truly wonderful", "i hated it"]
    predicted = classified(2)
    predicted.inputs = texts
    lines = predictions_text(predicted).splitlines()
    assert lines[1].split() == ["input", "label", "score"]
    assert lines[2].startswith("  the coffee was truly wonderful  negative")
    assert lines[3].startswith("  i hated it")
    html = Elements(predictions_html(predicted))
    assert html.texts("td")[0::3] == texts
    # A task's own rows (one per entity) name their input the same way; the data keeps the
    # index, exact.
    ner = predictions("token-classification", [
        {"entities": [{"entity": "PER", "text": "alice", "start": 0, "end": 5,
                       "score": 0.9}]}])
    ner.inputs = ["alice lives in paris"]
    assert predictions_text(ner).splitlines()[2].startswith("  alice lives in paris  PER")
    assert list(ner.to_dataframe()["input"]) == [0]
    # An image: a thumbnail in HTML, its size in text.
    import numpy as np

    images = predictions("image-classification", [
        {"label": "cat", "score": 0.8, "top": [{"label": "cat", "score": 0.8}]}])
    images.inputs = [np.zeros((64, 48, 3), dtype=np.uint8)]
    assert predictions_text(images).splitlines()[2].startswith("  image 48x64  ")
    page = predictions_html(images)
    assert '<img src="data:image/png;base64,' in page and 'title="image 48x64"' in page
