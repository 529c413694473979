"""task="auto" and the task registry, in the kernel only (nothing is launched): the task from
the model's head, else from the data's columns, said in the notes; ambiguity refused."""

from __future__ import annotations

import pytest

from hfxla_nb.demo import demo_tokenizer
from hfxla_nb.demo.tasks import (
    mc_model_dir,
    mc_rows,
    ner_model_dir,
    ner_rows,
    qa_model_dir,
    qa_rows,
)
from hfxla_nb.train import FineTuneConfig, FineTuneError, prepare_fine_tune
from hfxla_nb.train.tasks import TASK_MODULES, TASKS, task_choices


@pytest.fixture(scope="module")
def headless_dir(cache, tmp_path_factory):
    """A tiny BERT saved as a masked LM: no head that names a fine-tuning task."""
    from transformers import BertConfig, BertForMaskedLM

    folder = tmp_path_factory.mktemp("headless")
    tokenizer = demo_tokenizer(cache)
    BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=64,
                               max_position_embeddings=128)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_every_registered_task_is_a_choice_and_has_its_hooks():
    assert set(TASK_MODULES) <= set(task_choices()) and task_choices()[0] == "auto"
    for name in TASK_MODULES:
        task = TASKS[name]
        assert task.name == name and task.auto_class.startswith("AutoModelFor")
        assert task.head_suffixes
    FineTuneConfig(task="question-answering")  # validated against the registry
    with pytest.raises(FineTuneError, match="'token-classification'"):
        FineTuneConfig(task="ner")


@pytest.mark.slow  # builds 4 models
def test_auto_picks_the_task_of_the_models_head(cache):
    plan = prepare_fine_tune(ner_model_dir(cache=cache), ner_rows(16), batch_size=4,
                             output_dir=None)
    assert plan.task == "token-classification"
    plan = prepare_fine_tune(qa_model_dir(cache=cache), qa_rows(16), batch_size=4,
                             output_dir=None)
    assert plan.task == "question-answering"
    plan = prepare_fine_tune(mc_model_dir(cache=cache), mc_rows(16), batch_size=4,
                             output_dir=None)
    assert plan.task == "multiple-choice"


def test_a_head_ending_text_and_audio_share_goes_to_the_models_kind(cache):
    """wav2vec2's ...ForSequenceClassification is an audio classifier, BERT's a text one: the
    audio task claims the model by its config's type."""
    from transformers import AutoConfig

    from hfxla_nb.demo.audio import demo_audio_model_dir
    from hfxla_nb.demo.tasks import classifier_model_dir
    from hfxla_nb.train import preparation

    audio = demo_audio_model_dir(cache=cache)
    assert AutoConfig.from_pretrained(audio).architectures == [
        "Wav2Vec2ForSequenceClassification"]
    assert preparation.head_task(audio, AutoConfig.from_pretrained(audio)) == "audio-classification"
    text = classifier_model_dir(cache=cache)
    assert AutoConfig.from_pretrained(text).architectures[0].endswith(
        "ForSequenceClassification")
    assert preparation.head_task(text, AutoConfig.from_pretrained(text)) == "classification"


def test_auto_picks_the_task_from_the_columns_and_says_so(headless_dir):
    plan = prepare_fine_tune(headless_dir, ner_rows(16), batch_size=4, output_dir=None)
    assert plan.task == "token-classification"
    assert plan.data.notes[0] == "task='auto' picked 'token-classification' from the data's columns"
    plan = prepare_fine_tune(headless_dir, qa_rows(16), batch_size=4, output_dir=None)
    assert plan.task == "question-answering"
    plan = prepare_fine_tune(headless_dir, mc_rows(16), batch_size=4, output_dir=None)
    assert plan.task == "multiple-choice"


def test_auto_refuses_columns_that_fit_several_tasks(headless_dir):
    rows = [{**ner, **qa} for ner, qa in zip(ner_rows(16), qa_rows(16), strict=True)]
    with pytest.raises(FineTuneError, match="cannot tell the task from the columns"):
        prepare_fine_tune(headless_dir, rows, batch_size=4, output_dir=None)


def test_causal_lm_with_an_encoder_decoder_folder_is_refused(tmp_path):
    from hfxla_nb.demo.seq2seq import demo_seq2seq_model_dir

    with pytest.raises(FineTuneError, match="is an encoder-decoder model"):
        prepare_fine_tune(demo_seq2seq_model_dir(cache=tmp_path), [{"text": "a b"}] * 8,
                          task="causal-lm", batch_size=4, output_dir=None)
