"""Kernel-side steps that every task's preparation shares: batch size against the data,
padding token, devices, LoRA settings and the memory plan, the checkpoint to resume, a digest
of the training rows."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from .. import lora
from ..config import FineTuneConfig, FineTuneError
from ..memory_plan import MemoryPlan, MemoryPlanError, plan_memory
from ..worker import checkpoint as ckpt
from . import sources


def length_cap(config: FineTuneConfig, model_config: Any, tokenizer: Any,
               default: int | None = None) -> int:
    """The longest row in tokens: `max_length` (refused beyond the model's positions), else
    the least of what the model, the tokenizer and `default` allow (512 without any)."""
    limit = sources.position_limit(model_config)
    if config.max_length is not None:
        if limit is not None and config.max_length > limit:
            raise FineTuneError(
                f"max_length={config.max_length} is beyond the {limit} positions the model has "
                f"(max_position_embeddings); pass max_length<={limit} (longer texts are cut)."
            )
        return int(config.max_length)
    candidates = [value for value in (limit, default) if value]
    tokenizer_limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit < 100_000:
        candidates.append(tokenizer_limit)
    return min(candidates) if candidates else 512


def check_batch_fits(config: FineTuneConfig, train_rows: int) -> None:
    if config.rows_per_step > train_rows:
        what = "batch_size" if config.gradient_accumulation_steps == 1 else (
            "batch_size x gradient_accumulation_steps")
        raise FineTuneError(
            f"{what} = {config.rows_per_step} is larger than the {train_rows} training rows; "
            f"use batch_size <= {train_rows // config.gradient_accumulation_steps} or more data."
        )


def pad_id(tokenizer: Any, notes: list[str]) -> int | None:
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        # Decoder tokenizers (GPT-2 style) have no padding token; the end-of-text token is the
        # usual stand-in, and the model must know it to find each row's last real token.
        pad_id = getattr(tokenizer, "eos_token_id", None)
        notes.append("the tokenizer has no padding token: padding with its end-of-text token")
    return pad_id


def devices(config: FineTuneConfig) -> int:
    devices = sources.device_count(config.num_processes)
    if config.strategy == "replicated" and devices > 1 and not sources.on_tpu():
        raise FineTuneError(
            f"strategy='replicated' over {devices} devices cannot train on the CPU: XLA's "
            "gradient all-reduce between CPU virtual devices hangs upstream (pytorch/xla #5005, "
            "#9089). Use strategy='spmd' (the default; real data parallelism on the CPU too), "
            "or num_processes=1."
        )
    if config.strategy == "spmd" and config.batch_size % devices:
        raise FineTuneError(
            f"batch_size={config.batch_size} does not split evenly over the {devices} devices; "
            f"use a multiple of {devices} (e.g. {devices * max(1, config.batch_size // devices)})."
        )
    return devices


def lora_and_memory(config: FineTuneConfig, model: Any, model_config: Any, task_type: str,
                    max_length: int, devices: int, notes: list[str]
                    ) -> tuple[dict[str, Any] | None, MemoryPlan]:
    """`lora=` checked into peft's settings (None: a full fine-tune), and the memory plan of
    the run, which decides `lora="auto"` (noted).

    Args:
        model: what LoRA and the memory are sized on: the instance given, or a model built on
            the meta device, or its config.
        task_type: peft's task type (`Task.peft_task_type`).

    Raises:
        FineTuneError: the LoRA settings cannot work.
        MemoryPlanError: the run does not fit the device memory.
    """
    requested = config.lora if config.lora != "auto" else False
    lora_json = lora.lora_settings(requested, model, model_config, task_type)
    memory = memory_plan_of(config, model, lora_json, max_length, devices, notes)
    if memory.lora_rank and lora_json is None:  # lora="auto" chose LoRA
        lora_json = lora.lora_settings(True, model, model_config, task_type)
    return lora_json, memory


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


def config_fields(config: FineTuneConfig, output_dir: str | None,
                  resume: Any) -> dict[str, Any]:
    """The `TrainPlan` fields every task takes from its config as they are (optimizer, schedule,
    precision, strategy, logging), with the output folder and the checkpoint to resume."""
    return dict(
        batch_size=int(config.batch_size),
        gradient_accumulation_steps=int(config.gradient_accumulation_steps),
        learning_rate=float(config.learning_rate),
        weight_decay=float(config.weight_decay),
        warmup_steps=int(config.warmup_steps),
        max_grad_norm=None if config.max_grad_norm is None else float(config.max_grad_norm),
        precision=config.precision,
        strategy=config.strategy,
        output_dir=output_dir,
        save_steps=config.save_steps,
        resume_from=str(resume) if resume is not None else None,
        seed=int(config.seed),
        log_every=int(config.log_every),
        save=output_dir is not None,
        fallback_dir=None if config.fallback_dir is None else str(config.fallback_dir),
        augment=bool(config.augment),
    )


def checkpoint_to_resume(config: FineTuneConfig, output_dir: str | None,
                          fingerprint: dict[str, Any]):
    """The checkpoint to continue from (or None); refused when it was written by other
    settings or other data."""
    try:
        resume = ckpt.resolve_checkpoint(config.resume_from_checkpoint, output_dir or ".")
    except ValueError as error:
        raise FineTuneError(str(error)) from None
    if resume is None:
        return None
    previous = ckpt.read_checkpoint_info(resume).get("fingerprint", {})
    different = sorted(k for k in fingerprint if previous.get(k) != fingerprint[k])
    if different:
        details = ", ".join(f"{k}: {previous.get(k)!r} then, {fingerprint[k]!r} now"
                            for k in different if k != "train_digest")
        if "train_digest" in different:
            details = (details + ", " if details else "") + "the training rows differ"
        raise FineTuneError(
            f"the checkpoint {resume} was written by a run with other settings ({details}). "
            "Resume with the same data, batch_size, seed, max_steps/epochs and max_length, or "
            "start a new run without resume_from_checkpoint."
        )
    return resume


def digest(split) -> str:
    digest = hashlib.sha1()
    for bucket in split.buckets:
        digest.update(bucket.inputs.tobytes())
        digest.update(bucket.labels.tobytes())
        for name, values in sorted(bucket.fields.items()):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(values).tobytes())
    return digest.hexdigest()[:16]
