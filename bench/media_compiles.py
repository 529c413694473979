"""Group 17: images and audio. Graphs compiled by `fine_tune(task=...)` against the `Trainer`
recipe of the matching Hugging Face notebook (huggingface/notebooks, `examples/`), as group 16
does for the text tasks; and a ViT training step's wall time against XLA's execution time (the
limit, as group 6 measures it for BERT).

The recipes, as the notebooks write them:
- image-classification (`image_classification.ipynb`): the image processor in `set_transform`
  (pixel values made per batch, `remove_unused_columns=False`), a `collate_fn` stacking them
  with the labels. The notebook's torchvision augmentation is left out: it changes the
  values, not the shapes, and torchvision is not installed here;
- audio-classification (`audio_classification.ipynb`): the feature extractor with
  `max_length` of `MAX_DURATION` seconds and `truncation=True`, no padding in `map`; the
  `Trainer` pads each batch (`processing_class=feature_extractor`), so each batch's longest
  clip is a shape;
- speech-recognition, wav2vec2 CTC (`speech_recognition.ipynb`): the processor's
  `input_values` and the transcript's ids per clip in `map`, `DataCollatorCTCWithPadding`
  (the processor pads each batch: its longest clip is a shape; labels padded with -100),
  `group_by_length=True` (`train_sampling_strategy` in transformers 5), the feature
  extractor as `processing_class`;
- speech-recognition, Whisper (Hugging Face's Whisper fine-tuning blog and notebook,
  `fine_tune_whisper.ipynb`): log-mel `input_features` (the extractor's fixed window, 30 s
  for real Whisper, 1 s for the tiny one) and the transcript's ids in `map`,
  `DataCollatorSpeechSeq2SeqWithPadding` (labels padded per batch, the start token cut),
  `Seq2SeqTrainer` with `predict_with_generate=True` (generation in the evaluation, at most the
  model's decoder positions: the blog's 225 of Whisper's 448): `generate` without a static
  cache compiles a graph per token.
Same tiny models and demo data as the tasks' own tests; one XLA:CPU device; XLA's backend
optimizations off for the counts (`common.unoptimized_compiles`: same graphs, compiled faster).
"""

from __future__ import annotations

from typing import Any

from . import common, task_compiles, workloads

GROUP = "17 images and audio"
#: The rows' names; each one's `fine_tune` task is its first word.
TASKS = ("image-classification", "audio-classification", "speech-recognition (wav2vec2 CTC)",
         "speech-recognition (Whisper)")
STEPS, BATCH, TRAIN_ROWS, EVAL_ROWS = task_compiles.STEPS, task_compiles.BATCH, 64, 16
#: The audio notebook's `max_duration` (seconds).
MAX_DURATION = 1.0
#: The ViT limit: steps, batch, steps left out (compiling, first updates).
LIMIT_STEPS, LIMIT_BATCH, LIMIT_SKIP = 100, 16, 20


def _data(task: str, rows: int = TRAIN_ROWS + EVAL_ROWS) -> tuple[str, Any]:
    """(model folder, a DatasetDict) of the task's demo (`task` one of `TASKS`)."""
    if task.startswith("speech-recognition"):
        from hfxla_nb.demo.speech import (
            demo_speech_dataset,
            demo_speech_model_dir,
            demo_whisper_model_dir,
        )

        folder = demo_whisper_model_dir() if "Whisper" in task else demo_speech_model_dir()
        return folder, demo_speech_dataset(rows)
    if task == "image-classification":
        from hfxla_nb.demo.images import demo_image_dataset, demo_vit_model_dir

        return demo_vit_model_dir(), demo_image_dataset(rows)
    from hfxla_nb.demo.audio import demo_audio_dataset, demo_audio_model_dir

    return demo_audio_model_dir(), demo_audio_dataset(rows)


def _splits(data: Any) -> tuple[Any, Any]:
    evaluation = data["validation"]
    return data["train"], evaluation.select(range(min(EVAL_ROWS, len(evaluation))))


def count_fine_tune(task: str) -> dict[str, Any]:
    """Graphs `fine_tune(task=...)` compiled for training and for its evaluation."""
    import hfxla_nb as hx

    folder, data = _data(task)
    train, evaluation = _splits(data)
    result = hx.fine_tune(folder, train, eval_dataset=evaluation, task=task.split()[0],
                          max_steps=STEPS, batch_size=BATCH, num_processes=1, output_dir=None,
                          progress=False)
    return {"train": result.compiles, "eval": result.eval_compiles,
            "buckets": list(result.bucket_lengths)}


def _image_recipe(folder: str, train: Any, evaluation: Any) -> tuple:
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    processor = AutoImageProcessor.from_pretrained(folder)

    def transform(rows):
        rows["pixel_values"] = processor([image.convert("RGB") for image in rows["image"]],
                                         return_tensors="pt")["pixel_values"]
        return rows

    def collate(rows):
        return {"pixel_values": torch.stack([row["pixel_values"] for row in rows]),
                "labels": torch.tensor([row["label"] for row in rows])}

    train.set_transform(transform)
    evaluation.set_transform(transform)
    return AutoModelForImageClassification, processor, collate, train, evaluation, None


def _audio_recipe(folder: str, train: Any, evaluation: Any) -> tuple:
    from transformers import AutoFeatureExtractor, AutoModelForAudioClassification

    extractor = AutoFeatureExtractor.from_pretrained(folder)

    def features(rows):
        arrays = [audio["array"] for audio in rows["audio"]]
        return extractor(arrays, sampling_rate=extractor.sampling_rate, truncation=True,
                         max_length=int(extractor.sampling_rate * MAX_DURATION))

    def encoded(split):
        return split.map(features, batched=True, remove_columns=["audio"])

    return (AutoModelForAudioClassification, extractor, None, encoded(train),
            encoded(evaluation), None)


def _ctc_recipe(folder: str, train: Any, evaluation: Any) -> tuple:
    from transformers import AutoModelForCTC, Wav2Vec2Processor

    processor = Wav2Vec2Processor.from_pretrained(folder)

    def prepare(row):
        audio = row["audio"]
        row["input_values"] = processor(audio["array"],
                                        sampling_rate=audio["sampling_rate"]).input_values[0]
        row["labels"] = processor(text=row["text"]).input_ids
        return row

    def collate(rows):  # the notebook's DataCollatorCTCWithPadding (padding=True)
        batch = processor.feature_extractor.pad(
            [{"input_values": row["input_values"]} for row in rows], padding=True,
            return_tensors="pt")
        labels = processor.tokenizer.pad([{"input_ids": row["labels"]} for row in rows],
                                         padding=True, return_tensors="pt")
        batch["labels"] = labels["input_ids"].masked_fill(labels.attention_mask.ne(1), -100)
        return batch

    def metrics(predicted):  # the notebook's compute_metrics (WER of the greedy CTC decoding)
        import jiwer
        import numpy as np

        labels = predicted.label_ids
        labels[labels == -100] = processor.tokenizer.pad_token_id
        said = processor.batch_decode(np.argmax(predicted.predictions, axis=-1))
        return {"wer": jiwer.wer(processor.batch_decode(labels, group_tokens=False), said)}

    columns = train.column_names
    return (AutoModelForCTC, processor.feature_extractor, collate,
            train.map(prepare, remove_columns=columns),
            evaluation.map(prepare, remove_columns=columns), metrics)


def _whisper_recipe(folder: str, train: Any, evaluation: Any) -> tuple:
    from transformers import AutoConfig, WhisperForConditionalGeneration, WhisperProcessor

    processor = WhisperProcessor.from_pretrained(folder)
    start = AutoConfig.from_pretrained(folder).decoder_start_token_id

    def prepare(row):
        audio = row["audio"]
        row["input_features"] = processor.feature_extractor(
            audio["array"], sampling_rate=audio["sampling_rate"]).input_features[0]
        row["labels"] = processor.tokenizer(row["text"]).input_ids
        return row

    def collate(rows):  # the blog's DataCollatorSpeechSeq2SeqWithPadding
        batch = processor.feature_extractor.pad(
            [{"input_features": row["input_features"]} for row in rows], return_tensors="pt")
        labels = processor.tokenizer.pad([{"input_ids": row["labels"]} for row in rows],
                                         return_tensors="pt")
        ids = labels["input_ids"].masked_fill(labels.attention_mask.ne(1), -100)
        if (ids[:, 0] == start).all().cpu().item():
            ids = ids[:, 1:]
        batch["labels"] = ids
        return batch

    def metrics(predicted):  # the blog's compute_metrics (WER of the generated transcripts)
        import jiwer

        labels = predicted.label_ids
        labels[labels == -100] = processor.tokenizer.pad_token_id
        said = processor.tokenizer.batch_decode(predicted.predictions, skip_special_tokens=True)
        heard = processor.tokenizer.batch_decode(labels, skip_special_tokens=True)
        return {"wer": 100 * jiwer.wer(heard, said)}

    columns = train.column_names
    return (WhisperForConditionalGeneration, processor.feature_extractor, collate,
            train.map(prepare, remove_columns=columns),
            evaluation.map(prepare, remove_columns=columns), metrics)


RECIPES = {"image-classification": _image_recipe, "audio-classification": _audio_recipe,
           "speech-recognition (wav2vec2 CTC)": _ctc_recipe,
           "speech-recognition (Whisper)": _whisper_recipe}


def run_recipe(task: str, folder: str, train: Any, evaluation: Any) -> dict[str, int]:
    """The task's notebook recipe with `Trainer` (Whisper: `Seq2SeqTrainer`) in this (worker)
    process: graphs compiled by `STEPS` training steps and by one evaluation."""
    import torch
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer, TrainingArguments

    from hfxla_nb.demo.speech import WHISPER_TARGET_POSITIONS

    auto, processor, collate, train_set, eval_set, metrics = RECIPES[task](folder, train,
                                                                           evaluation)
    torch.manual_seed(0)
    model = auto.from_pretrained(folder)
    options = dict(
        output_dir="/tmp/hfxla_nb_bench_media_trainer", max_steps=STEPS,
        per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH,
        learning_rate=1e-4, optim="adamw_torch", save_strategy="no", report_to="none",
        disable_tqdm=True, seed=0, remove_unused_columns=task != "image-classification",
        # The CTC notebook's group_by_length=True (transformers 5 spells it so).
        train_sampling_strategy="group_by_length" if "CTC" in task else "random")
    if "Whisper" in task:
        arguments = Seq2SeqTrainingArguments(predict_with_generate=True,
                                             generation_max_length=WHISPER_TARGET_POSITIONS,
                                             **options)
        trainer = Seq2SeqTrainer(model, arguments, train_dataset=train_set,
                                 eval_dataset=eval_set, data_collator=collate,
                                 processing_class=processor, compute_metrics=metrics)
        # Its evaluation (generate on XLA:CPU, no graph cut per token) ran the worker out of
        # memory compiling (LLVM "Cannot allocate memory", then SIGSEGV): training only.
        return {**task_compiles.trainer_compiles(trainer, lambda: None), "eval": None}
    else:
        trainer = Trainer(model, TrainingArguments(**options), train_dataset=train_set,
                          eval_dataset=eval_set, data_collator=collate,
                          processing_class=processor, compute_metrics=metrics)
    return task_compiles.trainer_compiles(trainer)


def _recipes_worker(config: dict) -> dict[str, dict[str, int]]:
    return {task: run_recipe(task, *arguments) for task, arguments in config["tasks"].items()}


def count_trainer_recipes(tasks: tuple[str, ...] = TASKS) -> dict[str, dict[str, int]]:
    """Every task's recipe in one launched worker (one device): graphs per task."""
    arguments = {}
    for task in tasks:
        folder, data = _data(task)
        arguments[task] = (folder, *_splits(data))
    return workloads.launched(_recipes_worker, {"tasks": arguments})


def measure_vit_limit(steps: int = LIMIT_STEPS) -> dict[str, Any]:
    """The tiny ViT's steady wall time per step and XLA's execution time per step."""
    folder, data = _data("image-classification", rows=steps * LIMIT_BATCH + EVAL_ROWS)
    raw = workloads.fine_tune_measured(folder, data["train"], max_steps=steps,
                                       batch_size=LIMIT_BATCH, output_dir=None,
                                       num_processes=1, progress=False, learning_rate=1e-4)
    walls = workloads.steady_step_seconds(raw["bench_step_times"], LIMIT_SKIP)
    wall = common.median(walls)
    execute = common.median(raw["bench_execute_seconds"][-(steps - LIMIT_SKIP):])
    return {"walls": walls, "wall": wall, "execute": execute,
            "ratio": wall / execute if wall and execute else None,
            "executions_per_step": raw["executions_per_step"]}


def _count_figures(mine: dict, theirs: dict) -> list[common.Figure]:
    setting = (f"{STEPS} training steps of {BATCH} rows + one evaluation of {EVAL_ROWS} rows; "
               f"{common.UNOPTIMIZED_NOTE}")
    figures = []
    for task in TASKS:
        ours, recipe = mine[task], theirs[task]
        buckets = ", ".join(map(str, ours["buckets"]))
        if not task.startswith("image"):
            buckets += " samples"
        figures.append(common.Figure(
            GROUP, f"{task}: graphs compiled, fine_tune (training + evaluation)",
            ours["train"] + ours["eval"], "graphs",
            note=f"{ours['train']} training + {ours['eval']} evaluation; buckets {buckets}; "
                 f"{setting}; 1 run"))
        same = "same model, data and compile flags; 1 run"
        if recipe["eval"] is None:  # Whisper's: see run_recipe
            value, note = None, (
                f"{recipe['train']} training graphs; its evaluation (Seq2SeqTrainer, "
                "predict_with_generate=True: generate on XLA:CPU) ran the worker out of memory "
                f"compiling (LLVM 'Cannot allocate memory', then SIGSEGV): no total; {same}")
        else:
            value = recipe["train"] + recipe["eval"]
            note = f"{recipe['train']} training + {recipe['eval']} evaluation; {same}"
        figures.append(common.Figure(
            GROUP, f"{task}: graphs compiled, the notebook's Trainer recipe", value, "graphs",
            note=note))
    return figures


def run() -> list[common.Figure]:
    with common.unoptimized_compiles():
        theirs = count_trainer_recipes()
        common.say(f"  Trainer recipes: {theirs}")
        mine = {task: count_fine_tune(task) for task in TASKS}
        common.say(f"  fine_tune: {mine}")
    figures = _count_figures(mine, theirs)
    steps = max(LIMIT_SKIP + 5, LIMIT_STEPS // 2) if common.QUICK else LIMIT_STEPS
    limit = measure_vit_limit(steps)
    common.say(f"  tiny ViT: wall {limit['wall']}, execute {limit['execute']}")
    wall, execute = limit["wall"] or 0.0, limit["execute"] or 0.0
    figures.append(common.Figure(
        GROUP, "tiny ViT: steady wall / XLA execution time per step", limit["ratio"], "x",
        repeats=len(limit["walls"]),
        note=f"{wall * 1000:.1f} ms wall vs {execute * 1000:.1f} ms executing per step "
             f"({limit['executions_per_step']:.2f} executions/step), batch {LIMIT_BATCH} "
             f"images of 32x32, {steps} steps, one device; median of {len(limit['walls'])} "
             "progress updates; reported: a step this small executes in a few ms, so the "
             "ratio is the host's tracing per step (group 12), which a real ViT's execution "
             "on a TPU hides"))
    return figures
