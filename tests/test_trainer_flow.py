"""What a `transformers.Trainer` user expects of a `fine_tune` run (docs/fine-tune.md, "Trainer
habits"): transformers' schedules, evaluation during training at the Trainer's steps, the
best model, `TrainerCallback`s with `EarlyStoppingCallback` unchanged, and the refusals
before any fork. One real run of the demo BERT is shared (`run`)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import EarlyStoppingCallback, TrainerCallback, TrainerControl, TrainerState

import hfxla_nb as hx
from hfxla_nb import demo
from hfxla_nb.events import Progress
from hfxla_nb.observe.tracking import Tracker, TrackingSettings
from hfxla_nb.train import FineTuneError
from hfxla_nb.train.flow import TrainerSettings
from hfxla_nb.train.worker.callbacks import TrainerRun
from tests.helpers import refuse_launches

ROWS = 600  # 480 train (15 steps of 32 an epoch), 60 validation
MAX_STEPS, EVAL_STEPS, WARMUP, LOG_EVERY, SAVE_LIMIT = 30, 5, 3, 5, 1


class Recorder(TrainerCallback):
    """Writes each event it sees, with the step, to a file (it runs in the forked worker)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _write(self, event: str, state: TrainerState, **more) -> None:
        with open(self.path, "a", encoding="utf-8") as file:
            file.write(json.dumps({"event": event, "step": state.global_step, **more}) + "\n")

    def on_init_end(self, args, state, control, **kwargs):
        self._write("on_init_end", state)

    def on_train_begin(self, args, state, control, **kwargs):
        self._write("on_train_begin", state, max_steps=state.max_steps,
                    metric=args.metric_for_best_model)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._write("on_epoch_begin", state)

    def on_step_begin(self, args, state, control, **kwargs):
        self._write("on_step_begin", state)

    def on_step_end(self, args, state, control, **kwargs):
        self._write("on_step_end", state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        self._write("on_log", state, keys=sorted(logs))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self._write("on_evaluate", state, loss=metrics["eval_loss"])

    def on_save(self, args, state, control, **kwargs):
        self._write("on_save", state)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._write("on_epoch_end", state)

    def on_train_end(self, args, state, control, **kwargs):
        self._write("on_train_end", state)


# The `run` fixture's launch record, kept as the run ended (later tests launch again).
LAUNCHES: dict[str, object] = {}


@pytest.fixture(scope="module")
def events_file(tmp_path_factory):
    return tmp_path_factory.mktemp("events") / "events.jsonl"


@pytest.fixture(scope="module")
def run(cache, tmp_path_factory, events_file):
    """30 steps at most, cosine with 3 warm-up steps, an evaluation every 5 steps, the
    "best" model the one with the HIGHEST evaluation loss (so that it is an early one, not
    the last), early stopping after 2 evaluations without a higher one, a checkpoint every 5
    steps with only 1 kept (and the best's)."""
    out = tmp_path_factory.mktemp("flow") / "run"
    result = hx.fine_tune(
        demo.demo_model_dir(cache=cache), demo.demo_dataset(n=ROWS), batch_size=32,
        learning_rate=4e-3, max_steps=MAX_STEPS, log_every=LOG_EVERY, num_processes=1,
        progress=False, output_dir=out, save_steps=EVAL_STEPS, save_total_limit=SAVE_LIMIT,
        lr_scheduler_type="cosine", warmup_steps=WARMUP, eval_strategy="steps",
        eval_steps=EVAL_STEPS, metric_for_best_model="loss", greater_is_better=True,
        load_best_model_at_end=True, keep_warm=True,
        callbacks=[EarlyStoppingCallback(early_stopping_patience=2), Recorder(str(events_file))])
    LAUNCHES["run"] = hx.last_launch()
    yield result
    result.release()  # the warm worker ends with the module


@pytest.mark.launch
def test_with_load_best_model_at_end_the_best_model_stays_warm(run, small_eval):
    """The saved model is an early evaluation's best, and that is the model that stays on the
    devices: a warm evaluation gives the best's loss, not the last step's, in the same
    process."""
    assert run.best_step < run.steps  # the best is not the last step
    assert run.session is not None and run.warm
    trained_in = hx.last_launch().ranks[0].pid
    best = next(entry for entry in evaluations(run) if entry["step"] == run.best_step)
    metrics = run.evaluate(small_eval, progress=False)
    assert hx.last_launch().ranks[0].pid == trained_in  # the warm worker, no new process
    assert metrics["eval_loss"] == pytest.approx(best["eval_loss"], abs=1e-5)
    assert metrics["eval_loss"] != pytest.approx(evaluations(run)[-1]["eval_loss"], abs=1e-4)
    assert run.evaluate(small_eval, progress=False) == metrics
    assert hx.last_launch().ranks[0].metrics.compiles == 0  # the graphs stayed with the model


def evaluations(result) -> list[dict]:
    return [entry for entry in result.log_history if "eval_loss" in entry]


def trainer_eval_steps(max_steps: int, eval_steps: int, stop: int) -> list[int]:
    """The steps transformers' own `DefaultFlowCallback` evaluates at, up to `stop`."""
    from transformers.trainer_callback import DefaultFlowCallback

    args = SimpleNamespace(logging_first_step=False, logging_strategy="steps",
                           eval_strategy="steps", eval_delay=0, save_strategy="no")
    state = TrainerState(max_steps=max_steps, logging_steps=LOG_EVERY, eval_steps=eval_steps)
    flow, steps = DefaultFlowCallback(), []
    for step in range(1, stop + 1):
        control = TrainerControl()
        state.global_step = step
        flow.on_step_end(args, state, control)
        if control.should_evaluate:
            steps.append(step)
    return steps


def trainer_stop_step(result) -> int | None:
    """Where the Trainer stops on the run's own evaluation sequence: transformers'
    `EarlyStoppingCallback.on_evaluate`, then `Trainer._determine_best_metric`, in the
    Trainer's order."""
    from transformers import Trainer

    args = SimpleNamespace(metric_for_best_model="loss", greater_is_better=True,
                           load_best_model_at_end=True, save_strategy="steps")
    trainer = SimpleNamespace(args=args, state=TrainerState())
    callback, control = EarlyStoppingCallback(early_stopping_patience=2), TrainerControl()
    for entry in evaluations(result):
        trainer.state.global_step = entry["step"]
        callback.on_evaluate(args, trainer.state, control, metrics=entry)
        Trainer._determine_best_metric(trainer, metrics=entry, trial=None)
        if control.should_training_stop:
            return entry["step"]
    return None


@pytest.mark.launch
def test_evaluation_steps_are_the_trainers(run):
    stop = run.steps
    assert [entry["step"] for entry in evaluations(run)] == trainer_eval_steps(
        MAX_STEPS, EVAL_STEPS, stop)
    assert all(entry["epoch"] == entry["step"] / 15 for entry in run.log_history)


@pytest.mark.launch
def test_learning_rates_are_get_schedulers(run):
    import torch
    from transformers import get_scheduler

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=4e-3)
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=WARMUP,
                              num_training_steps=MAX_STEPS)
    rates = []  # the rate each step used: the Trainer logs it at that step
    for _ in range(MAX_STEPS):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    logged = [entry for entry in run.log_history if "learning_rate" in entry]
    assert [entry["step"] for entry in logged] == list(range(LOG_EVERY, run.steps + 1,
                                                             LOG_EVERY))
    assert [entry["learning_rate"] for entry in logged] == [
        rates[entry["step"] - 1] for entry in logged]


@pytest.mark.launch
def test_compiles_stay_one_graph_each(run):
    # A new rate each step (0 at step 1, the warm-up's first) and six evaluations during
    # training: still one training graph and one evaluation graph, compiled ahead.
    assert run.compiles == 1
    assert run.eval_compiles == 1 and run.eval_compiled_ahead == 1
    assert run.executions_per_step == 1.0


@pytest.mark.launch
def test_early_stopping_stops_where_the_trainer_would(run):
    stop = trainer_stop_step(run)
    assert stop is not None, "the recorded losses should stop within 30 steps"
    assert run.steps == stop and run.stopped_early == (stop < MAX_STEPS)
    assert evaluations(run)[-1]["step"] == stop


@pytest.mark.launch
def test_the_result_says_how_the_run_ended_and_which_model_it_kept(run):
    """The early stop is named with its cause, and the kept model with its step and metric,
    in the result and in its panel."""
    from hfxla_nb.ui.panels import result_html, result_text

    assert run.stopped_early
    assert run.stop_reason == (f"stopped early at step {run.steps} of {MAX_STEPS}: eval_loss "
                               "did not improve for 2 evaluations (EarlyStoppingCallback)")
    assert run.kept_best and run.best_metric_name == "eval_loss"
    text = result_text(run)
    assert run.stop_reason in text
    kept = (f"the best model (load_best_model_at_end): step {run.best_step}, eval_loss "
            f"{run.best_metric:.4f}")
    assert kept in text and kept in result_html(run)
    assert "a callback set control.should_training_stop" not in text
    # The training bar ends at the step it stopped, its total kept (not "14/14").
    assert LAUNCHES["run"].ranks[0].bars["train"] == (run.steps, MAX_STEPS)


@pytest.mark.launch
def test_callback_sees_events_in_order(run, events_file):
    events = [json.loads(line) for line in Path(events_file).read_text().splitlines()]
    names = [event["event"] for event in events]
    assert names[:4] == ["on_init_end", "on_train_begin", "on_epoch_begin", "on_step_begin"]
    assert events[1]["max_steps"] == MAX_STEPS and events[1]["metric"] == "eval_loss"
    assert names[-1] == "on_train_end"
    assert names.count("on_step_end") == names.count("on_step_begin") == run.steps
    # At an evaluation step: the step ends, the loss is logged, then the evaluation (logged,
    # then on_evaluate), then the checkpoint: the Trainer's order.
    first = EVAL_STEPS
    at = [e["event"] for e in events if e["step"] == first and e["event"] != "on_step_begin"]
    assert at == ["on_step_end", "on_log", "on_log", "on_evaluate", "on_save"]
    steps = [event["step"] for event in events]
    assert steps == sorted(steps)  # events never go back in time
    epoch_ends = [e["step"] for e in events if e["event"] == "on_epoch_end"]
    assert epoch_ends == [s for s in (15, run.steps) if s <= run.steps][:len(epoch_ends)]


class CollectsLosses(TrainerCallback):
    """The usual way to plot something custom after training: collect it in an attribute."""

    def __init__(self):
        self.losses: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])


class HoldsALock(TrainerCallback):
    def __init__(self):
        import threading

        self.lock, self.calls = threading.Lock(), 0

    def on_step_end(self, args, state, control, **kwargs):
        self.calls += 1


@pytest.mark.launch
def test_a_callbacks_state_comes_back_to_the_notebooks_object(cache):
    collects, locked = CollectsLosses(), HoldsALock()
    result = hx.fine_tune(demo.demo_model_dir(cache=cache), demo.demo_dataset(n=120),
                          max_steps=6, batch_size=8, log_every=2, progress=False,
                          output_dir=None, callbacks=[collects, locked])
    assert collects.losses == [loss for _, loss in result.loss_history]  # every logged loss
    assert len(collects.losses) == 3
    # One that cannot be sent back stays as it was, and the result says so.
    assert locked.calls == 0
    assert any(note.startswith("HoldsALock's state stayed in the worker") for note in
               result.notes)


@pytest.mark.launch
def test_load_best_model_at_end_keeps_the_best(run, small_eval):
    import torch

    entries = evaluations(run)
    best = max(entries, key=lambda entry: entry["eval_loss"])  # greater_is_better=True
    assert run.best_step == best["step"] and run.best_metric == best["eval_loss"]
    assert best["step"] < entries[-1]["step"], "the highest loss should be an early one"
    assert run.metrics == {k: v for k, v in best.items() if k not in ("epoch", "step")}
    # The saved model is the best evaluation's: its loss on the CPU is the best's.
    model, tokenizer = run.load_model(), run.load_tokenizer()
    inputs = tokenizer(list(small_eval["text"]), padding="max_length",
                       max_length=run.bucket_lengths[0], return_tensors="pt")
    with torch.no_grad():
        logits = model.eval()(**inputs).logits
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(list(small_eval["label"])))
    assert float(loss) == pytest.approx(best["eval_loss"], abs=1e-4)
    assert float(loss) != pytest.approx(entries[-1]["eval_loss"], abs=1e-4)
    # save_total_limit=1: the newest checkpoint and the best one are left.
    kept = sorted(int(Path(path).name.split("-")[1]) for path in run.checkpoints)
    assert kept == sorted({best["step"], run.steps // EVAL_STEPS * EVAL_STEPS})
    assert run.best_model_checkpoint is not None
    assert run.best_model_checkpoint.endswith(f"checkpoint-{best['step']}")


@pytest.mark.launch
def test_the_result_chart_draws_each_evaluation_as_a_dot(run):
    from hfxla_nb.ui.html import SERIES
    from hfxla_nb.ui.panels import result_html

    page = result_html(run)
    dots = re.findall(r'<circle cx="([\d.]+)" cy="[\d.]+" r="2.5" fill="([^"]+)"', page)
    assert len(dots) == len(evaluations(run)) and {fill for _, fill in dots} == {
        SERIES["eval loss"]}
    # A visible legend says which is which (a tooltip alone was not seen).
    legend = re.search(r'<span class="hfxla-legend"[^>]*>(.*?)</span>', page).group(1)
    assert re.sub(r"<[^>]+>|&nbsp;", " ", legend).split() == ["train", "loss", "eval", "loss"]
    # Each at its step: the evaluations run at logged steps, so at that loss's place.
    steps = [step for step, _ in run.loss_history]
    last = len(steps) - 1
    assert [float(x) for x, _ in dots] == [
        pytest.approx(2 + steps.index(entry["step"]) / last * 236, abs=0.06)
        for entry in evaluations(run)]


@pytest.mark.launch
def test_epoch_evaluation_runs_at_each_epochs_end(cache, tmp_path):
    """`eval_strategy="epoch"`: an evaluation where each epoch ends (15 and 30 here), as
    transformers' `DefaultFlowCallback.on_epoch_end` asks; the last one is the result's."""
    from transformers.trainer_callback import DefaultFlowCallback

    result = hx.fine_tune(
        demo.demo_model_dir(cache=cache), demo.demo_dataset(n=ROWS), batch_size=32,
        max_steps=MAX_STEPS, log_every=LOG_EVERY, num_processes=1, progress=False,
        output_dir=tmp_path / "run", eval_strategy="epoch", compute_metrics=trainer_style,
        metric_for_best_model="argmax_accuracy")
    args = SimpleNamespace(eval_strategy="epoch", eval_delay=0, logging_strategy="steps",
                           save_strategy="no")
    state, expected = TrainerState(max_steps=MAX_STEPS), []
    for epoch_end in (15, 30):
        control, state.global_step, state.epoch = TrainerControl(), epoch_end, epoch_end / 15
        DefaultFlowCallback().on_epoch_end(args, state, control)
        expected += [epoch_end] if control.should_evaluate else []
    assert expected == [15, 30]
    assert [entry["step"] for entry in evaluations(result)] == expected
    assert result.metrics == {k: v for k, v in evaluations(result)[-1].items()
                              if k not in ("epoch", "step")}
    assert result.compiles == 1 and result.eval_compiles == 1
    # compute_metrics as the Trainer calls it: its values beside the run's own, "eval_" added.
    for entry in evaluations(result):
        assert entry["eval_argmax_accuracy"] == pytest.approx(entry["eval_accuracy"])
        assert entry["eval_probability_sum"] == pytest.approx(1.0, abs=1e-5)
        assert entry["eval_rows_seen"] == entry["eval_rows"] == ROWS // 10
    assert result.best_metric == max(e["eval_argmax_accuracy"] for e in evaluations(result))


def trainer_style(prediction):
    """A Trainer-style `compute_metrics`: its argmax, its softmax, its row count."""
    import numpy as np

    scores, labels = prediction.predictions, prediction.label_ids
    return {"argmax_accuracy": float((scores.argmax(-1) == labels).mean()),
            "probability_sum": float(np.exp(scores).sum(-1).mean()), "rows_seen": len(labels)}


class WeightWatcher(TrainerCallback):
    """Reads a weight's norm at every step: a device sync per step."""

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.norm = model.classifier.weight.norm().item()


@pytest.mark.launch
def test_a_callback_that_syncs_every_step_is_named_with_its_line(cache, tmp_path):
    hx.fine_tune(
        demo.demo_model_dir(cache=cache), demo.demo_dataset(n=ROWS), batch_size=32,
        max_steps=20, log_every=LOG_EVERY, num_processes=1, progress="console",
        output_dir=tmp_path / "run", callbacks=[WeightWatcher()])
    line = WeightWatcher.on_step_end.__code__.co_firstlineno + 1
    site = f"`on_step_end` in test_trainer_flow.py, line {line}"
    (alert,) = [a for a in hx.last_launch().ranks[0].metrics.alerts
                if a["code"] == "frequent-transfers"]
    assert alert["title"].endswith(f" values read by a TrainerCallback at {site}"), alert
    assert f"{site} (20 times)" in alert["explanation"], alert
    assert alert["fix"].startswith(f"At {site}: read the value every N steps"), alert


@pytest.fixture(scope="module")
def small_eval():
    return demo.demo_dataset(n=ROWS)["validation"]


# ---------------------------------------------------------------------------------------------
# Without a run
# ---------------------------------------------------------------------------------------------


@pytest.mark.launch
def test_early_stopping_on_a_recorded_sequence():
    """`TrainerRun` with transformers' `EarlyStoppingCallback` stops at the evaluation the
    Trainer's own logic stops at, on a recorded sequence of accuracies."""
    sequence = [0.50, 0.61, 0.60, 0.64, 0.63, 0.64, 0.62, 0.70]
    plan = SimpleNamespace(
        total_steps=80, steps_per_epoch=10, log_every=10, save_steps=None, batch_size=8,
        output_dir=None, save=False, learning_rate=1e-3, gradient_accumulation_steps=1,
        weight_decay=0.0, max_grad_norm=1.0, warmup_steps=0, seed=0,
        trainer=TrainerSettings(eval_strategy="steps", eval_steps=10,
                                metric_for_best_model="eval_accuracy", greater_is_better=True,
                                callbacks=(EarlyStoppingCallback(early_stopping_patience=2),)))
    run = TrainerRun(plan, {}, lambda step: 1e-3)
    run.train_begin(0)
    stopped = None
    for index, accuracy in enumerate(sequence):
        run.step_end((index + 1) * 10)
        run.evaluated((index + 1) * 10, {"eval_accuracy": accuracy})
        if run.control.should_training_stop:
            stopped = (index + 1) * 10
            break
    # best 0.61 at 20; 0.60 (1), 0.64 new best at 40; 0.63 (1), 0.64 not greater (2): stop.
    assert stopped == 60
    assert run.state.best_metric == 0.64 and run.state.best_global_step == 40


def test_the_alerts_know_every_trainer_callback_event():
    from hfxla_nb.observe.alerts import CALLBACK_EVENTS

    assert CALLBACK_EVENTS == {name for name in vars(TrainerCallback) if name.startswith("on_")}


def test_evaluations_reach_the_trackers():
    written = []

    class Writer:
        def scalars(self, step, values, walltime):
            written.append((step, dict(values)))

        def close(self, final, failed):
            pass

    tracker = Tracker(TrackingSettings(("tensorboard",)), lambda name, settings: Writer())
    tracker.handle(Progress(0, 10, 30, {"eval_loss": 0.5, "eval_accuracy": 0.75}, 320,
                            "train", late=True))
    assert written == [(10, {"eval/loss": 0.5, "eval/accuracy": 0.75})]


@pytest.fixture
def no_launch(monkeypatch):
    refuse_launches(monkeypatch)


@pytest.mark.parametrize(("options", "says"), [
    (dict(eval_strategy="steps", eval_steps=5, data="train only"), "no evaluation data"),
    (dict(eval_strategy="steps", metric_for_best_model="bleu"), "reports 'loss', 'accuracy'"),
    (dict(callbacks=[EarlyStoppingCallback()]), "EarlyStoppingCallback stops when"),
    (dict(eval_strategy="steps", callbacks=[EarlyStoppingCallback()]),
     "pass metric_for_best_model="),
    (dict(load_best_model_at_end=True), "eval_strategy='steps' with eval_steps=N"),
    (dict(lr_scheduler_type="reduce_lr_on_plateau"), "decided before the step"),
    (dict(lr_scheduler_type="cosine_annealing"), "not one of transformers' schedules"),
    (dict(lr_scheduler_type="cosine_with_min_lr"), "min_lr"),
    (dict(warmup_steps=10, warmup_ratio=0.1), "pass one of them"),
    (dict(eval_steps=5), "eval_steps=5 is for eval_strategy='steps'"),
    (dict(save_total_limit=2), "save_steps=None writes none"),
    (dict(callbacks=[object()]), "transformers.TrainerCallback instances"),
    (dict(compute_metrics="f1"), "compute_metrics must be a function of a"),
    (dict(compute_metrics=trainer_style, task="masked-lm"), "leave compute_metrics out"),
])
def test_refused_before_any_fork(no_launch, cache, options, says):
    dataset = demo.demo_dataset(n=200)
    if options.pop("data", None):
        dataset = dataset["train"]
    with pytest.raises(FineTuneError, match=None) as caught:
        hx.fine_tune(demo.demo_model_dir(cache=cache), dataset, output_dir=None,
                     progress=False, **options)
    assert says in str(caught.value)
