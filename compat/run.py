"""`make compat`: fine-tune a tiny model of every family in `compat/families.py` as its
checkpoint ships (sizes shrunk), then predict (and generate), and write
docs/compatibility.md: one row per family and task.

Each row: whether it works (or the first line of its error), the graphs compiled for training
and evaluation, whether the training steps were replayed by their compiled graph (or why
not), whether the losses equal those of the same run with every step traced (bit for bit),
the ops that ran on the CPU, and the host's CPU per step of both runs.

Usage: python -m compat.run [--only NAME ...] [--out FILE]   (XLA on the CPU: PJRT_DEVICE=CPU)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from compat.families import FAMILIES, Family  # noqa: E402 - after the path

ROOT = Path(__file__).resolve().parents[1]
STEPS = 10
BATCH = 8
ROWS = 160


@dataclass
class Row:
    """What one family did."""

    family: Family
    works: str = "no"
    graphs: str = ""
    steps: str = ""
    equal: str = ""
    fallbacks: str = ""
    predict: str = ""
    host: str = ""
    seconds: float = 0.0


def _ids(tokenizer: Any) -> dict[str, int]:
    """The token ids a config names, from the tokenizer the row trains with."""
    ids = {"pad_token_id": tokenizer.pad_token_id}
    for name in ("bos", "eos"):
        value = getattr(tokenizer, f"{name}_token_id", None)
        if value is None:
            value = tokenizer.cls_token_id if name == "bos" else tokenizer.sep_token_id
        ids[f"{name}_token_id"] = value
    return ids


def build(family: Family, folder: Path) -> tuple[Any, dict[str, Any], list]:
    """The family's tiny model saved in `folder` with its tokenizer or processor; returns the
    training data, `fine_tune`'s task options and a few inputs to predict."""
    import transformers

    from hfxla_nb import demo

    config_class = getattr(transformers, family.config)
    settings = {**family.shipped, **family.sizes}
    task = family.task
    if task in ("classification", "token-classification", "question-answering"):
        from hfxla_nb.demo.tasks import ner_dataset, qa_dataset

        tokenizer = demo.demo_tokenizer()
        config = config_class(vocab_size=len(tokenizer), **_ids(tokenizer), **settings)
        auto = {"classification": "AutoModelForSequenceClassification",
                "token-classification": "AutoModelForTokenClassification",
                "question-answering": "AutoModelForQuestionAnswering"}[task]
        data = {"classification": lambda: demo.demo_dataset(n=ROWS),
                "token-classification": lambda: ner_dataset(n=ROWS),
                "question-answering": lambda: qa_dataset(n=ROWS)}[task]()
        validation = data["validation"]
        inputs = (list(validation["text"][:2]) if task == "classification"
                  else [" ".join(row) for row in validation["tokens"][:2]]
                  if task == "token-classification"
                  else [{"question": row["question"], "context": row["context"]}
                        for row in validation.select(range(2))])
        processor, options = tokenizer, {}
    elif task == "causal-lm":
        from hfxla_nb.demo.lm import demo_lm_dataset, demo_lm_model_dir

        tokenizer = transformers.AutoTokenizer.from_pretrained(demo_lm_model_dir())
        config = config_class(vocab_size=len(tokenizer), **_ids(tokenizer), **settings)
        auto, data = "AutoModelForCausalLM", demo_lm_dataset(ROWS)
        inputs = list(data["validation"]["prompt"][:2])
        processor = tokenizer
        options = {"prompt_column": "prompt", "response_column": "response",
                   "lora": family.lora}
    elif task == "seq2seq":
        from hfxla_nb.demo.seq2seq import demo_seq2seq_dataset, demo_seq2seq_tokenizer

        tokenizer = demo_seq2seq_tokenizer()
        start = 0 if family.config == "T5Config" or family.config == "MarianConfig" else 1
        config = config_class(vocab_size=len(tokenizer), pad_token_id=0, eos_token_id=1,
                              bos_token_id=1, decoder_start_token_id=start, **settings)
        auto, data = "AutoModelForSeq2SeqLM", demo_seq2seq_dataset(n=ROWS)
        inputs = [row["en"] for row in data["validation"]["translation"][:2]]
        processor = tokenizer
        options = {"source_lang": "en", "target_lang": "rev"}
    elif task == "speech-recognition":
        from hfxla_nb.demo.speech import demo_speech_dataset, demo_whisper_model_dir

        shutil.copytree(demo_whisper_model_dir(), folder, dirs_exist_ok=True)
        config = config_class.from_pretrained(folder)
        for name, value in family.shipped.items():
            setattr(config, name, value)
        model = transformers.AutoModelForSpeechSeq2Seq.from_config(config)
        model.save_pretrained(folder)
        data = demo_speech_dataset(ROWS)
        return data, {}, [row["array"] for row in data["validation"]["audio"][:2]]
    elif task == "audio-classification":
        from hfxla_nb.demo.audio import AUDIO_LABELS, RATE, demo_audio_dataset

        config = config_class(num_labels=len(AUDIO_LABELS), **settings)
        processor = transformers.Wav2Vec2FeatureExtractor(
            feature_size=1, sampling_rate=RATE, padding_value=0.0, do_normalize=True,
            return_attention_mask=False)
        auto, data = "AutoModelForAudioClassification", demo_audio_dataset(ROWS)
        inputs = [row["array"] for row in data["validation"]["audio"][:2]]
        options = {}
    elif task == "image-classification":
        from hfxla_nb.demo.images import IMAGE_LABELS, IMAGE_SIZE, demo_image_dataset

        config = config_class(num_labels=len(IMAGE_LABELS), **settings)
        from transformers.models.auto import modeling_auto

        heads = modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES.get(config.model_type)
        if isinstance(heads, tuple):  # DeiT has two heads: the Auto class needs one named
            config.architectures = [heads[0]]
        processor = transformers.ViTImageProcessor(
            size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
        auto, data = "AutoModelForImageClassification", demo_image_dataset(ROWS)
        inputs = list(data["validation"]["image"][:2])
        options = {}
    else:
        raise ValueError(f"no builder for task {task!r}")
    import torch

    torch.manual_seed(0)
    model = getattr(transformers, auto).from_config(config)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return data, options, inputs


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    for line in text.splitlines():
        if line.strip() and not line.startswith("Remote traceback"):
            return f"{type(error).__name__}: {line.strip()}"[:200]
    return type(error).__name__


def run_family(family: Family) -> Row:
    """Fine-tune the family's tiny model twice (steps replayed where allowed, and every step
    traced), then predict (and generate) with the first."""
    import hfxla_nb as hx

    row = Row(family)
    start = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="hfxla_nb-compat-"))
    try:
        data, options, inputs = build(family, folder / "model")
        common = dict(task=family.task, max_steps=STEPS, batch_size=BATCH, log_every=1,
                      learning_rate=1e-3, progress=False, keep_warm=False, **options)
        replayed = hx.fine_tune(str(folder / "model"), data, output_dir=str(folder / "out"),
                                **common)
        traced = hx.fine_tune(str(folder / "model"), data, output_dir=None,
                              compiled_steps=False, **common)
        row.works = "yes"
        row.graphs = f"{replayed.compiles} + {replayed.eval_compiles}"
        row.steps = "; ".join(sorted(set(replayed.compiled_steps.values()))) or "-"
        row.equal = "yes" if replayed.loss_history == traced.loss_history else "no"
        row.fallbacks = ", ".join(sorted(replayed.xla.get("fallbacks") or {})) or "none"
        row.host = " / ".join("-" if run.host_ms_per_step is None else
                              f"{run.host_ms_per_step:.1f}" for run in (replayed, traced))
        try:
            if family.task == "causal-lm":
                replayed.generate(inputs, max_new_tokens=4, progress=False)
            replayed.predict(inputs, progress=False)
            row.predict = "yes"
        except Exception as error:  # noqa: BLE001 - the row says what failed
            row.predict = _first_line(error)
    except Exception as error:  # noqa: BLE001 - the row says what failed
        row.works = _first_line(error)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        row.seconds = time.perf_counter() - start
    return row


HEADER = """# Compatibility: transformers' architectures as their checkpoints ship

`make compat` (`compat/run.py`) builds a tiny model of each family below: the named checkpoint's
config class and the training-time settings it ships with (`compat/families.py`: dropout,
LayerDrop, SpecAugment, experts and routing, sliding windows, soft-capping, rope scaling, tied
embeddings, batch norm), only its sizes shrunk. Each is fine-tuned {steps} steps on its task
({batch} rows a step, XLA on the CPU, one device), then predicts (and a causal LM generates).

- **works**: yes, or the first line of its error.
- **graphs**: compiled for training + for evaluation.
- **steps**: "replayed" (each later step ran by the first step's compiled graph, with no
  trace), or "traced:" and why not (`FineTuneResult.compiled_steps`; docs/speed.md).
- **= traced**: the losses equal, bit for bit, those of the same run with every step traced
  (`compiled_steps=False`).
- **on the CPU**: ops that ran on the CPU (no XLA lowering).
- **predict**: `result.predict` (and `generate`) on two inputs.
- **host**: milliseconds of the training thread's CPU per step after the warm-up: this run,
  then the same run with every step traced (`FineTuneResult.host_ms_per_step`). A graph
  compiled after the warm-up is paid there: a shape first seen late, or a step that traces
  another graph at each draw (LayerDrop, SpecAugment).

Written by `make compat` on {date} (torch_xla {xla}, transformers {transformers}), in
{minutes:.1f} minutes. CI runs a fixed subset (`tests/test_compat.py`).

| family | checkpoint | task | works | graphs | steps | = traced | on the CPU | predict | host | s |
|---|---|---|---|---|---|---|---|---|---|---|
"""


def table(rows: list[Row], minutes: float) -> str:
    """docs/compatibility.md's text."""
    from importlib.metadata import version

    text = HEADER.format(steps=STEPS, batch=BATCH, date=time.strftime("%Y-%m-%d"),
                         xla=version("torch_xla"), transformers=version("transformers"),
                         minutes=minutes)
    for row in rows:
        cells = [row.family.row, f"`{row.family.checkpoint}`", row.family.task, row.works,
                 row.graphs, row.steps, row.equal, row.fallbacks, row.predict, row.host,
                 f"{row.seconds:.0f}"]
        text += "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |\n"
    working = sum(row.works == "yes" for row in rows)
    families = len({row.family.name for row in rows})
    text += (f"\n{working} of {len(rows)} rows work; {families} families.\n")
    return text


def _key(line: str) -> tuple[str, ...]:
    """A table line's family, checkpoint and task."""
    return tuple(cell.strip() for cell in line.strip("|\n").split(" | ")[:3])


def merged(old: str, new: str) -> str:
    """The table `old` with the rows of `new` in place of its rows of the same family and
    task (`--only`); the count of working rows made again."""
    fresh = {_key(line): line for line in new.splitlines() if line.startswith("| ")
             and not line.startswith(("| family", "|---"))}
    lines = [fresh.get(_key(line), line) if line.startswith("| ") else line
             for line in old.splitlines()]
    rows = [line for line in lines if line.startswith("| ")
            and not line.startswith(("| family", "|---"))]
    working = sum(line.split(" | ")[3].strip() == "yes" for line in rows)
    families = len({_key(line)[0].removesuffix(" + LoRA") for line in rows})
    lines = [f"{working} of {len(rows)} rows work; {families} families." if
             line.endswith("families.") and " rows work; " in line else line for line in lines]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", help="only these rows (family names)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "compatibility.md")
    options = parser.parse_args(argv)
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" at each row's save
    chosen = [family for family in FAMILIES
              if not options.only or family.row in options.only or family.name in options.only]
    start = time.perf_counter()
    rows = []
    for family in chosen:
        row = run_family(family)
        print(f"{row.family.row:<16} {row.family.task:<22} {row.works[:60]:<60} "
              f"{row.steps[:50]} ({row.seconds:.0f} s)", flush=True)
        rows.append(row)
    text = table(rows, (time.perf_counter() - start) / 60)
    if options.only and options.out.exists():  # these rows updated in the table there
        text = merged(options.out.read_text(), text)
    options.out.write_text(text)
    print(f"wrote {options.out}")
    return 0 if all(row.works == "yes" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
