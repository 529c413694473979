"""hfxla_nb.train.trainer: XLA-safe TrainingArguments and the progress callback, launched."""

from __future__ import annotations

import math

import pytest

import hfxla_nb as hx
from hfxla_nb import _xla, demo
from hfxla_nb.launch import last_launch
from hfxla_nb.train.trainer import TrainingArgumentsInKernelError


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "hfxla_nb_cache"


def test_training_arguments_refuse_in_the_kernel():
    with pytest.raises(TrainingArgumentsInKernelError, match="inside the function you launch"):
        hx.xla_training_arguments(output_dir="never-written")
    assert not _xla.runtime_is_initialized()


def _train_with_trainer(index, folder, output_dir):
    import warnings

    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer

    import hfxla_nb as hx
    from hfxla_nb import demo

    tokenizer = AutoTokenizer.from_pretrained(folder)
    data = demo.demo_dataset(n=200).map(
        lambda rows: tokenizer(rows["text"], padding="max_length", max_length=48,
                               truncation=True),
        batched=True,
    )
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = hx.xla_training_arguments(
            output_dir=output_dir, max_steps=4, per_device_train_batch_size=8, learning_rate=1e-3,
            logging_steps=2, save_strategy="no",
        )
    callback = hx.XlaProgressCallback()
    trainer = Trainer(model, args, train_dataset=data["train"], callbacks=[callback])
    callbacks = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
    trainer.train()
    return {
        "callbacks": callbacks,
        "events_sent": callback.events_sent,
        "changes": args.hfxla_nb_changes,
        "optim": str(args.optim),
        "drop_last": args.dataloader_drop_last,
        "device": str(args.device),
        "losses": [log["loss"] for log in trainer.state.log_history if "loss" in log],
        "warnings": [str(w.message) for w in caught],
    }


def test_trainer_with_the_callback_in_a_launched_run(demo_cache, tmp_path, capsys):
    folder = demo.demo_model_dir(cache=demo_cache)
    result = hx.notebook_launcher(
        _train_with_trainer, args=(folder, str(tmp_path / "trainer")), progress="console"
    )
    # The Trainer's own bars are gone; ours is there.
    assert "XlaProgressCallback" in result["callbacks"]
    assert not {"ProgressCallback", "NotebookProgressCallback", "PrinterCallback"} & set(
        result["callbacks"]
    )
    assert result["device"].startswith("xla")
    assert result["optim"].lower().endswith("adamw_torch") and result["drop_last"] is True
    assert any(change.startswith("optim=") for change in result["changes"])
    assert any("xla_training_arguments changed" in w for w in result["warnings"])
    assert any("logging_steps=2" in w for w in result["warnings"])
    assert len(result["losses"]) == 2 and all(math.isfinite(x) for x in result["losses"])
    # begin, two logs (loss at steps 2 and 4), the final summary, end
    assert result["events_sent"] >= 4
    # The events reached the notebook side: the launcher saw step 4 and the console panel
    # shows the training bar with its loss.
    assert last_launch().ranks[0].last_step == 4
    shown = capsys.readouterr().out
    assert "train" in shown and "loss=" in shown and "4/4" in shown
    assert not _xla.runtime_is_initialized()
