"""The embedded causal-LM default: a tiny Llama-style model and prompt/response data, offline.

```python
from hfxla_nb.demo.lm import demo_lm_dataset, demo_lm_model_dir
result = hx.fine_tune(demo_lm_model_dir(), demo_lm_dataset(), prompt_column="prompt",
                      response_column="response", sharding="fsdp", num_processes=4)
result.generate(["review: the coffee was great.\\nverdict:"])
```

The data are the demo reviews (`hfxla_nb.demo`) as a tiny instruction task: the prompt is a
review, the response its verdict. The model is a 2-layer Llama built from a config, with the
demo tokenizer, written with `save_pretrained` so it loads through `from_pretrained(folder)`.
`python -m hfxla_nb.demo.lm` (what `make demo TASK=causal-lm` runs) fine-tunes it with FSDPv2.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import (
    LABELS_3,
    MAX_POSITIONS,
    RECIPE_VERSION,
    build_atomically,
    cache_dir,
    demo_label_names,
    demo_output_dir,
    demo_texts,
    demo_tokenizer,
    save_seeded_model,
)

if TYPE_CHECKING:
    import datasets

TEMPLATE = "review: {prompt}\nverdict: {response}"
# One token each in the demo Llama's vocabulary: the template's words and every label, so the
# response is one whole word the model learns (and `generate` shows), not a spelling.
VOCABULARY_WORDS = ("review", "verdict", ":", *LABELS_3)
# Bump when the demo Llama's recipe changes (its folder is keyed on it and RECIPE_VERSION).
LM_RECIPE_VERSION = 2


def demo_lm_dataset(n: int = 2000, seed: int = 0) -> datasets.DatasetDict:
    """Prompt/response pairs (and the same as one `text`), made deterministically: the prompt
    is a demo review, the response its verdict ("positive" or "negative").

    Returns:
        `datasets.DatasetDict` with "train" (90%) and "validation" splits and the columns
        `prompt`, `response` and `text` (`TEMPLATE` filled in).
    """
    import datasets

    texts, labels = demo_texts(n, seed, 2)
    names = demo_label_names(2)
    responses = [names[label] for label in labels]
    joined = [TEMPLATE.format(prompt=p, response=r) for p, r in zip(texts, responses, strict=True)]
    cut = int(n * 0.9)
    return datasets.DatasetDict({
        split: datasets.Dataset.from_dict({"prompt": texts[a:b], "response": responses[a:b],
                                           "text": joined[a:b]})
        for split, (a, b) in {"train": (0, cut), "validation": (cut, n)}.items()
    })


def demo_lm_config(vocab_size: int, pad_id: int, bos_id: int, eos_id: int):
    """A tiny Llama: 2 layers, hidden 64, 4 heads (2 key/value heads), 128 positions."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS,
        pad_token_id=pad_id, bos_token_id=bos_id, eos_token_id=eos_id,
        tie_word_embeddings=False,
    )


def demo_lm_model_dir(seed: int = 0, cache: str | os.PathLike | None = None) -> str:
    """A freshly initialized tiny Llama and its tokenizer, in a cached folder.

    `AutoModelForCausalLM.from_pretrained(folder)` and `AutoTokenizer.from_pretrained(folder)`
    load it offline. The tokenizer is the demo WordPiece with `[CLS]` as beginning and `[SEP]`
    as end of text, whose vocabulary also holds `VOCABULARY_WORDS` (each label one token).
    """
    target = cache_dir(cache) / f"demo-llama-v{RECIPE_VERSION}.{LM_RECIPE_VERSION}-seed{seed}"
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return str(target)

    def build(tmp: Path) -> None:
        from transformers import LlamaForCausalLM

        tokenizer = demo_tokenizer(cache, extra_words=VOCABULARY_WORDS)
        tokenizer.bos_token, tokenizer.eos_token = "[CLS]", "[SEP]"
        tokenizer.model_input_names = ["input_ids", "attention_mask"]
        config = demo_lm_config(len(tokenizer), tokenizer.pad_token_id, tokenizer.bos_token_id,
                                tokenizer.eos_token_id)
        save_seeded_model(LlamaForCausalLM, config, seed, tokenizer, tmp)

    build_atomically(target, build)
    return str(target)


def run_demo_lm(rows: int = 2000, epochs: float = 1, batch_size: int = 16,
                learning_rate: float = 3e-3, devices: int = 4, sharding: str = "fsdp",
                output_dir: str | os.PathLike | None = "auto",
                progress: bool | str = "console", cache: str | os.PathLike | None = None,
                **fine_tune_kwargs):
    """Fine-tune the tiny Llama on the demo pairs with `fine_tune(task="causal-lm")`.

    Args:
        devices: virtual XLA devices when there is no TPU (on a TPU, all its devices).
        sharding: "fsdp" (FSDPv2: parameters sharded over the devices) or "data".
        output_dir: as in `fine_tune`; "auto" (default): a new folder for each run,
            `demo_output/tiny-llama-<start time>`.
        fine_tune_kwargs: more `fine_tune` arguments.
    """
    from hfxla_nb.runtime import detect_accelerator
    from hfxla_nb.train import fine_tune

    on_tpu = detect_accelerator().kind == "tpu"
    return fine_tune(
        demo_lm_model_dir(cache=cache), demo_lm_dataset(n=rows), task="causal-lm",
        prompt_column="prompt", response_column="response",
        template=TEMPLATE, max_length=64, epochs=epochs, batch_size=batch_size,
        learning_rate=learning_rate, sharding=sharding,
        num_processes=None if on_tpu else devices,
        output_dir=demo_output_dir(output_dir, "tiny-llama"), progress=progress,
        **fine_tune_kwargs,
    )


def main(argv: list[str] | None = None) -> int:
    """`make demo TASK=causal-lm`: fine-tune the tiny Llama with FSDPv2, then generate the
    verdict of two reviews (exit status 1 unless the loss fell and both verdicts are right)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m hfxla_nb.demo.lm", description=main.__doc__)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--epochs", type=float, default=1)
    parser.add_argument("--devices", type=int, default=4, help="virtual XLA devices (no TPU)")
    parser.add_argument("--sharding", default="fsdp", choices=("fsdp", "data"))
    parser.add_argument("--output-dir", default="auto",
                        help="default: a new folder demo_output/tiny-llama-<start time>")
    args = parser.parse_args(argv)

    from hfxla_nb.ui.panels import result_text

    from . import start_demo

    start = start_demo(args.devices)
    result = run_demo_lm(rows=args.rows, epochs=args.epochs, devices=args.devices,
                         sharding=args.sharding, output_dir=args.output_dir)
    print(result_text(result), flush=True)
    reviews = {"the coffee was truly wonderful.": "positive",
               "i regretted the hotel, it was awful.": "negative"}
    answers = [answer.strip() for answer in result.generate(
        [TEMPLATE.split("{response}")[0].format(prompt=review) for review in reviews],
        max_new_tokens=2)]
    for (review, expected), answer in zip(reviews.items(), answers, strict=True):
        print(f"{review!r} -> {answer!r}" + ("" if answer == expected
                                              else f" (expected {expected!r})"), flush=True)
    loss = result.metrics.get("eval_loss", float("nan"))
    print(f"final eval loss: {loss:.4f}   graphs compiled: {result.compiles} training + "
          f"{result.eval_compiles} evaluation   wall time: {time.perf_counter() - start:.1f} s",
          flush=True)
    learned = loss < result.loss_history[0][1] and answers == list(reviews.values())
    return 0 if learned else 1


if __name__ == "__main__":
    raise SystemExit(main())
