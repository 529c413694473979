"""Steps run by their compiled graph (`_xla.CompiledGraph`): the training step
(`train/worker/captured.py`), `predict`'s batches (`worker/evaluate.py`) and seq2seq decoding
(`tasks/seq2seq.py`). The first of a kind is traced, every later one runs the compiled graph
on its data. Real workers on XLA:CPU, compared with runs that trace every step."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import TrainerCallback

import hfxla_nb as hx
from hfxla_nb import demo
from hfxla_nb.demo.seq2seq import demo_seq2seq_dataset, demo_seq2seq_model_dir
from hfxla_nb.demo.speech import RATE, demo_speech_clip, demo_whisper_model_dir
from hfxla_nb.demo.tasks import classifier_model_dir
from hfxla_nb.train import batching, prepare_fine_tune
from hfxla_nb.train.predict import prepare_predict

pytestmark = pytest.mark.launch


def traced() -> int:
    """The operations this worker traced on XLA (torch_xla counts each: `xla::add`...)."""
    import torch_xla.debug.metrics as met

    return sum(met.counter_value(name) or 0 for name in met.counter_names()
               if name.startswith("xla::"))


def counted_predict(index: int, plan):
    """`predict`'s worker, with the operations it traced and the graphs it ran."""
    from hfxla_nb import _xla
    from hfxla_nb.train.worker import evaluate

    result = evaluate.predict_worker(index, plan)
    # An execution's sample is recorded as it ends, which may be after its outputs were read.
    _xla.wait_device_ops()
    executions = sum(_xla.metric_counts(_xla.EXECUTE_TIMES).values())
    return {"traced": traced(), "predictions": result["predictions"],
            "compiles": result["compiles"], "executions": executions}


def counted_worker(index: int, plan):
    """`fine_tune`'s worker, with the operations it traced and its executions."""
    import torch_xla.debug.metrics as met

    from hfxla_nb.train.worker import loop

    result = loop.train_worker(index, plan)
    # Per compiled graph: its donated inputs. The training step's graph donates the most (an
    # evaluation graph donates none).
    aliased = met.metric_data("InputOutputAliasCount")
    return {"traced": traced(), "history": result["loss_history"],
            "compiles": result["compiles"], "executions": result["executions_per_step"],
            "aliased": int(max(value for _, value in aliased[2])) if aliased else 0}


def run(plan, capture: bool = True, num_processes: int = 1, strategy: str = "spmd") -> dict:
    plan = dataclasses.replace(plan, capture_steps=capture)
    return hx.notebook_launcher(counted_worker, args=(plan,), num_processes=num_processes,
                                strategy=strategy, progress=False)


@pytest.fixture(scope="module")
def plans(cache):
    folder = demo.demo_model_dir(cache=cache)
    rows = demo.demo_dataset(n=400)

    def plan(steps: int, **options):
        return prepare_fine_tune(folder, rows, max_steps=steps, batch_size=16, log_every=1,
                                 output_dir=None, progress=False, **options)

    return plan


def test_later_steps_run_the_compiled_graph_and_trace_no_model_operation(plans):
    short, long, traced = run(plans(8)), run(plans(16)), run(plans(8), capture=False)
    # 8 more steps of the same shape: the batch and AdamW's numbers uploaded, the parameters
    # given the outputs' data (a `set_` each), against the model's thousands of ops a step.
    per_step = (long["traced"] - short["traced"]) / 8
    assert per_step < traced["traced"] / 8 / 10, (per_step, traced["traced"])
    assert short["compiles"] == long["compiles"] == traced["compiles"] == 1
    assert short["executions"] == long["executions"] == 1.0


def test_compiled_steps_give_the_traced_steps_losses_bit_for_bit(plans):
    plan = plans(12, max_grad_norm=1.0, gradient_accumulation_steps=2)
    compiled, traced = run(plan), run(plan, capture=False)
    assert compiled["history"] == traced["history"]  # dropout's seed moves on alike
    assert len({loss for _, loss in compiled["history"]}) > 1
    assert compiled["compiles"] == traced["compiles"] == 1
    assert compiled["executions"] == traced["executions"] == 1.0
    assert traced["traced"] > 3 * compiled["traced"]
    # A traced step's buffers: each parameter's, updated in place. A compiled step's: each
    # parameter's and its two moments' (one copy of each in memory).
    assert compiled["aliased"] == 3 * traced["aliased"] > 0


def test_over_a_mesh_of_4_devices_the_losses_are_the_traced_ones(plans):
    plan = plans(8)
    compiled = run(plan, num_processes=4)
    traced = run(plan, capture=False, num_processes=4)
    assert compiled["history"] == traced["history"] and compiled["compiles"] == 1


class ReadsAWeight(TrainerCallback):
    """A callback that reads the classifier's weight after every step (in the worker) and
    writes its sum to a file: it must see each step's new value, as a traced loop's would."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_step_end(self, args, state, control, model=None, **kwargs):
        weight = dict(model.named_parameters())["classifier.weight"]
        with open(self.path, "a", encoding="utf-8") as file:
            file.write(f"{state.global_step} {float(weight.detach().double().sum().cpu())!r}\n")


def test_a_callback_a_checkpoint_and_an_evaluation_read_each_step_s_values(plans, tmp_path):
    """Between compiled steps the parameters and moments stay the program's outputs; a
    callback, a checkpoint and an evaluation each read them in place, as a traced loop's."""
    seen = {}
    histories = {}
    for capture in (True, False):
        path = tmp_path / f"weights-{capture}.txt"
        plan = plans(12, callbacks=[ReadsAWeight(str(path))], eval_strategy="steps", eval_steps=4)
        plan = dataclasses.replace(plan, output_dir=str(tmp_path / f"out-{capture}"),
                                   save=True, save_steps=5)
        histories[capture] = run(plan, capture)["history"]
        seen[capture] = path.read_text().splitlines()
    assert histories[True] == histories[False]
    assert seen[True] == seen[False] and len(seen[True]) == 12
    assert len({line.split()[1] for line in seen[True]}) == 12  # a new value at every step


def predicted(plan, capture: bool = True) -> dict:
    plan = dataclasses.replace(plan, capture_steps=capture)
    return hx.notebook_launcher(counted_predict, args=(plan,), num_processes=plan.devices,
                                strategy="spmd", progress=False)


def test_predicts_later_batches_run_the_bucket_s_graph_and_trace_no_model_operation(cache):
    folder = classifier_model_dir(cache=cache)
    texts = demo.demo_dataset(n=80)["train"]["text"][:32]

    def plan(rows: int):
        return prepare_predict(folder, (texts * 4)[:rows], batch_size=8, num_processes=4)

    short, long, every = predicted(plan(32)), predicted(plan(64)), predicted(plan(64), False)
    # More batches of the same buckets: uploaded and run, against the model's ops for each.
    count = {rows: batching.eval_batch_count(plan(rows).data.eval, 8) for rows in (32, 64)}
    per_batch = (long["traced"] - short["traced"]) / (count[64] - count[32])
    assert per_batch < every["traced"] / count[64] / 10, (per_batch, every["traced"])
    assert long["predictions"] == every["predictions"]
    assert long["compiles"] == every["compiles"] == short["compiles"] >= 1
    assert long["executions"] == every["executions"]


def test_seq2seq_decoding_traces_its_step_once_and_gives_the_traced_tokens(cache):
    folder = demo_seq2seq_model_dir("bart", cache=cache)
    sources = [row["en"] for row in demo_seq2seq_dataset(n=40)["validation"]["translation"]]
    # Drawn: an untrained model's most likely token ends the text at once.
    # Two batches: the second traces its first step again, and finds its graph compiled.
    plan = prepare_predict(folder, sources[:4], task="seq2seq", batch_size=2, num_processes=1,
                           max_new_tokens=16, do_sample=True, seed=3)
    compiled, every = predicted(plan), predicted(plan, False)
    assert compiled["predictions"] == every["predictions"]
    assert all(row["generated_text"] for row in compiled["predictions"])
    assert compiled["compiles"] == every["compiles"] == 2  # the encoder's, the step's
    assert compiled["executions"] == every["executions"]
    # The encoder and one step traced, against the encoder and every step.
    assert 4 * compiled["traced"] < every["traced"], (compiled["traced"], every["traced"])


def test_causal_lm_predict_over_a_mesh_of_4_devices_traces_its_step_once(lm_dir):
    prompts = ["the cat", "a dog likes", "my old fox", "red", "the bird finds the", "hi"] * 3
    plan = prepare_predict(lm_dir, prompts, task="causal-lm", batch_size=8, num_processes=4,
                           max_new_tokens=16, do_sample=True, seed=5)
    compiled, every = predicted(plan), predicted(plan, False)
    assert compiled["predictions"] == every["predictions"]
    assert len({row["generated_text"] for row in compiled["predictions"]}) > 1
    assert compiled["compiles"] == every["compiles"]  # 2 a bucket (test_predict_causal_lm.py)
    assert compiled["executions"] == every["executions"]
    # Each batch's prompt and first step traced, against its prompt and every step.
    assert 3 * compiled["traced"] < every["traced"], (compiled["traced"], every["traced"])


def test_whisper_decoding_traces_its_step_once(cache):
    import numpy as np

    rng = np.random.default_rng(7)
    clips = [{"array": demo_speech_clip(letters, rng), "sampling_rate": RATE}
             for letters in ([0, 2], [3, 1], [1, 0, 3], [2, 2])]
    plan = prepare_predict(demo_whisper_model_dir(cache=cache), clips,
                           task="speech-recognition", batch_size=2, num_processes=1)
    compiled, every = predicted(plan), predicted(plan, False)
    assert compiled["predictions"] == every["predictions"]
    assert compiled["compiles"] == every["compiles"] == 2  # the encoder's, the step's
    assert compiled["executions"] == every["executions"]
    assert 3 * compiled["traced"] < every["traced"], (compiled["traced"], every["traced"])
