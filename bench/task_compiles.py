"""Group 16: graphs compiled per task, `fine_tune(task=...)` against the `Trainer` recipe of
that task's Hugging Face notebook (huggingface/notebooks, `examples/`), same tiny model and
demo data, `STEPS` training steps of `BATCH` rows and one evaluation of `EVAL_ROWS` rows.

The recipes, as the notebooks write them:
- token-classification: words tokenized with `is_split_into_words`, each word's tag on its
  first sub-token (-100 elsewhere), `DataCollatorForTokenClassification` (padding per batch);
- question-answering: features of `max_length` tokens (384, at most the model's positions)
  with a stride, padded to `max_length`, start/end positions, `default_data_collator`;
  evaluation is `trainer.predict` on the validation features;
- seq2seq: sources and targets tokenized, `DataCollatorForSeq2Seq` (padding per batch),
  `Seq2SeqTrainer` with `predict_with_generate=True` (generation in the evaluation);
- masked-lm: texts tokenized, concatenated and cut into blocks of 128 tokens (at most the
  model's positions), `DataCollatorForLanguageModeling` (15% masked, per batch);
- multiple-choice: a context with each of the 4 endings, `DataCollatorForMultipleChoice`
  (padding per batch).
Every recipe runs on one XLA:CPU device in one launched worker (`CompileTime` before and
after training, and after the evaluation); `fine_tune` on one device too. Counts are
deterministic: one run each, compiled with XLA's backend optimizations off
(`common.unoptimized_compiles`: the same graphs, compiled faster).
"""

from __future__ import annotations

from typing import Any

from . import common

GROUP = "16 task compiles"
STEPS, BATCH, TRAIN_ROWS, EVAL_ROWS = 4, 8, 64, 16
TASKS = ("token-classification", "question-answering", "seq2seq", "masked-lm",
         "multiple-choice")


def _data(task: str) -> tuple[str, Any, dict[str, Any]]:
    """(model folder, a DatasetDict, fine_tune's task options) of the task's demo."""
    from hfxla_nb import demo
    from hfxla_nb.demo import seq2seq as demo_seq2seq
    from hfxla_nb.demo import tasks as demo_tasks

    rows = TRAIN_ROWS + EVAL_ROWS
    if task == "token-classification":
        return demo_tasks.ner_model_dir(), demo_tasks.ner_dataset(rows), {}
    if task == "question-answering":
        return demo_tasks.qa_model_dir(), demo_tasks.qa_dataset(rows), {}
    if task == "multiple-choice":
        return demo_tasks.mc_model_dir(), demo_tasks.mc_dataset(rows), {}
    if task == "masked-lm":
        return demo_tasks.mlm_model_dir(), demo.demo_dataset(n=rows, splits=(0.8, 0.2)), {}
    data = demo_seq2seq.demo_seq2seq_dataset(n=rows)
    return demo_seq2seq.demo_seq2seq_model_dir(), data, {"source_lang": "en",
                                                         "target_lang": "rev"}


def _splits(data: Any) -> tuple[Any, Any]:
    evaluation = data["validation"]
    return data["train"], evaluation.select(range(min(EVAL_ROWS, len(evaluation))))


def count_fine_tune(task: str) -> dict[str, Any]:
    """Graphs `fine_tune(task=...)` compiled for training and for its evaluation."""
    import hfxla_nb as hx

    folder, data, options = _data(task)
    train, evaluation = _splits(data)
    result = hx.fine_tune(folder, train, eval_dataset=evaluation, task=task, max_steps=STEPS,
                          batch_size=BATCH, num_processes=1, output_dir=None, progress=False,
                          **options)
    return {"train": result.compiles, "eval": result.eval_compiles,
            "buckets": list(result.bucket_lengths)}


# -- the notebooks' recipes (run in the worker) -----------------------------------------------


def _token_classification(tokenizer: Any, train: Any, evaluation: Any) -> tuple:
    from transformers import AutoModelForTokenClassification, DataCollatorForTokenClassification

    def align(rows):
        encoded = tokenizer(rows["tokens"], truncation=True, is_split_into_words=True)
        labels = []
        for i, tags in enumerate(rows["ner_tags"]):
            previous, row = None, []
            for word in encoded.word_ids(batch_index=i):
                row.append(-100 if word is None or word == previous else tags[word])
                previous = word
            labels.append(row)
        encoded["labels"] = labels
        return encoded

    columns = train.column_names
    return (AutoModelForTokenClassification, DataCollatorForTokenClassification(tokenizer),
            train.map(align, batched=True, remove_columns=columns),
            evaluation.map(align, batched=True, remove_columns=columns), False)


def _question_answering(tokenizer: Any, train: Any, evaluation: Any, positions: int) -> tuple:
    from transformers import AutoModelForQuestionAnswering, default_data_collator

    length = min(384, positions)
    stride = length // 3

    def features(rows):
        encoded = tokenizer(rows["question"], rows["context"], truncation="only_second",
                            max_length=length, stride=stride, return_overflowing_tokens=True,
                            return_offsets_mapping=True, padding="max_length")
        mapping = encoded.pop("overflow_to_sample_mapping")
        starts, ends = [], []
        for i, offsets in enumerate(encoded.pop("offset_mapping")):
            ids, sequence = encoded["input_ids"][i], encoded.sequence_ids(i)
            cls = ids.index(tokenizer.cls_token_id)
            answers = rows["answers"][mapping[i]]
            if not answers["answer_start"]:
                starts.append(cls)
                ends.append(cls)
                continue
            first = answers["answer_start"][0]
            last = first + len(answers["text"][0])
            begin = sequence.index(1)
            end = len(sequence) - 1 - sequence[::-1].index(1)
            if not (offsets[begin][0] <= first and offsets[end][1] >= last):
                starts.append(cls)
                ends.append(cls)
                continue
            while begin < len(offsets) and offsets[begin][0] <= first:
                begin += 1
            while offsets[end][1] >= last:
                end -= 1
            starts.append(begin - 1)
            ends.append(end + 1)
        encoded["start_positions"], encoded["end_positions"] = starts, ends
        return encoded

    columns = train.column_names
    return (AutoModelForQuestionAnswering, default_data_collator,
            train.map(features, batched=True, remove_columns=columns),
            evaluation.map(features, batched=True, remove_columns=columns), True)


def _seq2seq(tokenizer: Any, train: Any, evaluation: Any) -> tuple:
    from transformers import AutoModelForSeq2SeqLM

    def encode(rows):
        sources = [pair["en"] for pair in rows["translation"]]
        targets = [pair["rev"] for pair in rows["translation"]]
        encoded = tokenizer(sources, max_length=128, truncation=True)
        encoded["labels"] = tokenizer(text_target=targets, max_length=128,
                                      truncation=True)["input_ids"]
        return encoded

    columns = train.column_names
    return (AutoModelForSeq2SeqLM, "seq2seq",
            train.map(encode, batched=True, remove_columns=columns),
            evaluation.map(encode, batched=True, remove_columns=columns), False)


def _masked_lm(tokenizer: Any, train: Any, evaluation: Any, positions: int) -> tuple:
    from transformers import AutoModelForMaskedLM, DataCollatorForLanguageModeling

    block = min(128, positions)

    def group(rows):
        joined = {k: sum(rows[k], []) for k in rows}
        total = len(joined["input_ids"]) // block * block
        return {k: [v[i:i + block] for i in range(0, total, block)] for k, v in joined.items()}

    def tokenized(split):
        return split.map(lambda rows: tokenizer(rows["text"]), batched=True,
                         remove_columns=split.column_names).map(group, batched=True)

    return (AutoModelForMaskedLM, DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15),
            tokenized(train), tokenized(evaluation), False)


def _multiple_choice(tokenizer: Any, train: Any, evaluation: Any) -> tuple:
    from transformers import AutoModelForMultipleChoice, DataCollatorForMultipleChoice

    def encode(rows):
        firsts = [[context] * 4 for context in rows["sent1"]]
        seconds = [[f"{start} {rows[f'ending{k}'][i]}" for k in range(4)]
                   for i, start in enumerate(rows["sent2"])]
        encoded = tokenizer(sum(firsts, []), sum(seconds, []), truncation=True)
        out = {k: [v[i:i + 4] for i in range(0, len(v), 4)] for k, v in encoded.items()}
        out["labels"] = rows["label"]
        return out

    columns = train.column_names
    return (AutoModelForMultipleChoice, DataCollatorForMultipleChoice(tokenizer),
            train.map(encode, batched=True, remove_columns=columns),
            evaluation.map(encode, batched=True, remove_columns=columns), False)


def run_recipe(task: str, folder: str, train: Any, evaluation: Any) -> dict[str, int]:
    """The task's notebook recipe with `Trainer` in this (worker) process: graphs compiled by
    `STEPS` training steps and by one evaluation."""
    import torch
    from transformers import (
        AutoConfig,
        AutoTokenizer,
        DataCollatorForSeq2Seq,
        Seq2SeqTrainer,
        Seq2SeqTrainingArguments,
        Trainer,
        TrainingArguments,
    )

    tokenizer = AutoTokenizer.from_pretrained(folder)
    positions = int(getattr(AutoConfig.from_pretrained(folder), "max_position_embeddings", 512))
    recipes = {"token-classification": lambda: _token_classification(tokenizer, train,
                                                                      evaluation),
               "question-answering": lambda: _question_answering(tokenizer, train, evaluation,
                                                                 positions),
               "seq2seq": lambda: _seq2seq(tokenizer, train, evaluation),
               "masked-lm": lambda: _masked_lm(tokenizer, train, evaluation, positions),
               "multiple-choice": lambda: _multiple_choice(tokenizer, train, evaluation)}
    auto, collator, train_set, eval_set, predicts = recipes[task]()
    torch.manual_seed(0)
    model = auto.from_pretrained(folder)
    options = dict(output_dir="/tmp/hfxla_nb_bench_task_trainer", max_steps=STEPS,
                   per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH,
                   learning_rate=1e-4, optim="adamw_torch", save_strategy="no", report_to="none",
                   disable_tqdm=True,
                   seed=0)
    if collator == "seq2seq":
        collator = DataCollatorForSeq2Seq(tokenizer, model=model)
        trainer = Seq2SeqTrainer(
            model, Seq2SeqTrainingArguments(predict_with_generate=True,
                                            generation_max_length=16, **options),
            train_dataset=train_set, eval_dataset=eval_set, data_collator=collator,
            processing_class=tokenizer)
    else:
        trainer = Trainer(model, TrainingArguments(**options), train_dataset=train_set,
                          eval_dataset=eval_set, data_collator=collator,
                          processing_class=tokenizer)
    # The QA notebook predicts on the validation features, then post-processes.
    return trainer_compiles(trainer, (lambda: trainer.predict(eval_set)) if predicts else None)


def trainer_compiles(trainer: Any, evaluate: Any = None) -> dict[str, int]:
    """Graphs `trainer.train()` compiled, then its evaluation (`evaluate`, default
    `trainer.evaluate`), in this (worker) process."""
    from . import workloads

    start = workloads.counters()["CompileTime"]
    trainer.train()
    trained = workloads.counters()["CompileTime"]
    (evaluate or trainer.evaluate)()
    return {"train": int(trained - start),
            "eval": int(workloads.counters()["CompileTime"] - trained)}


def _recipes_worker(config: dict) -> dict[str, dict[str, int]]:
    return {task: run_recipe(task, *arguments) for task, arguments in config["tasks"].items()}


def count_trainer_recipes(tasks: tuple[str, ...] = TASKS) -> dict[str, dict[str, int]]:
    """Every task's recipe in one launched worker (one device): graphs per task."""
    from . import workloads

    arguments = {}
    for task in tasks:
        folder, data, _ = _data(task)
        arguments[task] = (folder, *_splits(data))
    return workloads.launched(_recipes_worker, {"tasks": arguments})


def run() -> list[common.Figure]:
    with common.unoptimized_compiles():
        theirs = count_trainer_recipes()
        common.say(f"  Trainer recipes: {theirs}")
        mine = {}
        for task in TASKS:
            mine[task] = count_fine_tune(task)
            common.say(f"  fine_tune {task}: {mine[task]}")
    figures = []
    setting = (f"{STEPS} training steps of {BATCH} rows + one evaluation of {EVAL_ROWS} rows; "
               f"{common.UNOPTIMIZED_NOTE}")
    for task in TASKS:
        ours = mine[task]
        buckets = ", ".join(map(str, ours["buckets"]))
        figures.append(common.Figure(
            GROUP, f"{task}: graphs compiled, fine_tune (training + evaluation)",
            ours["train"] + ours["eval"], "graphs",
            note=f"{ours['train']} training + {ours['eval']} evaluation; buckets {buckets} "
                 f"tokens; {setting}; 1 run"))
        figures.append(common.Figure(
            GROUP, f"{task}: graphs compiled, the notebook's Trainer recipe",
            theirs[task]["train"] + theirs[task]["eval"], "graphs",
            note=f"{theirs[task]['train']} training + {theirs[task]['eval']} evaluation; "
                 f"same model, data and compile flags; 1 run"))
    return figures
