"""The kernel-side steps of `fine_tune(task="causal-lm")`: read texts or prompt/response pairs,
tokenize them into one fixed length, check the LoRA settings, plan the memory (which decides
`sharding="auto"` and `lora="auto"`, and refuses what cannot fit), build the `TrainPlan`.

Nothing is forked or written here; every refusal is a `FineTuneError` that says what to do.
"""

from __future__ import annotations

import math
from typing import Any

from ..._words import plural
from .. import lora
from ..batching import EncodedData, round_up
from ..config import FineTuneConfig, FineTuneError
from ..memory_plan import MemoryPlan, MemoryPlanError, meta_model, plan_memory
from ..plan import TrainPlan
from ..tasks import causal_lm_data as lm_data
from ..user_warnings import warn_user
from . import data, sources, steps

#: What training keeps per parameter with AdamW in float32: weights, gradients, 2 moments.
BYTES_PER_PARAMETER = 16
DEFAULT_MAX_LENGTH = 512


def prepare_causal_lm(dataset: Any, config: FineTuneConfig, source: Any, model_config: Any,
                      tokenizer: Any, model_name: str) -> TrainPlan:
    """`prepare_fine_tune` for a causal language model (see `lm_data.py` for the rows)."""
    notes: list[str] = []
    pad_id = _pad_token(tokenizer, notes)
    max_length = steps.length_cap(config, model_config, tokenizer, DEFAULT_MAX_LENGTH)
    splits = _read_splits(dataset, config, tokenizer, max_length, notes)
    encoded = {name: lm_data.encode_rows(name, rows, max_length, pad_id)
               for name, rows in splits.items()}
    train = encoded["train"]
    steps.check_batch_fits(config, train.num_rows)
    per_epoch = train.num_rows // config.rows_per_step
    total = (int(config.max_steps) if config.max_steps is not None
             else max(1, math.ceil(config.epochs * per_epoch)))
    devices = steps.devices(config)
    instance = source if not isinstance(source, str) else None
    lora_json = lora.lora_settings(config.lora if config.lora != "auto" else False,
                                   instance, model_config, "causal-lm")
    memory = memory_plan_of(config, instance or model_config, lora_json, max_length, devices,
                          notes)
    sharding = memory.sharding if devices > 1 and config.strategy == "spmd" else (
        "data" if config.sharding == "auto" else config.sharding)
    if memory.lora_rank and lora_json is None:  # lora="auto" chose LoRA
        lora_json = lora.lora_settings(True, instance, model_config, "causal-lm")
    output_dir = sources.check_output_dir(config.output_dir, model_name)
    fingerprint = {
        "train_rows": train.num_rows, "batch_size": config.batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "buckets": [max_length], "seed": config.seed, "total_steps": total,
        "labels": [], "train_digest": steps.digest(train),
    }
    if lora_json:  # a resume with other LoRA settings is refused
        fingerprint["lora"] = lora_json
    resume = steps.checkpoint_to_resume(config, output_dir, fingerprint)
    eval_name = next((name for name in encoded if name != "train"), None)
    return TrainPlan(
        lora=lora_json, memory=memory,
        model=source,
        model_kwargs={} if getattr(model_config, "pad_token_id", None) is not None
        else {"pad_token_id": int(pad_id)},
        tokenizer=tokenizer,
        data=EncodedData(train=train, eval=encoded.get(eval_name) if eval_name else None,
                         input_names=list(lm_data.INPUT_NAMES), bucket_lengths=[max_length],
                         label_names=[], notes=notes),
        total_steps=total, steps_per_epoch=max(per_epoch, 1), metrics=(), devices=devices,
        fingerprint=fingerprint, task="causal-lm", sharding=sharding,
        gradient_checkpointing=bool(config.gradient_checkpointing),
        **steps.config_fields(config, output_dir, resume),
    )


def memory_plan_of(config: FineTuneConfig, model: Any, lora_json: dict[str, Any] | None,
                 max_length: int, devices: int, notes: list[str]) -> MemoryPlan:
    """The memory plan of this run on this machine's devices; "auto" sharding and LoRA are
    decided by it (and noted); refused, with its numbers and the changes that would make it
    fit, when it cannot fit."""
    spmd = config.strategy == "spmd" and devices > 1
    plan = plan_memory(
        model, batch_size=int(config.batch_size), max_length=max_length,
        precision=config.precision, lora=lora_json or config.lora,
        sharding=config.sharding if spmd else "data",
        gradient_checkpointing=bool(config.gradient_checkpointing), devices=devices)
    notes.extend(plan.notes)
    if not plan.fits:
        raise MemoryPlanError(f"this fine-tune does not fit the device memory, so nothing was "
                              f"started:\n{plan}")
    return plan


def _pad_token(tokenizer: Any, notes: list[str]) -> int:
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is not None:
        return int(pad_id)
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise FineTuneError(
            "the tokenizer has neither a padding nor an end-of-text token; set one, e.g. "
            "tokenizer.pad_token = '<pad>' after adding it, or pass another tokenizer."
        )
    notes.append(f"the tokenizer has no padding token: padding with its end-of-text token "
                 f"{tokenizer.eos_token!r} (padding is masked out of the loss)")
    return int(eos)


def _read_splits(dataset: Any, config: FineTuneConfig, tokenizer: Any, max_length: int,
                 notes: list[str]) -> dict[str, lm_data.LmRows]:
    """Token rows of the training split and of the evaluation split, if any."""
    pairs = config.prompt_column is not None
    if config.template is not None and not pairs:
        raise FineTuneError("template= joins prompt_column and response_column; pass both "
                            "columns, or drop template to learn the text_column as it is.")
    if pairs and config.packing:
        raise FineTuneError("packing=True is for plain text: prompt/response pairs are padded, "
                            "one pair per row, so that each prompt stays unlearned.")
    packing = (not pairs) if config.packing is None else bool(config.packing)
    columns = ([config.prompt_column, config.response_column] if pairs
               else [config.text_column])
    try:
        if config.template is not None:
            lm_data.check_template(config.template)
        train_ds, eval_ds, eval_name = data.pick_splits(dataset, config.eval_dataset)
        named = {"train": train_ds} if eval_ds is None else {"train": train_ds, eval_name: eval_ds}
        result = {}
        for split, ds in named.items():
            if len(ds) == 0:
                raise data.DataError(f"the {split} data is empty: it needs at least one row.")
            data.check_columns(ds, split, columns)
            texts = [data.check_texts(data.column_values(ds, c), c, split) for c in columns]
            if pairs:
                result[split] = lm_data.pair_rows(tokenizer, texts[0], texts[1],
                                                  config.template, max_length)
            else:
                result[split] = lm_data.text_rows(tokenizer, texts[0], max_length, packing)
    except data.DataError as error:
        raise FineTuneError(str(error)) from None
    _note_lengths(result, max_length, packing, notes)
    return result


def _note_lengths(splits: dict[str, lm_data.LmRows], max_length: int, packing: bool,
                  notes: list[str]) -> None:
    """Say before anything runs how many rows would be cut, and if max_length is wasteful."""
    for split, rows in splits.items():
        if rows.cut:
            message = (f"{rows.cut} of {plural(len(rows.ids), f'{split} row')} are longer than "
                       f"max_length={max_length} and will be cut at the end")
            notes.append(message)
            warn_user(f"hfxla_nb.fine_tune: {message}.")  # at the user's call
    if packing:
        notes.append(f"texts packed into rows of {max_length} tokens (no padding)")
        if not splits["train"].ids:
            raise FineTuneError(f"the training texts hold fewer than max_length={max_length} "
                                "tokens in all: pass a smaller max_length or more text.")
        return
    longest = max(lm_data.longest_row(rows) for rows in splits.values())
    if longest and round_up(longest) < max_length:
        notes.append(f"the longest row has {longest} tokens: max_length={round_up(longest)} "
                     f"would compute less than {max_length}")


def parameter_count(model_config: Any) -> int:
    """Parameters of the model a config describes, counted without allocating them."""
    return sum(parameter.numel() for parameter in meta_model(model_config).parameters())
