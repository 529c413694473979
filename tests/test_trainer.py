"""hfxla_nb.train.trainer: XLA-safe TrainingArguments and the progress callback, launched."""

from __future__ import annotations

import math

import pytest

import hfxla_nb as hx
from hfxla_nb import _xla, demo
from hfxla_nb.launch import last_launch
from tests.test_tracking import scalars, wandb_history, wandb_records


@pytest.mark.slow  # its module imports peft
def test_training_arguments_refuse_in_the_kernel():
    # Imported here: hfxla_nb.train.trainer takes seconds to import, and `make test-fast`
    # collects this module only to deselect its tests.
    from hfxla_nb.train.trainer import TrainingArgumentsInKernelError

    with pytest.raises(TrainingArgumentsInKernelError, match="inside the function you launch"):
        hx.xla_training_arguments(output_dir="never-written")
    assert not _xla.runtime_is_initialized()


def _train_with_trainer(index, folder, output_dir, report_to, model):
    """`model` was loaded before the launch, as in accelerate's notebooks (hub kernels on)."""
    import warnings

    from transformers import AutoTokenizer, Trainer

    import hfxla_nb as hx
    from hfxla_nb import demo

    tokenizer = AutoTokenizer.from_pretrained(folder)
    data = demo.demo_dataset(n=200).map(
        lambda rows: tokenizer(rows["text"], padding="max_length", max_length=48,
                               truncation=True),
        batched=True,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = hx.xla_training_arguments(
            output_dir=output_dir, max_steps=4, per_device_train_batch_size=8, learning_rate=1e-3,
            logging_steps=2, save_strategy="no",
            report_to=report_to,
        )
    # A plain Trainer keeps its own callbacks (a callback has no handle on its Trainer);
    # hx.xla_trainer(Trainer) removes them as transformers removes a callback.
    plain = Trainer(model, args, train_dataset=data["train"],
                    callbacks=[hx.XlaProgressCallback()])
    callback = hx.XlaProgressCallback()
    trainer = hx.xla_trainer(Trainer)(model, args, train_dataset=data["train"],
                                      callbacks=[callback])
    callbacks = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
    trainer.train()
    return {
        "callbacks": callbacks,
        "plain_callbacks": [type(cb).__name__ for cb in plain.callback_handler.callbacks],
        "events_sent": callback.events_sent,
        "changes": args.hfxla_nb_changes,
        "optim": str(args.optim),
        "drop_last": args.dataloader_drop_last,
        "device": str(args.device),
        "losses": [log["loss"] for log in trainer.state.log_history if "loss" in log],
        "warnings": [str(w.message) for w in caught],
    }


@pytest.mark.launch
def test_trainer_with_the_callback_in_a_launched_run(cache, tmp_path, capsys, monkeypatch):
    from transformers import AutoModelForSequenceClassification

    folder = demo.demo_model_dir(cache=cache)
    model = AutoModelForSequenceClassification.from_pretrained(folder)  # before the launch
    monkeypatch.setenv("WANDB_MODE", "offline")  # the Trainer's own trackers, asked for
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    result = hx.notebook_launcher(
        _train_with_trainer,
        args=(folder, str(tmp_path / "trainer"), ["tensorboard", "wandb"], model),
        progress="console"
    )
    # The Trainer's own bars are gone from hx.xla_trainer(Trainer); ours is there. A plain
    # Trainer keeps the one transformers chose (disable_tqdm=True: PrinterCallback).
    assert "XlaProgressCallback" in result["callbacks"]
    assert not {"ProgressCallback", "NotebookProgressCallback", "PrinterCallback"} & set(
        result["callbacks"]
    )
    assert {"XlaProgressCallback", "PrinterCallback"} <= set(result["plain_callbacks"])
    assert result["device"].startswith("xla")
    assert result["optim"].lower().endswith("adamw_torch") and result["drop_last"] is True
    assert any(change.startswith("optim=") for change in result["changes"])
    assert any("xla_training_arguments changed" in w for w in result["warnings"])
    assert any("logging_steps=2" in w for w in result["warnings"])
    assert len(result["losses"]) == 2 and all(math.isfinite(x) for x in result["losses"])
    # report_to given: the Trainer's TensorBoard and W&B callbacks wrote from the worker; the
    # W&B run it left open was finished before the worker exited, its rows all there.
    assert not any(change.startswith("report_to") for change in result["changes"])
    assert {"TensorBoardCallback", "WandbCallback"} <= set(result["callbacks"])
    (runs,) = (tmp_path / "trainer" / "runs").iterdir()
    assert [value for _, value in scalars(runs)["train/loss"]] == pytest.approx(
        result["losses"])
    records = wandb_records(tmp_path)
    assert [row["train/loss"] for row in wandb_history(records)
            if "train/loss" in row] == pytest.approx(result["losses"])
    assert records[-1]["type"] == "exit" and records[-1]["exit"].get("exit_code", 0) == 0
    # begin, two logs (loss at steps 2 and 4), the final summary, end
    assert result["events_sent"] >= 4
    # The events reached the notebook side: the launcher saw step 4 and the console panel
    # shows the training bar with its loss.
    assert last_launch().ranks[0].last_step == 4
    shown = capsys.readouterr().out
    assert "train" in shown and "loss=" in shown and "4/4" in shown
    assert not _xla.runtime_is_initialized()


def _sft_lora_fsdp(folder, output_dir, model):
    """trl's SFTTrainer + LoRA + packing with FSDPv2 on every device (SFTConfig's default
    gradient checkpointing kept, through torch_xla's checkpoint); `model` was loaded before
    the launch (hub kernels on)."""
    import warnings

    import torch_xla.debug.metrics as met
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    import hfxla_nb as hx
    from hfxla_nb.demo.lm import TEMPLATE, demo_lm_dataset

    rows = demo_lm_dataset(n=160)["train"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    lora = LoraConfig(r=8, target_modules="all-linear", task_type="CAUSAL_LM")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = hx.xla_training_arguments(
            fsdp=True, model=model, arguments_class=SFTConfig, output_dir=output_dir,
            max_steps=8, per_device_train_batch_size=4, learning_rate=2e-2, logging_steps=2,
            max_length=64, packing=True, save_strategy="no")
    refused = ""
    try:  # trl's prompt/completion reading of a 'prompt' column, refused with the fix
        hx.xla_trainer(SFTTrainer)(model=model, args=args, train_dataset=rows,
                                   processing_class=tokenizer, peft_config=lora)
    except ValueError as error:
        refused = str(error)
    texts = Dataset.from_list([{"text": TEMPLATE.format(**row)} for row in rows])
    callback = hx.XlaProgressCallback()
    per_step: list[int] = []

    class Compiles(TrainerCallback):  # graphs compiled by the end of each step
        def on_step_end(self, args, state, control, **kwargs):
            data = met.metric_data("CompileTime")
            per_step.append(data[0] if data else 0)

    trainer = hx.xla_trainer(SFTTrainer)(model=model, args=args, train_dataset=texts,
                                         processing_class=tokenizer, peft_config=lora,
                                         callbacks=[callback, Compiles()])
    before = met.metric_data("CompileTime")
    trainer.train()
    after = met.metric_data("CompileTime")
    trainer.save_model(output_dir)
    return {
        "refused": refused,
        "changes": args.hfxla_nb_changes,
        "fsdp_config": dict(args.fsdp_config),
        "gradient_checkpointing": args.gradient_checkpointing,
        "losses": [log["loss"] for log in trainer.state.log_history if "loss" in log],
        "compiles": (after[0] if after else 0) - (before[0] if before else 0),
        "per_step": per_step,
        "events_sent": callback.events_sent,
        "trainable": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
    }


@pytest.mark.launch
def test_sft_trainer_with_lora_and_fsdp_v2_in_a_launched_worker(tmp_path):
    from hfxla_nb.demo.lm import demo_lm_model_dir

    peft = pytest.importorskip("peft")
    pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM

    folder = demo_lm_model_dir(cache=tmp_path / "cache")
    model = AutoModelForCausalLM.from_pretrained(folder)  # in the notebook, before the launch
    assert model.use_kernels  # transformers' default with `kernels` installed
    out = tmp_path / "sft"
    result = hx.notebook_launcher(_sft_lora_fsdp, args=(folder, str(out), model),
                                  num_processes=4,
                                  strategy="spmd", progress=False)
    assert "rename_column('response', 'completion')" in result["refused"]
    config = result["fsdp_config"]
    assert config["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]
    assert config["xla"] and config["xla_fsdp_v2"] and config["xla_fsdp_grad_ckpt"]
    assert result["gradient_checkpointing"] is False  # torch.utils.checkpoint fails on XLA
    assert any("torch_xla's checkpoint through FSDPv2" in c for c in result["changes"])
    losses = result["losses"]
    assert len(losses) == 4 and losses == sorted(losses, reverse=True), losses  # falls
    assert losses[-1] < losses[0] - 0.1, losses
    # Bounded: the graphs of the first steps (and of the first logging step) are compiled
    # once; the steps after them compile nothing ({result['compiles']} in all, on 8 steps).
    per_step = result["per_step"]
    assert len(per_step) == 8 and per_step[-1] == per_step[3], per_step
    assert result["events_sent"] > 0
    assert result["trainable"] < 0.2 * 123584  # adapters only
    adapter = peft.PeftConfig.from_pretrained(out)  # saved in PEFT's format, gathered
    assert adapter.peft_type == "LORA" and adapter.r == 8
    model = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(folder), out)
    trained = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert len(trained) == 14 and all(p.abs().max() > 0 for p in trained)  # all trained
