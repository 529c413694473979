"""The `FineTuneResult` as a person sees it: evaluation as a small table (counts whole), the
loss chart with its scale, and the next thing to type; in the text and the HTML forms.

Plain data in, strings out: no run needed (the runs' own panels are checked in
test_finetune.py and test_causal_lm.py).
"""

from __future__ import annotations

import re

from hfxla_nb.train.result import FineTuneResult
from hfxla_nb.ui.panels import loss_text_chart, metric_value, result_html, result_text


def result(**changes) -> FineTuneResult:
    values = dict(
        output_dir="/runs/tiny", loss_history=[(5, 2.5), (10, 1.25), (15, 0.5), (20, 0.25)],
        metrics={"eval_loss": 0.0075, "eval_accuracy": 1.0, "eval_tokens": 71900.0,
                 "eval_rows": 300.0},
        steps=20, epochs=1.0, samples_per_second=100.0, train_seconds=3.0, compiles=1,
        eval_compiles=1, executions_per_step=1.0, transfers_per_step=0.1,
        label_names=["negative", "positive"], strategy="spmd", devices=4, precision="fp32",
        bucket_lengths=[64], launch_seconds=5.0)
    values.update(changes)
    return FineTuneResult(**values)


def test_counts_are_whole_numbers_and_the_rest_has_four_decimals():
    assert metric_value("eval_tokens", 719.0) == "719"
    assert metric_value("eval_tokens", 71900.0) == "71,900"
    assert metric_value("eval_rows", 300.0) == "300"
    assert metric_value("eval_accuracy", 1.0) == "1.0000"
    assert metric_value("eval_loss", 0.00751) == "0.0075"
    assert metric_value("eval_perplexity", 12345.67) == "12,345.7"
    assert metric_value("eval_tokens", 7.5) == "7.5000"  # not whole: not shown as a count
    text = repr(result())
    assert "eval_tokens=71900," in text and "eval_rows=300," in text
    assert "eval_loss=0.0075" in text and ".0000" not in text


def test_the_text_form_shows_evaluation_as_a_table():
    lines = result_text(result()).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  evaluation"))
    assert lines[start:start + 4] == [
        "  evaluation  eval_loss      0.0075",
        "              eval_accuracy  1.0000",
        "              eval_tokens    71,900",
        "              eval_rows      300",
    ]
    assert "719.0000" not in result_text(result(metrics={"eval_tokens": 719.0}))


def test_the_text_chart_has_its_scale():
    text = result_text(result())
    assert "  loss        2.5000 -> 0.2500 over steps 5-20\n" in text
    assert "              █▄▂▁  (█ 2.5000 at step 5, ▁ 0.2500 at step 20)\n" in text
    # A long history is sampled down, first and last kept, on the scale of every loss.
    chart = loss_text_chart([3.0] + [1.0] * 998 + [0.0])
    assert len(chart) == 32 and chart[0] == "█" and chart[-1] == "▁" and set(chart[1:-1]) == {"▃"}
    assert "over steps" not in result_text(result(loss_history=[(5, 1.0)]))


def test_the_html_form_has_the_table_the_scaled_chart_and_the_next_step():
    html = result_html(result())
    (table,) = re.findall(r"<th[^>]*>evaluation</th><td[^>]*>(<table.*?</table>)", html)
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", table)
    assert cells == ["eval_loss", "0.0075", "eval_accuracy", "1.0000", "eval_tokens", "71,900",
                     "eval_rows", "300"]
    assert "eval_loss=" not in html  # no raw key=value line
    # The chart: highest loss at its top, lowest at its bottom, first and last step under it.
    assert "<svg" in html
    labels = re.findall(r">(2\.5000|0\.2500|step 5|step 20)<", html)
    assert labels == ["2.5000", "0.2500", "step 5", "step 20"]
    assert "<code>result.load_model()</code>" in html
    assert "<code>result.load_tokenizer()</code>" in html
    assert "<code>result.predict([&quot;a text&quot;])</code>" in html
    assert "result.generate" not in html  # a classifier does not generate


def test_the_next_step_fits_the_task():
    text = result_text(result(task="causal-lm", label_names=[]))
    (hint,) = [line for line in text.splitlines() if line.startswith("  next")]
    assert 'result.generate(["a prompt"], max_new_tokens=32)' in hint
    assert "result.load_model()" in hint
    html = result_html(result(task="causal-lm", label_names=[]))
    assert '<code>result.generate([&quot;a prompt&quot;], max_new_tokens=32)</code>' in html
    text = result_text(result(task="question-answering"))
    assert 'result.predict([{"question": "...", "context": "..."}])' in text
    assert "  next" not in result_text(result(output_dir=None))  # nothing saved, nothing to load


def test_quiet_loading_turns_the_bars_off_and_restores_each_as_it_was():
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as hf_logging

    from hfxla_nb.launch.output import quiet_loading

    def state():
        return hf_logging.is_progress_bar_enabled(), not are_progress_bars_disabled()

    try:
        for before in ((True, True), (False, False), (False, True)):
            if before[0]:
                hf_logging.enable_progress_bar()  # turns the hub's on too
            else:
                hf_logging.disable_progress_bar()  # turns the hub's off too
            if before[1]:
                enable_progress_bars()  # (False, True): the hub's alone on
            assert state() == before
            try:
                with quiet_loading():
                    assert state() == (False, False)
                    raise KeyError("a load that fails")
            except KeyError:
                pass
            assert state() == before
    finally:
        hf_logging.enable_progress_bar()


def test_a_lora_run_says_what_was_trained_and_where_the_adapter_is():
    lora = {"r": 8, "lora_alpha": 16, "target_modules": ["v_proj", "q_proj"]}
    text = result_text(result(task="causal-lm", lora=lora, trainable_parameters=73728,
                              parameters=1234567))
    (row,) = [line for line in text.splitlines() if line.startswith("  LoRA")]
    assert row == ("  LoRA        r=8, alpha=16, on q_proj, v_proj; 73,728 of 1,234,567 "
                   "parameters trained (5.97%); the adapter alone in /runs/tiny/adapter "
                   "(result.load_model(merge=False) loads it on its base)")
    assert "<code>result.load_model(merge=False)</code>" in result_html(
        result(task="causal-lm", lora=lora))
    assert "LoRA" not in result_text(result())  # a full fine-tune has no such row


def test_the_setup_row_names_each_task():
    assert "labels ['negative', 'positive']" in result_text(result())
    for task, words in [("seq2seq", "sequence to sequence, data sharding"),
                        ("token-classification", "token classification, data sharding"),
                        ("causal-lm", "causal LM, data sharding")]:
        text = result_text(result(task=task))
        assert words in text, text
        assert "labels ['negative'" not in text
