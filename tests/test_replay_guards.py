"""A training step is run again by its compiled graph only where a check proves it computes what
the traced step would (`train/worker/captured.py`); where it is not, its steps are traced, the
losses are the traced loop's, and `result.compiled_steps` says why. Each model below trips one
guard (or proves itself the same at a second trace: a host number, an unused layer) and is
trained both ways on XLA:CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import BertForSequenceClassification, LlamaForCausalLM

import hfxla_nb as hx
from hfxla_nb import demo

pytestmark = pytest.mark.launch


class HostDrawForSequenceClassification(BertForSequenceClassification):
    """Scales its logits by a number drawn on the host at each step (as SpecAugment's mask)."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        draw = torch.from_numpy(np.random.rand(1).astype("float32")).to(out.logits.device)
        out.logits = out.logits * (1 + draw)
        return out


class HostNumberForSequenceClassification(BertForSequenceClassification):
    """Uploads the same number at each step: new data, the same value."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * torch.tensor([1.5]).to(out.logits.device)
        return out


class DeviceReadForSequenceClassification(BertForSequenceClassification):
    """Reads a value back from the device in the middle of its step (`bool(tensor)`)."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        if bool(out.logits.abs().sum() > 1e9):  # never true; read on the host all the same
            out.logits = out.logits * 0
        return out


class UnusedForSequenceClassification(BertForSequenceClassification):
    """Holds a parameter its forward never uses: it gets no gradient."""

    def __init__(self, config):
        super().__init__(config)
        self.unused = torch.nn.Linear(4, 4)


@pytest.fixture(scope="module")
def trained(cache):
    """Each model trained with its steps replayed where allowed, and with every step traced."""
    folder = demo.demo_model_dir(cache=cache)
    rows = demo.demo_dataset(n=200)
    runs = {}
    for cls in (HostDrawForSequenceClassification, HostNumberForSequenceClassification,
                DeviceReadForSequenceClassification, UnusedForSequenceClassification):
        for replay in (True, False):
            model = cls.from_pretrained(folder)
            runs[cls.__name__.removesuffix("ForSequenceClassification"), replay] = hx.fine_tune(
                model, rows, max_steps=6, batch_size=8, log_every=1, learning_rate=1e-3,
                output_dir=None, progress=False, compiled_steps=replay)
    return runs


def _losses(result) -> list[float]:
    return [loss for _, loss in result.loss_history]


@pytest.mark.parametrize("name", ["HostDraw", "HostNumber", "DeviceRead", "Unused"])
def test_each_model_trains_exactly_as_the_traced_loop(trained, name):
    replayed, traced = trained[name, True], trained[name, False]
    assert _losses(replayed) == _losses(traced)  # bit for bit
    assert len(set(_losses(replayed))) > 1
    assert list(traced.compiled_steps.values()) == ["traced: compiled_steps=False"]


def test_a_host_draw_at_each_step_declines_the_replay_and_says_so(trained):
    from hfxla_nb.ui.panels import result_text

    (why,) = trained["HostDraw", True].compiled_steps.values()
    assert why.startswith("traced: a value made on the host while tracing ((1,) float32) "
                          "differs between two steps"), why
    assert f"8x48: {why}" in result_text(trained["HostDraw", True])  # the result's panel
    assert "8x48: later steps run by the first step's compiled graph" in result_text(
        trained["HostNumber", True])


def test_the_same_host_number_at_each_step_is_proven_the_same_and_replayed(trained):
    assert list(trained["HostNumber", True].compiled_steps.values()) == ["replayed"]


def test_a_device_read_while_tracing_declines_the_replay_naming_the_op(trained):
    (why,) = trained["DeviceRead", True].compiled_steps.values()
    assert why.startswith("traced: the step ran _local_scalar_dense on the CPU"), why


def test_a_parameter_without_a_gradient_is_read_as_it_is_and_the_step_replayed(trained):
    """An unused layer gets no gradient: torch's AdamW leaves it, and so does the compiled
    step (its losses are the traced loop's, above), once a second trace gave the same graph."""
    assert list(trained["Unused", True].compiled_steps.values()) == ["replayed"]


def test_layerdrop_declines_the_replay_before_any_capture(cache):
    folder = demo.demo_model_dir(cache=cache)
    model = BertForSequenceClassification.from_pretrained(folder)
    model.config.layerdrop = 0.1  # read from the config, as BART's and wav2vec2's carry it
    result = hx.fine_tune(model, demo.demo_dataset(n=100), max_steps=2, batch_size=8,
                          output_dir=None, progress=False)
    (why,) = result.compiled_steps.values()
    assert why.startswith("traced: LayerDrop (layerdrop=0.1)"), why


def test_the_environment_turns_replay_off(cache, monkeypatch):
    monkeypatch.setenv("HFXLA_NB_COMPILED_STEPS", "0")
    assert hx.FineTuneConfig().replays_steps is False
    assert hx.FineTuneConfig(compiled_steps=True).replays_steps is True  # the argument wins
    monkeypatch.delenv("HFXLA_NB_COMPILED_STEPS")
    assert hx.FineTuneConfig().replays_steps is True


def test_evaluation_batches_obey_the_same_rules_and_say_so_per_shape(trained):
    """The evaluation after training replays a bucket's first graph only where its trace is
    proven the same: a host draw at each batch and a device read are traced and say why, a
    host number proven the same at a second trace is replayed."""
    from hfxla_nb.ui.panels import result_text

    (draw,) = trained["HostDraw", True].compiled_evaluation.values()
    assert draw.startswith("traced: a value made on the host while tracing ((1,) float32) "
                           "differs between two batches"), draw
    shown = result_text(trained["HostDraw", True])
    assert "eval batches" in shown and f"8x48: {draw}" in shown
    (read,) = trained["DeviceRead", True].compiled_evaluation.values()
    assert read.startswith("traced: the evaluation ran _local_scalar_dense on the CPU"), read
    assert list(trained["HostNumber", True].compiled_evaluation.values()) == ["replayed"]
    assert list(trained["HostNumber", False].compiled_evaluation.values()) == [
        "traced: compiled_steps=False"]
    # Traced or replayed, the evaluation of a model the rules allow gives the same metrics.
    assert trained["HostNumber", True].metrics == trained["HostNumber", False].metrics


class HostDrawForCausalLM(LlamaForCausalLM):
    """Boosts a token drawn on the host at each step: each token is the draw's."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        boost = torch.zeros(out.logits.shape[-1])
        boost[np.random.randint(10, out.logits.shape[-1])] = 1e4
        out.logits = out.logits + boost.to(out.logits.device)
        return out


def test_decoding_with_a_host_draw_per_token_gives_the_traced_tokens(cache):
    """A decoding step whose trace uploads a new host value each token is not replayed with
    its first values: the second trace differs, and the later steps are traced as without
    replay (the same tokens)."""
    import dataclasses

    from hfxla_nb.demo.lm import demo_lm_model_dir
    from hfxla_nb.train.predict import prepare_predict
    from hfxla_nb.train.worker.evaluate import predict_worker

    model = HostDrawForCausalLM.from_pretrained(demo_lm_model_dir(cache=cache))
    plan = prepare_predict(model, ["the cat", "a dog likes"], task="causal-lm", batch_size=2,
                           num_processes=1, max_new_tokens=8)
    tokens = {}
    for replay in (True, False):
        np.random.seed(0)  # the workers are forked with this state: the same draws
        tokens[replay] = hx.notebook_launcher(
            predict_worker, args=(dataclasses.replace(plan, capture_steps=replay),),
            num_processes=1, strategy="spmd", progress=False)["predictions"]
    assert tokens[True] == tokens[False]
    assert len(set(tokens[True][0]["generated_text"].split())) > 2  # draws, not one token
