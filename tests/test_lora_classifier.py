"""fine_tune(..., lora=True) of a sequence classifier (the demo's tiny BERT) on 4 XLA:CPU
virtual devices: peft's SEQ_CLS (the classifier head trained whole, as modules_to_save), the
base frozen bit for bit, the full classifier fine-tune's compile contract (1 training + 1
evaluation graph for the one bucket, from torch_xla's metrics in the worker), the adapter
folder and the merged folder give the same logits on the CPU, `result.predict` on the devices;
the memory plan in the cell before the fork and beside XLA's measured graph memory in the
result; the merged model and the adapter pushed to a stand-in Hub; tasks without LoRA refused.

One fine-tune and one predict launch in all; the pytest process never starts XLA.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
from pathlib import Path

import pytest

from hfxla_nb import _xla
from hfxla_nb.demo import demo_dataset, demo_texts
from hfxla_nb.train import FineTuneError, prepare_fine_tune
from hfxla_nb.ui.panels import plan_line, plan_text, result_html, result_text

# peft is imported by the tests that use it: it takes seconds, and `make test-fast` collects
# this module only to deselect its tests.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("peft") is None,
                                reason='peft is not installed: pip install "hfxla_nb[lora]"')

ROWS = 1200  # 960 training rows: 30 steps of 32 per epoch
# The demo's BERT is built from a config: its random token embeddings mean nothing, so they
# train whole too (peft's modules_to_save); the head is trained whole by SEQ_CLS itself.
LORA = {"r": 8, "modules_to_save": ["word_embeddings"]}
WHOLE = ("classifier.", "bert.embeddings.word_embeddings.")
TEXTS = ["the coffee was truly wonderful.", "i hated it, a total waste."]


@pytest.fixture(scope="module")
def launched(model_dir, tmp_path_factory):
    """The fine-tune and what it printed (the console panels: as in a terminal)."""
    import hfxla_nb as hx

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = hx.fine_tune(model_dir, demo_dataset(n=ROWS), lora=LORA, batch_size=32,
                              epochs=2, learning_rate=4e-3, num_processes=4, log_every=5,
                              progress="console",
                              output_dir=tmp_path_factory.mktemp("lora-cls") / "tiny-bert")
    return result, printed.getvalue()


@pytest.fixture(scope="module")
def lora_classifier(launched):
    return launched[0]


@pytest.mark.launch
def test_it_learns_with_the_classifier_fine_tunes_compile_contract(lora_classifier, model_dir):
    import peft
    from transformers import AutoModelForSequenceClassification

    losses = [loss for _, loss in lora_classifier.loss_history]
    assert losses[-1] < 0.5 * losses[0]
    assert lora_classifier.metrics["eval_accuracy"] >= 0.75
    # Exactly the full classifier fine-tune's graphs: 1 training, 1 evaluation (one bucket).
    assert (lora_classifier.compiles, lora_classifier.eval_compiles) == (1, 1)
    assert lora_classifier.bucket_lengths == [48]
    assert lora_classifier.executions_per_step == 1.0
    assert lora_classifier.task == "classification" and lora_classifier.devices == 4
    assert lora_classifier.lora == {**LORA, "lora_alpha": 16, "target_modules": "all-linear",
                                    "lora_dropout": 0.05, "bias": "none",
                                    "task_type": "SEQ_CLS"}
    # What trained is peft's adapters and the head; the memory plan counted the same.
    reference = peft.get_peft_model(AutoModelForSequenceClassification.from_pretrained(model_dir),
                                    peft.LoraConfig(**lora_classifier.lora))
    trainable, total = reference.get_nb_trainable_parameters()
    assert (lora_classifier.trainable_parameters, lora_classifier.parameters) == (trainable, total)
    assert lora_classifier.memory_plan["trainable_parameters"] == trainable
    assert lora_classifier.memory_plan["lora_rank"] == 8


@pytest.mark.launch
def test_only_the_adapters_and_the_head_changed_the_base_is_bit_identical(lora_classifier,
                                                                          model_dir):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification

    folder = Path(lora_classifier.output_dir)
    original = AutoModelForSequenceClassification.from_pretrained(model_dir).state_dict()
    merged = AutoModelForSequenceClassification.from_pretrained(folder).state_dict()
    adapters = load_file(folder / "adapter" / "adapter_model.safetensors")
    scale = lora_classifier.lora["lora_alpha"] / lora_classifier.lora["r"]
    targeted = head = 0
    for name, weight in original.items():
        prefix = "base_model.model." + name.rsplit(".", 1)[0]
        if name.startswith(WHOLE):  # trained whole: saved with the adapter
            saved = adapters["base_model.model." + name]
            assert torch.equal(merged[name], saved) and not torch.equal(saved, weight), name
            head += 1
            continue
        a, b = adapters.get(prefix + ".lora_A.weight"), adapters.get(prefix + ".lora_B.weight")
        if a is None or not name.endswith(".weight"):  # embeddings, norms, biases: the base
            assert torch.equal(merged[name], weight), name
            continue
        targeted += 1
        assert b.abs().max() > 0  # lora_B starts at zero: it trained
        torch.testing.assert_close(merged[name] - scale * (b @ a), weight, rtol=0, atol=1e-6)
    # q, k, v, attention output, intermediate, output in each of 2 layers, and the pooler.
    assert (targeted, head) == (2 * 6 + 1, 3)  # head weight and bias, the embeddings


@pytest.mark.launch
def test_adapter_and_merged_folders_give_the_same_logits_and_predict_runs(lora_classifier,
                                                                          model_dir):
    import peft
    import torch
    from transformers import AutoModelForSequenceClassification

    folder = Path(lora_classifier.output_dir)
    adapter = peft.PeftModel.from_pretrained(
        AutoModelForSequenceClassification.from_pretrained(model_dir), folder / "adapter").eval()
    merged = lora_classifier.load_model().eval()
    assert type(merged).__name__ == "BertForSequenceClassification"
    assert isinstance(lora_classifier.load_model(merge=False), peft.PeftModel)
    tokenizer = lora_classifier.load_tokenizer()
    batch = tokenizer(TEXTS + demo_texts(4)[0], return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = merged(**batch).logits
        torch.testing.assert_close(adapter(**batch).logits, expected, rtol=1e-5, atol=1e-5)
    assert not _xla.runtime_is_initialized()
    predictions = lora_classifier.predict(TEXTS, progress=False)
    names = lora_classifier.label_names
    assert [row["label"] for row in predictions] == [names[int(i)] for i in
                                                     expected[:2].argmax(-1)]


@pytest.mark.launch
def test_the_result_shows_the_plan_beside_xlas_measured_graph_memory(lora_classifier):
    measured = lora_classifier.xla["largest_graph_bytes"]
    assert measured and measured > 0
    row = next(line for line in result_text(lora_classifier).splitlines()
               if line.strip().startswith("memory"))
    assert "plan " in row and " per device" in row and "XLA measured" in row
    ratio = measured / (lora_classifier.memory_plan["total_gib"] * 2**30)
    assert f"{ratio:.2f}x the plan" in row
    assert "XLA measured" in result_html(lora_classifier)


@pytest.mark.launch
def test_the_plan_was_shown_before_the_launch_in_the_same_words(launched):
    result, printed = launched
    first, *rest = printed.splitlines()
    assert first == f"memory  {plan_line(result.memory_plan)}"
    assert "launch" in "\n".join(rest)  # the launch's own panel came after it
    row = next(line for line in result_text(result).splitlines()
               if line.strip().startswith("memory"))
    assert row.split(None, 1)[1].startswith(f"{plan_text(result.memory_plan)}, XLA measured")


@pytest.mark.slow  # imports peft
def test_lora_on_a_task_without_it_is_refused_before_anything_happens(model_dir, tmp_path):
    from hfxla_nb.demo.tasks import ner_dataset

    before = set(os.listdir(tmp_path))
    with pytest.raises(FineTuneError) as error:
        prepare_fine_tune(model_dir, ner_dataset(n=40), task="token-classification", lora=True,
                          output_dir=tmp_path / "out")
    message = str(error.value)
    assert "task='causal-lm' and task='classification'" in message
    assert "'token-classification'" in message and "drop lora=" in message
    assert set(os.listdir(tmp_path)) == before and not _xla.runtime_is_initialized()
    with pytest.raises(FineTuneError, match="r must be a positive integer"):
        prepare_fine_tune(model_dir, demo_dataset(n=100), lora={"r": 0}, output_dir=None)
    with pytest.raises(FineTuneError, match="match no linear layer"):
        prepare_fine_tune(model_dir, demo_dataset(n=100), output_dir=None,
                          lora={"target_modules": ["q_proj"]})


@pytest.mark.launch
def test_a_lora_result_pushes_the_merged_model_and_the_adapter(lora_classifier):
    from tests.hub_standin import HubStandIn, card_metadata, hub_at

    token = "hf_LoraStandInToken"
    hub = HubStandIn(token).start()
    try:
        with hub_at(hub.url, token):
            url = lora_classifier.push_to_hub("lora-bert", private=False)
    finally:
        hub.stop()
    assert url == f"{hub.url}/tester/lora-bert" == lora_classifier.hub_url
    repo = hub.repos["tester/lora-bert"]
    folder = Path(lora_classifier.output_dir)
    assert repo.private is False
    for name in ("model.safetensors", "config.json", "adapter/adapter_config.json",
                 "adapter/adapter_model.safetensors"):
        assert repo.files[name] == (folder / name).read_bytes(), name
    card = card_metadata(repo.files["README.md"])
    assert {"lora", "peft"} <= set(card["tags"])
    assert card["hfxla_nb"]["lora"] == lora_classifier.lora
    assert 'subfolder="adapter"' in repo.files["README.md"].decode()
