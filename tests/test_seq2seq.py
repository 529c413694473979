"""fine_tune(task="seq2seq") on XLA:CPU with 4 virtual devices: a tiny BART learns the demo
translation; evaluation's greedy generation on the device compiles a fixed number of graphs,
and its BLEU and ROUGE equal those of transformers' own `generate` on the CPU scored by
sacrebleu and rouge-score; fixed-shape generation equals `generate` for T5 and BART; the
XSum layout and a prefix are read; every bad input is refused before anything is forked.

The pytest process never starts the XLA runtime: training runs in a launched worker.
"""

from __future__ import annotations

import pytest

import hfxla_nb as hx
from hfxla_nb.demo.seq2seq import (
    demo_seq2seq_dataset,
    demo_seq2seq_model_dir,
    demo_seq2seq_tokenizer,
    run_demo_seq2seq,
)
from hfxla_nb.train import FineTuneError, prepare_fine_tune

STEPS = 50  # imperfect yet: the reference test compares real mistakes
EVAL_ROWS = 64


@pytest.fixture(scope="module")
def bart_dir(cache):
    return demo_seq2seq_model_dir("bart", cache=cache)


@pytest.fixture(scope="module")
def t5_dir(cache):
    return demo_seq2seq_model_dir("t5", cache=cache)


@pytest.fixture(scope="module")
def learned(cache, tmp_path_factory):
    return run_demo_seq2seq(max_steps=STEPS, eval_rows=EVAL_ROWS, cache=cache, progress=False,
                            output_dir=tmp_path_factory.mktemp("seq2seq") / "bart",
                            metrics=("bleu", "rouge"), log_every=10)


@pytest.mark.launch
def test_it_learns_the_demo_translation(learned):
    assert learned.task == "seq2seq"
    assert learned.devices == 4
    history = [loss for _, loss in learned.loss_history]
    assert history[-1] < 0.2 * history[0]
    assert learned.metrics["eval_bleu"] > 50  # an untrained model scores 0
    assert learned.metrics["eval_rouge1"] > 80
    assert learned.metrics["eval_rows"] == EVAL_ROWS
    assert not learned.warnings


@pytest.mark.launch
def test_compile_contract(learned):
    # One source bucket: 1 training graph; evaluation: the teacher-forced forward pass with
    # the encoder (1) and the decoding step (1), however many tokens and batches.
    assert learned.bucket_lengths == [8]
    assert learned.compiles == 1
    assert learned.eval_compiles == 2


def eval_rows() -> tuple[list[str], list[str]]:
    rows = demo_seq2seq_dataset()["validation"].select(range(EVAL_ROWS))["translation"]
    return [r["en"] for r in rows], [r["rev"] for r in rows]


@pytest.fixture(scope="module")
def cpu_predictions(learned) -> list[str]:
    """transformers' own `generate`, greedy, on the CPU, from the saved model."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(learned.output_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(learned.output_dir).eval()
    batch = tokenizer(eval_rows()[0], padding="max_length", max_length=8, return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**batch, do_sample=False, num_beams=1, max_new_tokens=8)
    return [text.strip() for text in tokenizer.batch_decode(generated, skip_special_tokens=True)]


@pytest.mark.launch
def test_metrics_equal_a_cpu_reference(learned, cpu_predictions):
    """The CPU's predictions, scored by the packages themselves against the raw target
    texts, give exactly the reported figures."""
    import sacrebleu
    from rouge_score import rouge_scorer

    predictions, targets = cpu_predictions, eval_rows()[1]
    wrong = sum(p != t for p, t in zip(predictions, targets, strict=True))
    assert 0 < wrong < EVAL_ROWS // 2  # mistakes to score: equal figures mean equal texts
    assert learned.metrics["eval_bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(predictions, [targets]).score, abs=1e-9)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    scores = [scorer.score(target, prediction)
              for target, prediction in zip(targets, predictions, strict=True)]
    for name in ("rouge1", "rouge2", "rougeL"):
        reference = 100 * sum(s[name].fmeasure for s in scores) / len(scores)
        assert learned.metrics[f"eval_{name}"] == pytest.approx(reference, abs=1e-9)


@pytest.mark.launch
def test_predict_on_every_device_equals_evaluation(learned, cpu_predictions):
    """`result.predict` generates with the prefix and length the run saved, one forward and
    one step graph for its one bucket, the same texts as evaluation scored."""
    predictions = learned.predict(eval_rows()[0], batch_size=16, num_processes=4,
                                  progress=False)
    assert [item["generated_text"] for item in predictions] == cpu_predictions
    assert predictions.compiles == 2 and predictions.bucket_lengths == [8]


@pytest.mark.launch
@pytest.mark.parametrize("architecture", ["t5", "bart"])
def test_fixed_shape_generation_equals_generate(architecture, bart_dir, t5_dir):
    """The device loop's arithmetic, run on the CPU: the same tokens as `generate`."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from hfxla_nb.train.tasks.seq2seq import generated_texts, greedy_generate

    folder = t5_dir if architecture == "t5" else bart_dir
    tokenizer = demo_seq2seq_tokenizer()
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    torch.manual_seed(1)
    with torch.no_grad():  # untrained weights say nothing but padding: give them a voice
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    sources = demo_seq2seq_dataset(n=200)["train"].select(range(16))["translation"]
    batch = tokenizer([r["en"] for r in sources], padding="max_length", max_length=8,
                      return_tensors="pt")
    ours = greedy_generate(model, batch.input_ids, batch.attention_mask, 10)
    with torch.no_grad():
        theirs = model.generate(**batch, do_sample=False, num_beams=1, max_new_tokens=10)
    texts = generated_texts(tokenizer, ours)
    assert texts == generated_texts(tokenizer, theirs[:, 1:])
    assert len(set(texts)) > 3  # not all empty or alike: the comparison means something


def test_xsum_layout_prefix_and_labels(t5_dir):
    import numpy as np

    data = demo_seq2seq_dataset(n=200, kind="summarization")
    assert data["train"].column_names == ["document", "summary"]
    plan = prepare_fine_tune(t5_dir, data, task="seq2seq", source_prefix="summarize: ",
                             batch_size=8, max_target_length=8, output_dir=None,
                             progress=False, num_processes=4)
    tokenizer = plan.tokenizer
    bucket = plan.data.train.buckets[0]
    length, rows = bucket.length, bucket.rows
    prefix = tokenizer("summarize: ", add_special_tokens=False)["input_ids"]
    assert bucket.inputs[:, :len(prefix)].tolist() == [prefix] * len(rows)
    labels = bucket.inputs[:, 2 * length:]
    assert labels.shape[1] == plan.data.target_length == 8
    first = tokenizer(text_target=data["train"][int(rows[0])]["summary"])["input_ids"]
    assert labels[0, :len(first)].tolist() == first
    assert (labels[0, len(first):] == -100).all()
    mask = bucket.inputs[:, length:2 * length]
    assert ((mask == 1) == (bucket.inputs[:, :length] != tokenizer.pad_token_id)).all()
    assert np.all(labels[labels != -100] != tokenizer.pad_token_id)
    assert plan.data.text_metrics == ("rouge",)
    # task="auto": an encoder-decoder architecture is a seq2seq task, BLEU for translations
    plan = prepare_fine_tune(t5_dir, demo_seq2seq_dataset(n=200), source_lang="en",
                             target_lang="rev", batch_size=8, output_dir=None, progress=False)
    assert plan.task == "seq2seq" and plan.data.text_metrics == ("bleu",)


def _refused(tmp_path, *args, **options) -> str:
    out = tmp_path / "out"
    with pytest.raises(FineTuneError) as caught:
        hx.fine_tune(*args, output_dir=out, progress=False, num_processes=4, **options)
    assert not out.exists()  # refused before anything was written (or forked)
    return str(caught.value)


@pytest.mark.launch
def test_bad_inputs_refused_before_fork(tmp_path, bart_dir, cache):
    translation = demo_seq2seq_dataset(n=200)
    summaries = demo_seq2seq_dataset(n=200, kind="summarization")

    message = _refused(tmp_path, bart_dir, translation, task="seq2seq", source_lang="en",
                       target_lang="fr")
    assert "has no 'fr'" in message and "'en', 'rev'" in message

    message = _refused(tmp_path, bart_dir, translation, task="seq2seq")
    assert "source_lang=" in message and "'en', 'rev'" in message

    message = _refused(tmp_path, bart_dir, summaries, task="seq2seq", source_column="text",
                       target_column="summary")
    assert "no column 'text'" in message
    assert "'text', 'summary'" in message and "'document', 'summary'" in message

    renamed = summaries.rename_columns({"document": "body", "summary": "gist"})
    message = _refused(tmp_path, bart_dir, renamed, task="seq2seq")
    assert "'body', 'gist'" in message and "source_column=" in message

    message = _refused(tmp_path, bart_dir, translation, task="seq2seq", source_lang="en",
                       target_lang="rev", max_target_length=4)
    assert "longer than max_target_length=4" in message and "of 180 train targets" in message
    assert "max_target_length=8" in message

    from hfxla_nb.demo.lm import demo_lm_model_dir

    message = _refused(tmp_path, demo_lm_model_dir(cache=cache), translation, task="seq2seq",
                       source_lang="en", target_lang="rev")
    assert "encoder-decoder" in message and "task='causal-lm'" in message

    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(bart_dir)
    message = _refused(tmp_path, model, translation, task="causal-lm",
                       tokenizer=demo_seq2seq_tokenizer())
    assert "BartForConditionalGeneration" in message and "seq2seq" in message


def test_sampling_repeats_with_the_seed_and_early_stop_changes_no_token(bart_dir):
    """The device loop on the CPU with `predict`'s options: the same seed the same draws;
    greedy with early-stop checks the tokens of the full loop, in fewer steps."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from hfxla_nb.train.config import GenerationOptions
    from hfxla_nb.train.tasks.seq2seq import greedy_generate

    tokenizer = demo_seq2seq_tokenizer()
    model = AutoModelForSeq2SeqLM.from_pretrained(bart_dir).eval()
    sources = demo_seq2seq_dataset(n=200)["train"].select(range(8))["translation"]
    batch = tokenizer([r["en"] for r in sources], padding="max_length", max_length=8,
                      return_tensors="pt")
    steps = []

    def run(**options):
        steps.clear()
        return greedy_generate(model, batch.input_ids, batch.attention_mask, 12,
                               sync=lambda state: steps.append(1), fetch=list,
                               options=GenerationOptions(max_new_tokens=12, **options))

    drawn = run(do_sample=True, top_k=20, temperature=1.5, seed=3)
    assert torch.equal(drawn, run(do_sample=True, top_k=20, temperature=1.5, seed=3))
    assert not torch.equal(drawn, run(do_sample=True, top_k=20, temperature=1.5, seed=4))
    full = greedy_generate(model, batch.input_ids, batch.attention_mask, 12)
    assert torch.equal(run(check_every=2), full)
    assert len(steps) - 1 < 12  # the untrained model ends every row at once: stopped early


@pytest.mark.launch
def test_predict_samples_in_the_same_two_graphs(learned):
    predictions = learned.predict(["the cat is small .", "a red house ."], do_sample=True,
                                  top_p=0.9, seed=0, num_processes=4, progress=False)
    assert predictions.compiles == 2 and all(isinstance(item["generated_text"], str)
                                             for item in predictions)
